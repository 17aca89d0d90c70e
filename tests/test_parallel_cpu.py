"""Data parallel and sharding stage1 on 2 CPU processes (gloo) follow the 1-process loss curve."""

import os

import pytest
from tiny_run import launch_command, python_script, run, tiny_args

from pretrain.metrics.loss_curves import load_train_losses

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

STEPS = 6
GLOBAL_BATCH = 4  # samples per optimizer step in every layout
# Same samples per step in every layout (the in-order sampler gives rank r the r-th slice of each
# global batch), so only float32 summation order differs: the gradient all-reduce adds two half-batch
# means instead of one full-batch mean, and sharding reduces, updates and broadcasts slices. Those
# rounding differences (measured: identical to 8 decimals over these 6 steps, 1.1e-7 relative
# after 10 steps) grow slowly over a few steps; 1e-5 relative is ~100x that and still far below
# the 1e-2 loss change per step that a wrong batch, LR or missing gradient reduction would cause.
RTOL = 1e-5


def _losses(tmp_path, name: str, nproc: int, *extra: str) -> list:
    out, logs = str(tmp_path / name), str(tmp_path / f"{name}_logs")
    os.makedirs(logs)
    args = tiny_args(
        out,
        str(tmp_path / "cache"),
        "--per_device_train_batch_size",
        str(GLOBAL_BATCH // nproc),
        *extra,
        steps=STEPS,
        save_steps=1000,
    )
    if nproc == 1:
        command, log = python_script(*args), os.path.join(logs, "launch.log")
    else:
        command, log = launch_command(nproc, logs) + args, os.path.join(logs, "workerlog.0")
    assert run(command, log_path=os.path.join(logs, "launch.log")) == 0, f"{name} failed; see {logs}"
    losses = load_train_losses(out)  # every digit (the log's records round to 4 decimals)
    assert [step for step, _ in losses] == list(range(1, STEPS + 1)), f"see {log}"
    return [loss for _, loss in losses]


@pytest.mark.slow
def test_data_parallel_and_sharding_stage1_match_one_process(tmp_path, demo_dir):
    single = _losses(tmp_path, "single", 1)
    assert single[-1] < single[0] - 0.05  # the curve moves, so matching it means something
    data_parallel = _losses(tmp_path, "dp", 2)
    sharding = _losses(tmp_path, "sharding", 2, "--sharding", "stage1", "--sharding_parallel_degree", "2")
    assert data_parallel == pytest.approx(single, rel=RTOL)
    assert sharding == pytest.approx(single, rel=RTOL)
