"""A 2-process data-parallel CPU run reports per-card figures consistent with the 1-process run.

The 2-process run is launched the way a user launches it on CPU (gloo backend, no --devices):

    python -m paddle.distributed.launch --nproc_per_node 2 --log_dir LOGS run_pretrain.py CONFIG ...

on the tiny model of tests/tiny_run.py, with per_device_train_batch_size halved, so both runs train on the same
global batch. No timing ratios are asserted: 2 processes on 2 shared cores measure the machine, not the code.
"""

import json
import os

import pytest
from tiny_run import launch_command, python_script, run, tiny_args

from pretrain.metrics.loss_curves import load_train_losses


def read_run(output_dir: str) -> tuple:
    """(run_summary.json, [(step, loss)]) of a finished run."""
    with open(os.path.join(output_dir, "run_summary.json")) as f:
        return json.load(f), load_train_losses(output_dir)


@pytest.mark.slow
def test_two_process_data_parallel_reports_per_card_figures(tmp_path, demo_dir):
    cache, logs = str(tmp_path / "cache"), str(tmp_path / "logs")
    single_dir, dp_dir = str(tmp_path / "single"), str(tmp_path / "dp")
    no_report = ("--report_to", "none", "--save_steps", "1000")
    single_args = tiny_args(single_dir, cache, *no_report, "--per_device_train_batch_size", "4", steps=6)
    assert run(python_script(*single_args), log_path=single_dir + ".log") == 0, f"see {single_dir}.log"
    dp_args = tiny_args(dp_dir, cache, *no_report, "--per_device_train_batch_size", "2", steps=6)
    assert run(launch_command(2, logs) + dp_args, log_path=dp_dir + ".log") == 0, f"see {logs}/workerlog.0"

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
