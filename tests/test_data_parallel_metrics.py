"""A 2-process data-parallel CPU run reports per-card figures consistent with the 1-process run.

The 2-process run is launched the way a user launches it on CPU (gloo backend, no --devices):

    python -m paddle.distributed.launch --nproc_per_node 2 --log_dir LOGS run_pretrain.py CONFIG ...

on the tiny model of tests/tiny_run.py, with per_device_train_batch_size halved, so both runs train on the same
global batch (the ``one_and_two_ranks`` runs, evaluated at the end). No timing ratios are asserted: 2 processes on
2 shared cores measure the machine, not the code.
"""

import json
import os

import pytest
from tiny_run import ONE_AND_TWO_RANKS_EVAL_ITERS

from pretrain.metrics.loss_curves import load_train_losses

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)


def read_run(output_dir: str) -> tuple:
    """(run_summary.json, [(step, loss)]) of a finished run."""
    with open(os.path.join(output_dir, "run_summary.json")) as f:
        return json.load(f), load_train_losses(output_dir)


@pytest.mark.slow
def test_two_process_data_parallel_reports_per_card_figures(one_and_two_ranks):
    single_dir, dp_dir = one_and_two_ranks
    single, single_losses = read_run(single_dir)
    dp, dp_losses = read_run(dp_dir)
    assert single["world_size"] == 1 and dp["world_size"] == 2
    assert dp["parallel_degrees"]["data"] == 2 and dp["parallel_strategy"] == "TP1PP1SH0SP1DP2"
    for key in (
        "global_batch_samples",
        "global_batch_tokens",
        "train_tokens",
        "steps_run_this_process",
        "model_flops_per_token",
        "num_params",
    ):
        assert dp[key] == single[key], key
    # per card = all cards' tokens/s / world size, and tokens = samples x seq_len
    assert dp["tokens_per_card_per_sec"] == pytest.approx(dp["tokens_per_sec"] / 2)
    assert dp["tokens_per_sec"] == pytest.approx(dp["samples_per_sec"] * 64)
    assert single["tokens_per_card_per_sec"] == pytest.approx(single["tokens_per_sec"])
    # rank 0's loss_history.json holds the replicas' mean loss, the single run's curve (tests/test_parallel_cpu.py)
    assert [step for step, _ in dp_losses] == [step for step, _ in single_losses] == list(range(1, 7))
    assert [loss for _, loss in dp_losses] == pytest.approx([loss for _, loss in single_losses], rel=1e-5)


@pytest.mark.slow
def test_the_eval_loss_is_the_same_on_one_and_two_ranks(one_and_two_ranks):
    """eval_iters counts global batches: both layouts evaluate the same 3 x 4 samples (2 ranks: a full global
    batch of 2 x 4, then the last 4 split 2 and 2), so the eval loss differs by float32 rounding only. It used to
    count batches per device: twice the samples on 2 ranks (7.486983 against 7.494985 in the report)."""
    (single, _), (dp, _) = (read_run(folder) for folder in one_and_two_ranks)
    assert dp["eval_loss"] == pytest.approx(single["eval_loss"], rel=1e-6)  # measured: 2.2e-7 relative
    assert single["eval_samples"] == dp["eval_samples"] == ONE_AND_TWO_RANKS_EVAL_ITERS * 4
