"""``run_pretrain.py CONFIG --rehearse true`` (pretrain.rehearsal): a GPU recipe's layout on CPU processes.

The slow test rehearses the default recipe (config/llama/pretrain_argument.json: Llama-2-7B, TP2 x
sharding stage2, bf16 O2, flash attention, unified checkpoints) on the demo data and tokenizer, which are
here (the recipe's openwebtext and 32,000-piece tokenizer are not); the fast ones check what the
rehearsal changes in the recipes, and what it refuses.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import REPO, load_script

from pretrain import rehearsal
from pretrain.cluster.process_end import descendants
from pretrain.errors import UserError
from pretrain.rehearsal import STEPS, plan_rehearsal, rehearse, requested

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

RECIPE = os.path.join(REPO, "config", "llama", "pretrain_argument.json")
DEMO = os.path.join(REPO, "data", "demo")
DEMO_DATA = ("--input_dir", DEMO, "--tokenizer_name_or_path", os.path.join(DEMO, "tokenizer"))


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
    assert keys["--input_dir"] == DEMO and "--rehearse" not in keys and "--output_dir" not in keys
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


def test_a_rehearsal_with_a_cuda_build_of_paddle_is_refused_in_one_line(monkeypatch):
    """On a GPU host paddle's launcher detects the GPUs (``detect_device``: CUDA build, device count > 0) and
    gives each rank one, raising IndexError with more ranks than GPUs; its ranks would use NCCL. Before, the
    rehearsal launched there anyway: the CPU layer it exists to exercise never ran (by construction: no CUDA
    build here)."""
    import paddle

    monkeypatch.setattr(paddle, "is_compiled_with_cuda", lambda: True)
    with pytest.raises(UserError, match=r"needs the CPU build of paddle.*requirements-cpu.txt") as refused:
        rehearse([RECIPE, "--rehearse", "true"])
    assert "\n" not in str(refused.value)


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
    # paddlenlp's INFO lines (its configs read back for the checks) were printed between the rehearsal's own
    assert "Loading configuration file" not in done.stdout + done.stderr
    folder = out + "_rehearsal"
    with open(os.path.join(folder, "hf", "config.json")) as f:
        assert json.load(f)["architectures"] == ["LlamaForCausalLM"]
    with open(os.path.join(folder, "run", "run_config.json")) as f:
        config = json.load(f)
    # the recipe's layout really ran: TP2 x sharding stage2 over 2, unified checkpoints
    layout, training = config["layout"], config["training_arguments"]
    assert (layout["tensor_parallel_degree"], layout["sharding_parallel_degree"], layout["sharding_stage"]) == (2, 2, 2)
    assert training["unified_checkpoint"] is True and training["bf16"] is False


def _rehearse_without_launching(monkeypatch, capsys, recipe: str, *args: str) -> tuple:
    """(exit status, checklist lines) of an in-process rehearsal whose launches are refused: a problem the
    preflight finds must stop it before any process is launched."""

    def launched(*_):
        raise AssertionError("the rehearsal launched processes before its preflight found the problem")

    monkeypatch.setattr(rehearsal, "_launch", launched)
    status = rehearse([recipe, "--rehearse", "true", *args])
    return status, [line for line in capsys.readouterr().out.splitlines() if line.startswith("[rehearse]   [")]


def test_what_would_break_is_reported_with_the_line_to_fix_before_launching(tmp_path, monkeypatch, capsys):
    """Data that is not there (as the recipe's openwebtext is not here): the checklist lists every preflight
    problem, one line each, within seconds, and the status is 1. Before, the problems surfaced after a
    4-process launch (28-41 s), and only the first line of them:
    ``AssertionError: the rehearsal launched processes before its preflight found the problem``."""
    no_data, no_tokenizer = str(tmp_path / "no_data"), str(tmp_path / "no_tokenizer")
    status, checklist = _rehearse_without_launching(
        monkeypatch,
        capsys,
        RECIPE,
        *("--input_dir", no_data, "--tokenizer_name_or_path", no_tokenizer),
        *("--output_dir", str(tmp_path / "llama")),
    )
    assert status == 1
    assert len(checklist) == 2 and all(line.startswith("[rehearse]   [FAIL] preflight: ") for line in checklist)
    assert "tokenizer_name_or_path: " in checklist[0] and f"input_dir: '{no_data}'" in checklist[1], checklist


def test_deepseek_v3_rehearses_with_a_layer_of_experts_and_too_few_layers_are_a_preflight_line(
    tmp_path, monkeypatch, capsys
):
    """DeepSeek-V3 has 3 dense layers before its first layer of experts: the rehearsal keeps 4. It kept 2
    (today: ``assert '2' == '4'``), and the launch crashed after building the model (``ValueError: no MoE
    router (a sublayer named *.mlp.gate) in DeepseekV3ForCausalLM``); a user's 2 layers are now one
    preflight line, before launching."""
    recipe = os.path.join(REPO, "config", "deepseek_v2", "pretrain_argument.json")
    v3 = ("--model_name_or_path", "deepseek-v3", *DEMO_DATA, "--output_dir", str(tmp_path / "v3"))
    plan = plan_rehearsal([recipe, "--rehearse", "true", *v3])
    keys = _pairs(plan.overrides)
    assert keys["--num_hidden_layers"] == "4"
    # 32 experts as wide as the MLP (twice the top-8, in 8 groups), small latent attention, and the recipe's
    # 102,400-row vocabulary cut to the demo tokenizer's 8,000 tokens: the first save outlasted gloo's 30 s
    shrunk = ("--n_routed_experts", "--moe_intermediate_size", "--q_lora_rank", "--kv_lora_rank", "--vocab_size")
    assert [keys[key] for key in shrunk] == ["32", "128", "64", "32", "8064"]
    assert any("the first 3 are dense (first_k_dense_replace), then one with experts" in line for line in plan.changes)
    status, checklist = _rehearse_without_launching(monkeypatch, capsys, recipe, *v3, "--num_hidden_layers", "2")
    assert status == 1
    assert checklist == [
        "[rehearse]   [FAIL] preflight: num_hidden_layers: 2 leaves no layer with experts in deepseek-v3 (its first "
        "3 layers are dense: first_k_dense_replace 3); give num_hidden_layers 4 or more"
    ]


def test_a_users_max_steps_sets_what_the_rehearsal_expects_and_too_few_are_refused_in_one_line():
    """``--max_steps 6``: 6 steps expected, checkpoints 2, 4 and 6. ``--max_steps 1`` left no step after the
    checkpoint to resume, and the rehearsal failed after its launch with ``[FAIL] expected finite losses for
    steps 1-4``; now it is refused at once (before: ``Failed: DID NOT RAISE``)."""
    with pytest.raises(UserError, match=r"^max_steps 1, save_steps 2: a rehearsal saves a checkpoint, then resumes"):
        plan_rehearsal([RECIPE, "--rehearse", "true", "--max_steps", "1"])
    plan = plan_rehearsal([RECIPE, "--rehearse", "true", "--max_steps", "6"])
    assert (plan.steps, plan.save_every) == (6, 2) and _pairs(plan.overrides)["--max_steps"] == "6"


def _ranks_of(process: subprocess.Popen) -> list:
    """Pids of the ranks (processes with ``PADDLE_TRAINER_ID``) that ``process`` launched, directly or not."""
    ranks = []
    for pid in descendants(process.pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if any(entry.startswith(b"PADDLE_TRAINER_ID=") for entry in f.read().split(b"\0")):
                    ranks.append(pid)
        except OSError:
            continue
    return ranks


@pytest.mark.slow
def test_a_second_rehearsal_is_refused_and_sigterm_ends_the_launch_with_every_process(tmp_path, demo_dir, launches):
    """A rehearsal holds its folder: a second one of the same recipe is refused in one line naming the first's
    pid. Before, it deleted the first's folders and launched its own, and one of them failed on the other's
    files: ``error: .../llama_rehearsal/resumed/checkpoint-2: File exists (EEXIST)``. SIGTERM ends the
    rehearsal in one line, with the launcher, its 4 ranks and their DataLoader workers: nothing of it is
    alive 20 s later. Before, the rehearsal ended at once with status -15 and no line, and 20 s later its
    launcher and 4 ranks were still running: ``[15760, 15780, 15781, 15782, 15783]``."""
    out = str(tmp_path / "llama")
    command = [sys.executable, os.path.join(REPO, "run_pretrain.py"), RECIPE, "--rehearse", "true", *DEMO_DATA]
    first = launches.start([*command, "--output_dir", out], str(tmp_path), "first.log")
    deadline = time.monotonic() + 300
    while len(_ranks_of(first)) < 4:
        assert first.poll() is None and time.monotonic() < deadline, _read(tmp_path / "first.log")
        time.sleep(0.2)
    second = launches.start([*command, "--output_dir", out], str(tmp_path), "second.log")
    assert second.wait(timeout=120) == 2
    refusal = [line for line in _read(tmp_path / "second.log").splitlines() if line.startswith("error: ")]
    assert refusal == [
        f"error: output_dir: {out}_rehearsal is in use by another run (pid {first.pid} on {socket.gethostname()}); "
        "wait for it to finish, or give this run another output_dir"
    ]
    assert os.path.isdir(os.path.join(out + "_rehearsal", "logs_run"))  # the first's folders are still there
    first.send_signal(signal.SIGTERM)
    signalled_at = time.monotonic()
    assert first.wait(timeout=20) == 128 + signal.SIGTERM
    stopped = [line for line in _read(tmp_path / "first.log").splitlines() if line.startswith("stopped: ")]
    assert len(stopped) == 1 and "stopped by SIGTERM; no process it launched is left" in stopped[0], stopped
    assert launches.left_behind(grace=signalled_at + 20 - time.monotonic()) == []


def _read(path) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()
