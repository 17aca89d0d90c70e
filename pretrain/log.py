"""The application's logger: speaks on global rank 0 only, so an 8-card run prints each line once."""

import logging
import os
import sys


def _is_rank_zero() -> bool:
    # Set by paddle.distributed.launch for every worker; absent in a single-process run.
    return int(os.environ.get("PADDLE_TRAINER_ID", "0")) == 0


logger = logging.getLogger("pretrain")
if not logger.handlers:
    _handler = logging.StreamHandler(sys.stdout)
    _handler.setFormatter(logging.Formatter("[%(asctime)s] [pretrain] %(message)s", "%Y-%m-%d %H:%M:%S"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO if _is_rank_zero() else logging.WARNING)
    logger.propagate = False
