"""Exact resume of a LoRA fine-tuning run: SIGKILLed right after a checkpoint's completion marker and
restarted, it ends with the same per-step losses and the same adapter weights as an uninterrupted run
(LoRA dropout 0.05 on, so the restored RNG state matters too)."""

import os
import sys

import numpy as np
import paddle
import pytest
from conftest import REPO
from tiny_finetune import finetune_args, pretrain_tiny_model, write_demo_pairs
from tiny_run import kill_when, logged_losses, run, start

from pretrain.checkpoint import MARKER

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

STEPS = 16


def command(model_dir: str, pairs: str, output_dir: str) -> list:
    args = finetune_args(model_dir, pairs, output_dir, "--save_steps", "4", "--merge_lora", "false", steps=STEPS)
    return [sys.executable, os.path.join(REPO, "run_finetune.py"), *args]


def adapter(output_dir: str) -> dict:
    state = paddle.load(os.path.join(output_dir, "lora_model_state.pdparams"))
    return {name: value.numpy() for name, value in state.items()}


@pytest.mark.slow
def test_killed_finetune_resumes_exactly(tmp_path, demo_dir):
    model_dir = pretrain_tiny_model(str(tmp_path / "base"), steps=20)
    pairs = write_demo_pairs(str(tmp_path / "pairs"), train=300, dev=20)

    full = str(tmp_path / "full")
    assert run(command(model_dir, pairs, full), log_path=str(tmp_path / "full.log")) == 0

    killed = str(tmp_path / "killed")
    process = start(command(model_dir, pairs, killed), log_path=str(tmp_path / "killed.log"))
    assert kill_when(process, os.path.join(killed, "checkpoint-4", MARKER)), "the run ended before it could be killed"
    assert not os.path.exists(os.path.join(killed, "lora_model_state.pdparams")), "killed too late: training finished"
    assert run(command(model_dir, pairs, killed), log_path=str(tmp_path / "resumed.log")) == 0

    with open(tmp_path / "resumed.log", encoding="utf-8") as f:
        assert "Continuing training from checkpoint" in f.read()
    expected, resumed = logged_losses(str(tmp_path / "full.log")), logged_losses(str(tmp_path / "resumed.log"))
    assert sorted(expected) == list(range(1, STEPS + 1))
    assert min(resumed) > 4 and max(resumed) == STEPS  # it resumed from a checkpoint, not from step 0
    assert resumed == {step: expected[step] for step in resumed}
    want, got = adapter(full), adapter(killed)
    assert want.keys() == got.keys() and len(want) == 8  # lora_A and lora_B of q_proj and v_proj, 2 layers
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
