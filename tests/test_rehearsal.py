"""``run_pretrain.py CONFIG --rehearse true`` (pretrain.rehearsal): a GPU recipe's layout on CPU processes.

The slow test rehearses the default recipe (config/llama/pretrain_argument.json: Llama-2-7B, TP2 x
sharding stage2, bf16 O2, flash attention, unified checkpoints) on the demo data and tokenizer, which are
here (the recipe's openwebtext and 32,000-piece tokenizer are not); the fast ones check what the
rehearsal changes in the recipes, and what it refuses.
"""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, load_script

from pretrain.errors import UserError
from pretrain.rehearsal import STEPS, plan_rehearsal, rehearse, requested

RECIPE = os.path.join(REPO, "config", "llama", "pretrain_argument.json")
DEMO_DATA = ("--input_dir", "data/demo", "--tokenizer_name_or_path", "data/demo/tokenizer")


def _pairs(overrides: list) -> dict:
    return dict(zip(overrides[::2], overrides[1::2]))


def test_the_default_recipe_keeps_its_layout_and_loses_only_what_cpus_cannot_run(tmp_path):
    plan = plan_rehearsal([RECIPE, "--rehearse", "true", "--output_dir", str(tmp_path / "out"), *DEMO_DATA])
    keys = _pairs(plan.overrides)
    assert plan.nproc == 4  # TP2 x 2 sharding ranks
    assert (
        keys["--bf16"] == "false" and keys["--use_flash_attention"] == "false" and keys["--use_fused_rope"] == "false"
    )
    assert keys["--amp_master_grad"] == "false"
    # the layout keys are the recipe's: nothing changes them
    for key in ("tensor_parallel_degree", "sharding", "sharding_parallel_degree", "unified_checkpoint", "recompute"):
        assert f"--{key}" not in keys
    assert keys["--global_batch_size"] == "4"  # 1 sample x 2 sharding ranks x accumulation 2
    assert int(keys["--num_attention_heads"]) % 2 == 0 and keys["--max_steps"] == str(STEPS)
    assert keys["--input_dir"] == "data/demo" and "--rehearse" not in keys and "--output_dir" not in keys
    assert plan.folder == str(tmp_path / "out") + "_rehearsal"
    # one line per change, saying why
    assert any(line.startswith("bf16: True -> False (") for line in plan.changes)
    assert any(line.startswith("global_batch_size: 1024 -> 4 (gradient accumulation 2") for line in plan.changes)


def test_keys_given_on_the_command_line_are_not_changed():
    plan = plan_rehearsal([RECIPE, "--hidden_size", "128", "--max_steps", "4", "--rehearse", "true"])
    keys = _pairs(plan.overrides)
    assert keys["--hidden_size"] == "128" and list(plan.overrides).count("--hidden_size") == 1
    assert not any(line.startswith("hidden_size") for line in plan.changes)


def test_a_pipeline_recipe_keeps_layers_divisible_by_its_stages():
    config = os.path.join(REPO, "config", "benchmarks", "llama-7b_TP2PP4SH1SP1_A100-40Gx1x8.json")
    plan = plan_rehearsal([config, "--rehearse", "true"])
    keys = _pairs(plan.overrides)
    assert plan.nproc == 2 * 4  # the recipe pins sharding degree 1: one replica, as on its 8 GPUs
    assert int(keys["--num_hidden_layers"]) % 4 == 0 and int(keys["--num_attention_heads"]) % 2 == 0


def test_only_a_true_rehearse_on_the_command_line_asks_for_one():
    assert requested([RECIPE, "--rehearse", "true"]) and requested([RECIPE, "--rehearse", "false", "--rehearse", "1"])
    assert requested([RECIPE, "--rehearse=true"])
    assert not requested([RECIPE]) and not requested([RECIPE, "--rehearse", "false"])


def test_a_rehearsal_under_a_launcher_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("PADDLE_TRAINER_ID", "0")
    with pytest.raises(UserError, match="without paddle.distributed.launch"):
        rehearse([RECIPE, "--rehearse", "true"])


def test_rehearse_in_a_config_file_is_refused_in_one_line(tmp_path):
    """Only the command line starts a rehearsal; a run does not silently train a config that asks for one."""
    with open(os.path.join(REPO, "config", "llama", "pretrain_demo_cpu.json")) as f:
        config = {**json.load(f), "rehearse": True, "output_dir": str(tmp_path / "out")}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(UserError, match="give --rehearse true on the command line"):
        load_script("run_pretrain.py").main([str(path)])


@pytest.mark.slow
def test_the_default_recipe_rehearses_on_cpu_saves_resumes_and_exports(tmp_path, demo_dir):
    """Measured: 55-91 s on 2 cores shared with other jobs (load 6-7): two 4-process launches, the export."""
    out = str(tmp_path / "llama")
    command = [sys.executable, os.path.join(REPO, "run_pretrain.py"), RECIPE, "--rehearse", "true", *DEMO_DATA]
    done = subprocess.run(
        [*command, "--output_dir", out], cwd=REPO, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    checklist = [line for line in done.stdout.splitlines() if line.startswith("[rehearse]   [")]
    assert len(checklist) == 4 and all(line.startswith("[rehearse]   [ok]") for line in checklist), done.stdout
    assert f"layout TP2PP1SH2SP2DP1 ran {STEPS} steps on 4 processes" in checklist[0]
    assert "bit for bit" in checklist[2]
    folder = out + "_rehearsal"
    with open(os.path.join(folder, "hf", "config.json")) as f:
        assert json.load(f)["architectures"] == ["LlamaForCausalLM"]
    with open(os.path.join(folder, "run", "run_config.json")) as f:
        config = json.load(f)
    # the recipe's layout really ran: TP2 x sharding stage2 over 2, unified checkpoints
    layout, training = config["layout"], config["training_arguments"]
    assert (layout["tensor_parallel_degree"], layout["sharding_parallel_degree"], layout["sharding_stage"]) == (2, 2, 2)
    assert training["unified_checkpoint"] is True and training["bf16"] is False


@pytest.mark.slow
def test_what_would_break_is_reported_with_the_line_to_fix(tmp_path):
    """Data that is not there (as the recipe's openwebtext is not here): the checklist says so, with the
    preflight's line, and the status is 1."""
    command = [sys.executable, os.path.join(REPO, "run_pretrain.py"), RECIPE, "--rehearse", "true"]
    done = subprocess.run(
        [*command, "--input_dir", str(tmp_path / "no_data"), "--output_dir", str(tmp_path / "llama")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 1
    failed = [line for line in done.stdout.splitlines() if "[FAIL]" in line]
    assert len(failed) == 1 and "exited with status 2: error:" in failed[0] and "input_dir" in failed[0], done.stdout
