"""The upstream versions every fix under ``pretrain.compat`` was verified on: one place for all of them.

Each fix replaces or wraps paddle or paddlenlp code it names by file and line; another release may have changed
that code (or fixed it, so that a fix would apply twice). ``paddlenlp_is_verified`` tells a fix whether to apply
itself; the fixes that hold for any paddle (they compute on paddle 3.0.0 what paddle 3.0.0 computed) need no
paddle check. The CPU stack pins both (requirements-cpu.txt); ``tests/test_paddlenlp_contract.py`` checks that
the installed ones are these.
"""

from __future__ import annotations

import paddle
import paddlenlp

from pretrain.log import logger

PADDLENLP_VERSION = "3.0.0b4"  # paddlenlp's last release: every fix below pretrain.compat copies or wraps its code
PADDLE_VERSION = "3.3.1"  # the paddle the fixes were measured on (requirements-cpu.txt)


def paddlenlp_is_verified(fix: str, what: str) -> bool:
    """True when the installed paddlenlp is ``PADDLENLP_VERSION``; else False, after one warning that ``fix``
    (the module's name) leaves ``what`` (the upstream code it would change) unpatched."""
    if paddlenlp.__version__ == PADDLENLP_VERSION:
        return True
    logger.warning(
        f"{fix}: paddlenlp {paddlenlp.__version__} is not {PADDLENLP_VERSION}, whose {what} the fix was written "
        "for; left unpatched"
    )
    return False


def installed() -> dict:
    """``{"paddle": version, "paddlenlp": version}`` as installed."""
    return {"paddle": paddle.__version__, "paddlenlp": paddlenlp.__version__}
