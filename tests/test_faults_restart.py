"""Fault injection, end to end: a run SIGKILLed at any moment and restarted plainly, again and again,
ends with the same weights and loss history as an uninterrupted run; checkpoints altered on disk are
skipped for the previous complete one; overwrite never resumes the older run; a second run on the
same output_dir is refused.

Every run is the tiny LLaMA of tests/tiny_run.py on the demo corpus (8 steps, a checkpoint every 2,
save_total_limit 2), one process, bounded by a timeout.
"""

import functools
import glob
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import script_env
from tiny_run import (
    final_weights,
    kill_group,
    kill_on,
    python_script,
    run,
    start,
    tiny_args,
    tmpfs_disk,
    without_root_override,
)

from pretrain import checkpoint
from pretrain.checkpoint import MARKER
from pretrain.log import logger

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

STEPS, SAVE_STEPS = 8, 2
RUN_TIMEOUT = 300  # seconds: a tiny run takes about 10


def _args(out, cache, *extra) -> list:
    return tiny_args(str(out), str(cache), *extra, steps=STEPS, save_steps=SAVE_STEPS)


def _history(out) -> dict:
    with open(os.path.join(out, "loss_history.json"), encoding="utf-8") as f:
        return json.load(f)


def _summary(out) -> dict:
    with open(os.path.join(out, "run_summary.json"), encoding="utf-8") as f:
        return json.load(f)


def assert_same_run(out, reference) -> None:
    """Final weights, loss history and loss figures of the summary equal the uninterrupted run's."""
    want, got = final_weights(reference), final_weights(out)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert _history(out) == _history(reference)
    for key in ("global_step", "train_loss_first", "train_loss_last"):
        assert _summary(out)[key] == _summary(reference)[key], key


@pytest.fixture(scope="module")
def reference(tmp_path_factory, demo_dir) -> str:
    """The output_dir of the uninterrupted run."""
    root = tmp_path_factory.mktemp("reference")
    out = str(root / "out")
    assert run(python_script(*_args(out, root / "cache")), log_path=str(root / "run.log"), timeout=RUN_TIMEOUT) == 0
    return out


@pytest.fixture
def pretrain_warnings():
    """The warnings the application's logger gives during the test (it does not propagate to pytest's caplog)."""
    warnings = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logger.addHandler(handler)
    yield warnings
    logger.removeHandler(handler)


class Moment:
    """Files (globs) to watch while a run goes on: ``fresh`` ones written since it started."""

    def __init__(self, out: str, cache: str, log: str):
        self.out, self.cache, self.log = out, cache, log
        self.started = time.time()

    def fresh(self, pattern: str) -> bool:
        for path in glob.glob(os.path.join(self.out, pattern)) + glob.glob(os.path.join(self.cache, pattern)):
            try:
                if os.path.getmtime(path) >= self.started:
                    return True
            except FileNotFoundError:  # renamed or deleted meanwhile
                continue
        return False

    def missing(self, relative: str) -> bool:
        return not os.path.exists(os.path.join(self.out, relative))

    def logged(self, text: str) -> bool:
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return text in f.read()


# (moment, when to kill): each kill lands on a run restarted after the previous kill.
KILLS = [
    ("while paddlenlp writes the index cache", lambda m: m.fresh("*/*_shuffle_idx.npy")),
    ("in the first training step", lambda m: m.logged("] step 1/")),  # a record of pretrain.metrics.progress
    ("while the model weights are written", lambda m: m.fresh("checkpoint-2/model_state.pdparams")),
    ("while the optimizer state is written", lambda m: m.fresh("checkpoint-2/optimizer.pdopt")),
    ("while the loss history is written into the checkpoint", lambda m: m.fresh("checkpoint-2/loss_history.json*")),
    ("while the completion marker is written", lambda m: m.fresh(f"checkpoint-2/{MARKER}*")),
    ("right after the marker, before rotation", lambda m: m.fresh(f"checkpoint-4/{MARKER}")),
    ("during rotation", lambda m: m.fresh(f"checkpoint-6/{MARKER}") and m.missing(f"checkpoint-2/{MARKER}")),
    ("while the run's loss history is written", lambda m: m.fresh("loss_history.json*")),
    # the summary follows the final model within a millisecond (no final evaluation here): one moment, whichever
    # of the two is being written when the kill lands (a restart then finishes the run or finds it finished)
    ("while the final model or the run summary is written", lambda m: m.fresh("model_state.pdparams")),
]


