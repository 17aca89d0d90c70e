"""Where this process is among the ranks of a launch, read from paddle.distributed.launch's environment,
and how messages name a rank (standard library only: the watchdog's sidecar and ``pretrain.errors`` use it)."""

import os


def launched_world() -> tuple:
    """(global rank, world size, node index) of this process under paddle.distributed.launch ((0, 1, 0) alone)."""
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0") or 0)
    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1") or 1)
    local_size = int(os.environ.get("PADDLE_LOCAL_SIZE", "1") or 1)
    local_rank = int(os.environ.get("PADDLE_RANK_IN_NODE", "0") or 0)
    return rank, world, (rank - local_rank) // local_size


def describe_rank(rank: int, node: int, host: str) -> str:
    """How messages name a rank: ``rank 3 (node 1, host gpu-7)``."""
    return f"rank {rank} (node {node}, host {host})"
