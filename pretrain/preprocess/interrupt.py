"""SIGTERM and SIGINT stop a preprocessing tool cleanly: partial outputs removed, one line, status 128 + signal.

Schedulers (Slurm, Kubernetes, PaddleCloud) stop a job with SIGTERM, whose default action kills
the process on the spot and leaves ``<prefix>.bin.partial.<host>.<pid>`` files of corpus size behind.
``run_tool`` turns both signals into ``Interrupted`` in the main thread, so ``pretrain.atomic``
removes the partial files on the way out; worker processes ignore SIGINT and die on SIGTERM
(``encode.init_worker``) and write no file.
"""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager

from pretrain.errors import run_cli

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(BaseException):  # like KeyboardInterrupt: not swallowed by `except Exception`
    """A stop signal arrived; ``signum`` is its number."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum, frame):
    raise Interrupted(signum)


@contextmanager
def signals_raise():
    """Within the block (main thread only), SIGTERM and SIGINT raise ``Interrupted``; the old handlers return after."""
    previous = {signum: signal.signal(signum, _raise) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_tool(main) -> None:
    """``run_cli(main)`` that, on SIGTERM/SIGINT, prints ``error: stopped by SIGTERM; ...`` and exits 128 + signal."""
    try:
        with signals_raise():
            run_cli(main)
    except Interrupted as stop:
        print(f"error: stopped by {stop}; partial outputs were removed, nothing was written", file=sys.stderr)
        sys.exit(128 + stop.signum)
