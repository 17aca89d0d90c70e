"""The sample log (pretrain.sample_log): per-step hashes of the sample ids equal across layouts that
read the same samples per step, and the ids file lists them."""

import json
import os

import pytest
from tiny_run import launch_command, python_script, run, tiny_args

from pretrain.metrics.loss_curves import read_loss_history
from pretrain.sample_log import SAMPLE_IDS_FILE, chain_hash

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

STEPS = 4
GLOBAL_BATCH = 8


def test_a_step_hash_is_its_set_of_ids_chained_onto_the_previous_step():
    first = chain_hash("", [3, 1, 2])
    assert first == chain_hash("", [1, 2, 3])  # which rank or micro batch read a sample does not matter
    assert first != chain_hash("", [1, 2, 4])
    assert chain_hash(first, [4, 5]) != chain_hash(chain_hash("", [1, 2, 4]), [4, 5])  # the chain carries history
    assert len(first) == 16


def _sample_log(tmp_path, name: str, nproc: int) -> tuple:
    out, logs = str(tmp_path / name), str(tmp_path / f"{name}_logs")
    os.makedirs(logs)
    batch = ("--per_device_train_batch_size", str(GLOBAL_BATCH // nproc), "--log_sample_ids", "true")
    args = tiny_args(out, str(tmp_path / "cache"), *batch, steps=STEPS, save_steps=1000)
    command = python_script(*args) if nproc == 1 else launch_command(nproc, logs) + args
    assert run(command, log_path=os.path.join(logs, "launch.log")) == 0, f"{name} failed; see {logs}"
    with open(os.path.join(out, SAMPLE_IDS_FILE), encoding="utf-8") as f:
        ids = [json.loads(line) for line in f]
    return read_loss_history(os.path.join(out, "loss_history.json"))["samples"], ids


@pytest.mark.slow
def test_one_process_batch_8_and_two_processes_batch_4_log_the_same_samples(tmp_path, demo_dir):
    single_hashes, single_ids = _sample_log(tmp_path, "single", 1)
    assert [step for step, _ in single_hashes] == list(range(1, STEPS + 1))
    # the in-order sampler: step k reads samples 8(k-1) .. 8k-1 of the training dataset
    assert single_ids == [{"step": k, "ids": list(range(8 * (k - 1), 8 * k))} for k in range(1, STEPS + 1)]
    dp_hashes, dp_ids = _sample_log(tmp_path, "dp", 2)
    assert dp_hashes == single_hashes
    assert dp_ids == single_ids
