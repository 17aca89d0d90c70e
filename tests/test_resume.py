"""Exact resume: a run SIGKILLed after a checkpoint and restarted ends with the same losses, weights and
sample log as an uninterrupted run (1 process, and 2-process data parallel over gloo on CPU); a mixture of
experts (the tiny run as Mixtral, 4 experts top-2, 1 process) also with the same routing records."""

import json
import os

import numpy as np
import pytest
from tiny_run import final_weights, kill_when, launch_command, logged_losses, python_script, run, start, tiny_args

from pretrain.checkpoint import MARKER
from pretrain.metrics.loss_curves import read_loss_history
from pretrain.sample_log import SAMPLE_IDS_FILE

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)


def _command(nproc: int, log_dir: str, args: list) -> tuple:
    """(command, path of rank 0's log) for a run on ``nproc`` CPU processes."""
    if nproc == 1:
        return python_script(*args), os.path.join(log_dir, "launch.log")
    return launch_command(nproc, log_dir) + args, os.path.join(log_dir, "workerlog.0")


def _routing_records(out: str) -> list:
    with open(os.path.join(out, "run_summary.json"), encoding="utf-8") as f:
        return json.load(f)["routing"]["records"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "nproc, model", [(1, "llama-debug"), (2, "llama-debug"), (1, "mixtral-debug"), (1, "deepseek_v2-debug")]
)
def test_killed_run_resumes_exactly(tmp_path, demo_dir, nproc, model):
    cache = str(tmp_path / "cache")
    batch = ["--per_device_train_batch_size", str(4 // nproc)]  # same global batch of 4 samples
    batch += ["--log_sample_ids", "true", "--model_name_or_path", model]

    full_out, full_logs = str(tmp_path / "full"), str(tmp_path / "full_logs")
    os.makedirs(full_logs)
    command, full_log = _command(nproc, full_logs, tiny_args(full_out, cache, *batch))
    assert run(command, log_path=os.path.join(full_logs, "launch.log")) == 0

    out, logs = str(tmp_path / "killed"), str(tmp_path / "killed_logs")
    os.makedirs(logs)
    command, killed_log = _command(nproc, logs, tiny_args(out, cache, *batch))
    process = start(command, log_path=os.path.join(logs, "launch.log"))
    assert kill_when(process, os.path.join(out, "checkpoint-3", MARKER)), "the run ended before it could be killed"
    assert not os.path.exists(os.path.join(out, "model_state.pdparams")), "killed too late: training had finished"

    resumed_logs = str(tmp_path / "resumed_logs")
    os.makedirs(resumed_logs)
    command, resumed_log = _command(nproc, resumed_logs, tiny_args(out, cache, *batch))
    assert run(command, log_path=os.path.join(resumed_logs, "launch.log")) == 0

    with open(resumed_log, encoding="utf-8") as f:
        assert "Continuing training from checkpoint" in f.read()
    expected, resumed = logged_losses(full_log), logged_losses(resumed_log)
    assert sorted(expected) == list(range(1, 11))
    assert resumed, "the restarted run logged no loss"
    assert min(resumed) > 3 and max(resumed) == 10  # it resumed from a checkpoint, not step 0
    assert resumed == {step: expected[step] for step in resumed}
    # the sample log's chain continued where the kill cut it: the same hash at every step
    full_samples = read_loss_history(os.path.join(full_out, "loss_history.json"))["samples"]
    assert [step for step, _ in full_samples] == list(range(1, 11))
    assert read_loss_history(os.path.join(out, "loss_history.json"))["samples"] == full_samples
    with open(os.path.join(full_out, SAMPLE_IDS_FILE)) as want, open(os.path.join(out, SAMPLE_IDS_FILE)) as got:
        assert got.read() == want.read()
    want, got = final_weights(full_out), final_weights(out)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    if model != "llama-debug":  # a mixture of experts: the routing records go on from the checkpoint's
        records = _routing_records(full_out)
        assert [record["step"] for record in records] == list(range(1, 11))
        assert _routing_records(out) == records