@pytest.mark.slow
def test_killed_at_every_moment_and_restarted_ends_like_an_uninterrupted_run(tmp_path, reference):
    out, cache = str(tmp_path / "out"), str(tmp_path / "cache")
    command = python_script(*_args(out, cache))
    for i, (moment, condition) in enumerate(KILLS):
        log = str(tmp_path / f"run{i}.log")
        watch = Moment(out, cache, log)
        process = start(command, log_path=log)
        assert kill_on(process, functools.partial(condition, watch), RUN_TIMEOUT), f"never killed {moment}; see {log}"
    log = str(tmp_path / "last.log")
    assert run(command, log_path=log, timeout=RUN_TIMEOUT) == 0, log
    assert_same_run(out, reference)


def _copy_run(reference: str, tmp_path) -> str:
    out = str(tmp_path / "out")
    shutil.copytree(reference, out, ignore=shutil.ignore_patterns(".run.lock*"))
    return out


def _flip_bytes(path: str, offset: int, count: int = 64) -> None:
    """Invert ``count`` bytes at ``offset`` (the file keeps its size)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(count)
        f.seek(offset)
        f.write(bytes(255 - b for b in data))


def _garbage(path: str) -> None:
    """Replace the whole file by random bytes of the same size."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.write(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes())


def _truncate(path: str) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


