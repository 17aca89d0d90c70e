"""Figures of every rank, not global rank 0's alone: the peak memory (under pipeline parallelism another
stage may peak), the step time (the slowest rank and its lag) and, in the run summary, tokens/card/s,
gathered with one collective.

Every rank calls ``gather_rank_figures`` at the same point (each training log record, and the run
summary): one ``paddle.distributed.all_gather`` of a float64 vector per rank over the global group.

What to read from them: under synchronous data parallelism every rank waits for the others in the
gradient all-reduce, so the ranks' step times come out nearly equal and the slow rank shows in its
phases instead (a rank starved by its data loader has the largest ``data_wait``; the others wait
inside backward). Under pipeline parallelism, and for a rank slowed outside the collectives, the
step times differ and ``slowest_rank`` names it.
"""

from __future__ import annotations

from typing import Optional

import paddle
import paddle.distributed as dist

from pretrain.metrics.time_breakdown import STEP_PHASES

# the per-rank figures, in the order of the gathered vector
FIGURES = (
    "peak_memory_gib",
    "step_seconds",
    "data_wait_seconds",
    "tokens_per_card_per_sec",
    "pipeline_stage",
    "parameter_elements",
    "optimizer_elements",
)


def gather_rank_figures(values: dict, world_size: int) -> dict:
    """``{figure: [value of rank 0, rank 1, ...]}`` for each of FIGURES (NaN where a rank has none).

    Args:
        values: this rank's figures (a missing or None value is sent as NaN).
        world_size: ranks of the run; 1 gathers nothing (no collective).
    """
    mine = [float("nan") if values.get(name) is None else float(values[name]) for name in FIGURES]
    if world_size <= 1:
        return {name: [value] for name, value in zip(FIGURES, mine)}
    gathered = []
    dist.all_gather(gathered, paddle.to_tensor(mine, dtype="float64"))
    rows = [tensor.numpy().tolist() for tensor in gathered]  # [rank][figure]
    return {name: [row[i] for row in rows] for i, name in enumerate(FIGURES)}


def _argmax(values: list) -> Optional[int]:
    known = [(value, rank) for rank, value in enumerate(values) if value == value]  # NaN != NaN
    return max(known)[1] if known else None


def rank_extremes(figures: dict) -> dict:
    """The max over ranks and which rank: ``peak_memory_gib_max`` / ``peak_memory_max_rank``,
    ``step_seconds_max`` / ``slowest_rank`` and ``slowest_rank_lag_seconds`` (its step time less the
    fastest rank's), ``data_wait_seconds_max`` / ``data_wait_max_rank``, ``tokens_per_card_per_sec_max`` /
    ``tokens_per_card_per_sec_max_rank``; only the keys that are known."""
    result = {}
    for name, key_max, key_rank in (
        ("peak_memory_gib", "peak_memory_gib_max", "peak_memory_max_rank"),
        ("step_seconds", "step_seconds_max", "slowest_rank"),
        ("data_wait_seconds", "data_wait_seconds_max", "data_wait_max_rank"),
        ("tokens_per_card_per_sec", "tokens_per_card_per_sec_max", "tokens_per_card_per_sec_max_rank"),
    ):
        rank = _argmax(figures.get(name, []))
        if rank is not None:
            result[key_max], result[key_rank] = figures[name][rank], rank
    steps = [value for value in figures["step_seconds"] if value == value]
    if steps:
        result["slowest_rank_lag_seconds"] = max(steps) - min(steps)
    return result


def record_extremes(record: dict, world_size: int) -> dict:
    """``rank_extremes`` of a training log record's figures gathered over ranks: its ``peak_memory_gib``,
    its step time (the sum of its ``time_<phase>`` of ``STEP_PHASES``, seconds per step) and its
    ``time_data_wait``. A collective: every rank calls it at the same record."""
    step_keys = [f"time_{phase}" for phase in STEP_PHASES]
    mine = {
        "peak_memory_gib": record.get("peak_memory_gib"),
        "step_seconds": sum(record[key] for key in step_keys) if all(key in record for key in step_keys) else None,
        "data_wait_seconds": record.get("time_data_wait"),
    }
    return rank_extremes(gather_rank_figures(mine, world_size))
