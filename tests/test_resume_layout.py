"""Resume on another layout: a run stopped at a checkpoint on 2 data-parallel CPU processes resumes on 1
(and the other way round) at the same global batch of 4 samples, and goes on with the losses (1e-6
relative) and the Adam moments of the uninterrupted run.

What makes it work (paddlenlp 3.0.0b4, plain data parallel): the weights and the optimizer state are
saved once (data-parallel rank 0: every replica holds the same), the data position is
``global_step x global batch`` samples in one global order whatever the degree, and the schedule is
counted in optimizer steps.
"""

import json
import os

import numpy as np
import paddle
import pytest
from tiny_run import kill_when, launch_command, logged_losses, python_script, run, start, tiny_args

from pretrain.checkpoint import MARKER

STEPS, SAVE_STEPS, STOP_AT = 8, 4, 4
TIMEOUT = 600  # seconds: two gloo processes on a loaded 2-core machine


def _command(nproc: int, out: str, cache: str, logs: str) -> tuple:
    """(command, rank 0's log) for the tiny run on ``nproc`` processes at a global batch of 4."""
    args = tiny_args(out, cache, "--per_device_train_batch_size", str(4 // nproc), steps=STEPS, save_steps=SAVE_STEPS)
    os.makedirs(logs, exist_ok=True)
    if nproc == 1:
        return python_script(*args), os.path.join(logs, "launch.log")
    return launch_command(nproc, logs) + args, os.path.join(logs, "workerlog.0")


def _train_losses(out: str) -> dict:
    with open(os.path.join(out, "loss_history.json"), encoding="utf-8") as f:
        return dict(json.load(f)["train"])


def _moments(folder: str) -> dict:
    state = paddle.load(os.path.join(folder, "optimizer.pdopt"))
    return {name: value.numpy() for name, value in state.items() if "moment" in name}


@pytest.mark.slow
@pytest.mark.parametrize("before, after", [(2, 1), (1, 2)])
def test_resume_on_another_data_parallel_degree(tmp_path, demo_dir, before, after):
    cache = str(tmp_path / "cache")
    full = str(tmp_path / "full")
    command, _ = _command(before, full, cache, str(tmp_path / "full_logs"))
    assert run(command, log_path=str(tmp_path / "full_logs" / "launch.log"), timeout=TIMEOUT) == 0

    out = str(tmp_path / "changed")
    command, _ = _command(before, out, cache, str(tmp_path / "first_logs"))
    process = start(command, log_path=str(tmp_path / "first_logs" / "launch.log"))
    assert kill_when(process, os.path.join(out, f"checkpoint-{STOP_AT}", MARKER), timeout=TIMEOUT)
    command, resumed_log = _command(after, out, cache, str(tmp_path / "resumed_logs"))
    assert run(command, log_path=str(tmp_path / "resumed_logs" / "launch.log"), timeout=TIMEOUT) == 0

    with open(resumed_log, encoding="utf-8") as f:
        assert f"Continuing training from global step {STOP_AT}" in f.read()
    assert sorted(logged_losses(resumed_log)) == list(range(STOP_AT + 1, STEPS + 1))  # it trained steps 5-8
    expected, resumed = _train_losses(full), _train_losses(out)  # every digit
    assert sorted(resumed) == sorted(expected) == list(range(1, STEPS + 1))
    for step, loss in resumed.items():
        assert loss == pytest.approx(expected[step], rel=1e-6), step
    want, got = _moments(os.path.join(full, f"checkpoint-{STEPS}")), _moments(os.path.join(out, f"checkpoint-{STEPS}"))
    assert want.keys() == got.keys() and want
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-9, err_msg=name)
