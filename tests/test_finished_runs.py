"""A finished run is never damaged: rerun plainly (or after a kill during the final save or the summary),
it trains nothing, adds no duplicate evaluation and keeps its measured figures; a resumed run counts every
step's tokens; a run with --overwrite_output_dir moves the old final model aside too, and a kill in the
middle of that move never lets a plain restart resume the old run; stale ``*.partial.<pid>`` files of
dead processes are removed.

Every run is the tiny LLaMA of tests/tiny_run.py (4 steps, evaluation and a checkpoint every 2: the final
evaluation falls on max_steps, as in the baichuan and qwen2 recipes), one process, bounded by a timeout.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO
from tiny_run import final_weights, python_script, run, tiny_args

from pretrain import checkpoint

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

STEPS = 4
TOKENS_PER_STEP = 4 * 64  # tiny_args: 4 samples of 64 tokens
EVAL = ("--do_eval", "true", "--evaluation_strategy", "steps", "--eval_steps", "2", "--eval_iters", "2")
TIMEOUT = 300  # seconds: a tiny run takes about 10


def _run(out, cache, log, *extra, steps=STEPS) -> int:
    args = tiny_args(str(out), str(cache), *EVAL, *extra, steps=steps, save_steps=2)
    return run(python_script(*args), log_path=str(log), timeout=TIMEOUT)


def _read(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def finished(tmp_path_factory, demo_dir) -> str:
    """The output_dir of a finished 4-step run (kept as it is: copy it before changing it)."""
    root = tmp_path_factory.mktemp("finished")
    assert _run(root / "out", root / "cache", root / "run.log") == 0
    return str(root / "out")


def _copy(src: str, dst: str) -> str:
    subprocess.run(["cp", "-a", src, dst], check=True)
    return dst


@pytest.mark.slow
def test_rerunning_a_finished_run_changes_none_of_its_outputs(tmp_path, finished):
    out = _copy(finished, str(tmp_path / "out"))
    names = ("loss_history.json", "run_summary.json", "model_state.pdparams")
    before = {name: _bytes(os.path.join(out, name)) for name in names}
    assert _run(out, tmp_path / "cache", tmp_path / "rerun.log") == 0
    for name in names:
        assert _bytes(os.path.join(out, name)) == before[name], name
    with open(tmp_path / "rerun.log", encoding="utf-8") as f:
        assert "already finished at step 4" in f.read()


@pytest.mark.slow
def test_a_run_killed_before_its_summary_restarts_without_a_duplicate_evaluation(tmp_path, finished):
    # A kill during the final save or the summary write leaves checkpoint-4 and no run_summary.json.
    out = _copy(finished, str(tmp_path / "out"))
    os.remove(os.path.join(out, "run_summary.json"))
    assert _run(out, tmp_path / "cache", tmp_path / "restart.log") == 0
    assert _read(os.path.join(out, "loss_history.json")) == _read(os.path.join(finished, "loss_history.json"))
    summary, reference = _read(os.path.join(out, "run_summary.json")), _read(os.path.join(finished, "run_summary.json"))
    assert summary["train_tokens"] == STEPS * TOKENS_PER_STEP
    for key in ("global_step", "train_loss_first", "train_loss_last", "eval_loss"):
        assert summary[key] == reference[key], key
    for name, value in final_weights(finished).items():
        assert (final_weights(out)[name] == value).all(), name


@pytest.mark.slow
def test_train_tokens_of_a_resumed_run_count_every_step(tmp_path, demo_dir):
    out, cache = tmp_path / "out", tmp_path / "cache"
    assert _run(out, cache, tmp_path / "first.log", steps=2) == 0
    assert _run(out, cache, tmp_path / "second.log", steps=4) == 0  # resumes checkpoint-2
    summary = _read(os.path.join(out, "run_summary.json"))
    assert summary["steps_run_this_process"] == 2
    assert summary["train_tokens"] == 4 * TOKENS_PER_STEP


FINAL_MODEL = ("model_state.pdparams", "config.json", "tokenizer_config.json")


@pytest.mark.slow
def test_overwrite_moves_the_old_final_model_aside(tmp_path, finished):
    out = _copy(finished, str(tmp_path / "out"))
    moved = checkpoint.retire_previous_run(out)
    for name in FINAL_MODEL + ("checkpoint-4", "loss_history.json", "run_summary.json"):
        assert not os.path.exists(os.path.join(out, name)), name
        assert os.path.exists(os.path.join(moved, name)), name


def test_a_kill_in_the_middle_of_overwrite_never_resumes_the_old_run(tmp_path):
    out = tmp_path / "out"
    for step in (2, 4):
        (out / f"checkpoint-{step}").mkdir(parents=True)
        checkpoint.mark_complete(str(out / f"checkpoint-{step}"), step)
    (out / "model_state.pdparams").write_bytes(b"old model")
    # Kill the move after its first rename: the plan is on disk, one checkpoint is moved, one is not.
    code = (
        "import os, sys\n"
        "from pretrain import checkpoint\n"
        "real = os.rename\n"
        "def rename_once(a, b):\n"
        "    real(a, b)\n"
        "    if 'overwritten-' in str(b) and not str(b).endswith('.json'):\n"
        "        os._exit(9)\n"
        "os.rename = rename_once\n"
        f"checkpoint.retire_previous_run({str(out)!r})\n"
    )
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=120).returncode == 9
    assert checkpoint.list_checkpoints(str(out)), "the kill came after every checkpoint was moved"
    # A restart without overwrite_output_dir finishes the move before it looks for a checkpoint.
    checkpoint.finish_retiring(str(out))
    assert checkpoint.list_checkpoints(str(out)) == []
    assert not os.path.exists(out / "model_state.pdparams")
    (moved,) = [name for name in os.listdir(out) if name.startswith("overwritten-")]
    assert sorted(os.listdir(out / moved)) == ["checkpoint-2", "checkpoint-4", "model_state.pdparams"]


def test_stale_partial_files_of_dead_processes_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    (tmp_path / "checkpoint-2").mkdir()
    stale = [tmp_path / f"loss_history.json.partial.{dead_pid}", tmp_path / "checkpoint-2" / f"x.partial.{dead_pid}"]
    live = [tmp_path / f"run_summary.json.partial.{os.getpid()}", tmp_path / "notes.partial.txt"]
    for path in stale + live:
        path.write_bytes(b"half")
    checkpoint.remove_stale_partial_files(str(tmp_path))
    assert [path.exists() for path in stale] == [False, False]
    assert [path.exists() for path in live] == [True, True]


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, demo_dir) -> tuple:
    """(command(output_dir, *extra), output_dir) of a finished 8-step LoRA run with a checkpoint every 4 steps
    and merge_lora."""
    from tiny_finetune import finetune_args, pretrain_tiny_model, write_demo_pairs

    root = tmp_path_factory.mktemp("finetuned")
    base = pretrain_tiny_model(str(root / "base"), steps=10)
    pairs = write_demo_pairs(str(root / "pairs"), train=100, dev=8)

    def command(out: str, *extra: str) -> list:
        args = finetune_args(base, pairs, out, "--save_steps", "4", *extra, steps=8)
        return [sys.executable, os.path.join(REPO, "run_finetune.py"), *args]

    out = str(root / "out")
    assert run(command(out), log_path=str(root / "run.log"), timeout=TIMEOUT) == 0
    return command, out


FINETUNE_OUTPUTS = ("lora_model_state.pdparams", "loss_history.json", "merged/model_state.pdparams")


@pytest.mark.slow
@pytest.mark.parametrize("killed_during_merge", [False, True])
def test_a_finished_finetune_run_never_trains_past_max_steps(tmp_path, finetuned, killed_during_merge):
    command, finished_out = finetuned
    out = _copy(finished_out, str(tmp_path / "out"))
    if killed_during_merge:  # the merged model half-written, no summary yet
        os.remove(os.path.join(out, "run_summary.json"))
        with open(os.path.join(out, "merged", "model_state.pdparams"), "r+b") as f:
            f.truncate(100)
    log = str(tmp_path / "rerun.log")
    assert run(command(out), log_path=log, timeout=TIMEOUT) == 0
    with open(log, encoding="utf-8") as f:
        text = f.read()
    assert "step 9/8" not in text
    assert _read(os.path.join(out, "run_summary.json"))["global_step"] == 8
    for name in FINETUNE_OUTPUTS:
        assert _bytes(os.path.join(out, name)) == _bytes(os.path.join(finished_out, name)), name


@pytest.mark.slow
def test_resuming_an_adapter_with_another_lora_rank_is_one_line(tmp_path, finetuned):
    command, finished_out = finetuned
    out = _copy(finished_out, str(tmp_path / "out"))
    shutil.rmtree(os.path.join(out, "checkpoint-8"))  # resumes checkpoint-4
    log = str(tmp_path / "rerun.log")
    assert run(command(out, "--lora_rank", "4"), log_path=log, timeout=TIMEOUT) == 2
    with open(log, encoding="utf-8") as f:
        (error,) = [line for line in f if line.startswith("error: ")]
    assert "lora_rank" in error and "checkpoint-4" in error and "8" in error
    with open(log, encoding="utf-8") as f:
        assert "Traceback" not in f.read()