# (corruption of checkpoint-8, the phrase the warning must hold)
CORRUPTIONS = [
    ("model_state.pdparams", lambda p: _flip_bytes(p, os.path.getsize(p) // 2), "model_state.pdparams has CRC-32C"),
    ("optimizer.pdopt", _garbage, "optimizer.pdopt has CRC-32C"),
    ("trainer_state.json", _garbage, "trainer_state.json has CRC-32C"),
    ("rng_state.pth", _garbage, "rng_state.pth has CRC-32C"),
    ("scheduler.pdparams", _garbage, "scheduler.pdparams has CRC-32C"),
    ("loss_history.json", _garbage, "loss_history.json has CRC-32C"),
    ("config.json", lambda p: _flip_bytes(p, 10, 1), "config.json has CRC-32C"),
    ("model_state.pdparams", _truncate, "model_state.pdparams is"),
    ("optimizer.pdopt", os.remove, "optimizer.pdopt is missing"),
    (MARKER, os.remove, f"it has no {MARKER}"),
    (MARKER, _garbage, f"its {MARKER} is unreadable"),
    (MARKER, _truncate, f"its {MARKER} is unreadable"),
    ("training_args.bin", _garbage, "training_args.bin has CRC-32C"),
]


@pytest.mark.parametrize("name, corrupt, phrase", CORRUPTIONS, ids=[f"{n}-{c.__name__}" for n, c, _ in CORRUPTIONS])
def test_corrupt_checkpoint_is_skipped_with_a_warning(tmp_path, reference, pretrain_warnings, name, corrupt, phrase):
    out = _copy_run(reference, tmp_path)
    corrupt(os.path.join(out, "checkpoint-8", name))
    args = SimpleNamespace(
        output_dir=out, resume_from_checkpoint=None, overwrite_output_dir=False, local_process_index=0
    )
    assert checkpoint.resolve_resume_checkpoint(args) == os.path.join(out, "checkpoint-6")
    (warning,) = pretrain_warnings
    assert f"skipping checkpoint {out}/checkpoint-8: " in warning and phrase in warning, warning
    assert "\n" not in warning


@pytest.mark.slow
def test_restart_after_a_same_size_corruption_resumes_the_previous_checkpoint(tmp_path, reference):
    # 64 bytes flipped in the newest weights: without checksums this resumed silently (loss 7.97 -> 41).
    out, log = _copy_run(reference, tmp_path), str(tmp_path / "restart.log")
    weights = os.path.join(out, "checkpoint-8", "model_state.pdparams")
    _flip_bytes(weights, os.path.getsize(weights) // 2)
    assert run(python_script(*_args(out, tmp_path / "cache")), log_path=log, timeout=RUN_TIMEOUT) == 0
    with open(log, encoding="utf-8") as f:
        text = f.read()
    assert "skipping checkpoint" in text and "Continuing training from global step 6" in text
    assert_same_run(out, reference)


@pytest.mark.slow
def test_overwrite_moves_the_older_run_aside_and_never_resumes_it(tmp_path, reference):
    out, cache = str(tmp_path / "out"), str(tmp_path / "cache")
    older = tiny_args(out, cache, "--learning_rate", "1e-3", steps=12, save_steps=2)  # its checkpoints: 10, 12
    assert run(python_script(*older), log_path=str(tmp_path / "older.log"), timeout=RUN_TIMEOUT) == 0

    log = str(tmp_path / "overwrite.log")
    process = start(python_script(*_args(out, cache, "--overwrite_output_dir", "true")), log_path=log)
    assert kill_on(process, lambda: os.path.exists(os.path.join(out, "checkpoint-4", MARKER)), RUN_TIMEOUT)
    (aside,) = glob.glob(os.path.join(out, "overwritten-*"))
    moved = sorted(os.listdir(aside))  # the old run's checkpoints, history, summary and final model
    assert {"checkpoint-10", "checkpoint-12", "loss_history.json", "run_summary.json", "model_state.pdparams"} <= set(
        moved
    )
    assert not os.path.exists(os.path.join(out, "model_state.pdparams")) or os.path.getmtime(
        os.path.join(out, "model_state.pdparams")
    ) > os.path.getmtime(os.path.join(aside, "model_state.pdparams"))
    with open(log, encoding="utf-8") as f:
        (line,) = [line for line in f if "overwrite_output_dir: moved" in line]
    assert aside in line

    log = str(tmp_path / "restart.log")  # a plain restart after the crash: the new run's checkpoint-4
    assert run(python_script(*_args(out, cache)), log_path=log, timeout=RUN_TIMEOUT) == 0
    with open(log, encoding="utf-8") as f:
        assert "Continuing training from global step 4" in f.read()
    assert_same_run(out, reference)


@pytest.mark.slow
def test_a_second_run_on_the_same_output_dir_is_refused(tmp_path, demo_dir):
    out, cache = str(tmp_path / "out"), str(tmp_path / "cache")
    first = start(
        python_script(*tiny_args(out, cache, steps=100000, save_steps=100000)), log_path=str(tmp_path / "first.log")
    )
    try:
        lock = os.path.join(out, ".run.lock.node0")
        deadline = time.monotonic() + RUN_TIMEOUT
        while not (os.path.exists(lock) and open(lock).read().startswith("pid")):
            assert first.poll() is None and time.monotonic() < deadline, "the first run never took the lock"
            time.sleep(0.05)
        second = str(tmp_path / "second.log")
        assert run(python_script(*tiny_args(out, cache)), log_path=second, timeout=RUN_TIMEOUT) == 2
        assert first.poll() is None  # still training, untouched
    finally:
        kill_group(first)
    with open(second, encoding="utf-8") as f:
        errors = [line for line in f if line.startswith("error: ")]
    assert len(errors) == 1 and f"in use by another run (pid {first.pid} on " in errors[0], errors
    assert not glob.glob(os.path.join(out, "checkpoint-*"))


def test_unreadable_checkpoint_file_falls_back_to_the_previous_checkpoint(tmp_path, reference):
    out = _copy_run(reference, tmp_path)
    os.chmod(os.path.join(out, "checkpoint-8", "optimizer.pdopt"), 0)
    resolve = (
        "from types import SimpleNamespace; from pretrain import checkpoint; "
        f"print(checkpoint.resolve_resume_checkpoint(SimpleNamespace(output_dir={out!r}, "
        "resume_from_checkpoint=None, overwrite_output_dir=False, local_process_index=0)))"
    )
    result = subprocess.run(
        without_root_override([sys.executable, "-c", resolve]),
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == os.path.join(out, "checkpoint-6")
    (warning,) = [line for line in lines if "skipping checkpoint" in line]
    assert "checkpoint-8: optimizer.pdopt is unreadable (Permission denied)" in warning


@pytest.mark.slow
def test_disk_filling_up_mid_run_is_one_line_and_the_same_command_resumes(tmp_path, reference):
    # 40 MiB: room for the 2 checkpoints save_total_limit 1 keeps at once (13.5 MB each); then another
    # process fills the disk after the first checkpoint.
    with tmpfs_disk(str(tmp_path / "disk"), 40 * 1024) as disk:
        out, log = os.path.join(disk, "out"), str(tmp_path / "full.log")
        filler = os.path.join(disk, "filler")
        open(filler, "wb").close()  # created now: once the run has filled the disk, creating a file fails too
        command = python_script(*_args(out, tmp_path / "cache", "--save_total_limit", "1"))
        process = start(command, log_path=log)
        marker = os.path.join(out, "checkpoint-2", MARKER)
        deadline = time.monotonic() + RUN_TIMEOUT
        while not os.path.exists(marker):
            assert process.poll() is None and time.monotonic() < deadline, f"no checkpoint-2; see {log}"
            time.sleep(0.002)
        with open(filler, "ab", buffering=0) as f:  # unbuffered: no unwritten rest for close() to fail on
            with pytest.raises(OSError, match="No space left"):
                while True:
                    f.write(bytes(2**20))
        assert process.wait(timeout=RUN_TIMEOUT) == 2, log
        with open(log, encoding="utf-8") as f:
            text = f.read()
        (error,) = [line for line in text.splitlines() if line.startswith("error: ")]
        assert "out: the disk is full (No space left on device)" in error and "resumes from the last complete" in error
        assert "Traceback" not in text

        os.remove(filler)
        assert run(command, log_path=str(tmp_path / "resumed.log"), timeout=RUN_TIMEOUT) == 0
        assert_same_run(out, reference)
