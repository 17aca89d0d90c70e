"""A 2-process data-parallel CPU run reports per-card figures consistent with the 1-process run.

The 2-process run is launched the way a user launches it on CPU (gloo backend, no --devices):

    python -m paddle.distributed.launch --nproc_per_node 2 --log_dir LOGS run_pretrain.py CONFIG ...

with per_device_train_batch_size halved, so both runs train on the same global batch. No timing
ratios are asserted: 2 processes on 2 shared cores measure the machine, not the code.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, run_script, script_env
from pretrain.loss_history import load_train_losses

COMMON = ["--max_steps", "6", "--logging_steps", "1", "--max_seq_length", "64", "--do_eval", "false",
          "--save_steps", "1000", "--report_to", "none", "--overwrite_output_dir"]


def read_run(output_dir: str) -> tuple:
    """(run_summary.json, [(step, loss)]) of a finished run."""
    with open(os.path.join(output_dir, "run_summary.json")) as f:
        return json.load(f), load_train_losses(output_dir)


@pytest.mark.slow
def test_two_process_data_parallel_reports_per_card_figures(tmp_path, demo_dir):
    cache = str(tmp_path / "cache")
    single_dir, dp_dir, logs = str(tmp_path / "single"), str(tmp_path / "dp"), str(tmp_path / "logs")
    single_run = run_script("run_pretrain.py", "config/llama/pretrain_demo_cpu.json", *COMMON,
                            "--per_device_train_batch_size", "4", "--output_dir", single_dir, "--data_cache", cache)
    assert single_run.returncode == 0, single_run.stderr[-3000:]

    dp_run = subprocess.run(
        [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", logs,
         "run_pretrain.py", "config/llama/pretrain_demo_cpu.json", *COMMON,
         "--per_device_train_batch_size", "2", "--output_dir", dp_dir, "--data_cache", cache],
        cwd=REPO, env=script_env(), capture_output=True, text=True, timeout=600,
    )
    worker_log = os.path.join(logs, "workerlog.0")
    assert dp_run.returncode == 0, open(worker_log).read()[-3000:] if os.path.exists(worker_log) else dp_run.stderr

    single, single_losses = read_run(single_dir)
    dp, dp_losses = read_run(dp_dir)
    assert single["world_size"] == 1 and dp["world_size"] == 2
    assert dp["parallel_degrees"]["data"] == 2 and dp["parallel_strategy"] == "TP1PP1SH0SP1DP2"
    for key in ("global_batch_samples", "global_batch_tokens", "train_tokens", "steps_run_this_process"):
        assert dp[key] == single[key], key
    # per card = all cards' tokens/s / world size, and tokens = samples x seq_len
    assert dp["tokens_per_card_per_sec"] == pytest.approx(dp["tokens_per_sec"] / 2)
    assert dp["tokens_per_sec"] == pytest.approx(dp["samples_per_sec"] * 64)
    assert single["tokens_per_card_per_sec"] == pytest.approx(single["tokens_per_sec"])
    # in-order sampling: two replicas of batch 2 see the single run's batches of 4, so the curves match
    assert [step for step, _ in dp_losses] == [step for step, _ in single_losses] == list(range(1, 7))
    assert [loss for _, loss in dp_losses] == pytest.approx([loss for _, loss in single_losses], rel=1e-5)
