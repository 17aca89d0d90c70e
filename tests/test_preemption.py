"""Preemption: SIGTERM, SIGUSR1 or max_wall_time save checkpoint-<step> at the next step boundary (also
while evaluating), every rank exits with status 75, and the same command resumes to the same weights
and loss history as an uninterrupted run; SIGINT is one line, no traceback (pretrain.preemption).

End-to-end runs are the tiny LLaMA of tests/tiny_run.py, 1 process and 2 gloo ranks, bounded in time;
the signals are real, sent to the process, the launcher or one rank.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import REPO, script_env
from tiny_run import (
    final_weights,
    kill_group,
    launch_command,
    logged_losses,
    python_script,
    run,
    start,
    tiny_args,
    wait,
)

from pretrain import checkpoint
from pretrain.cluster.launched import run_launched
from pretrain.cluster.process_end import descendants
from pretrain.errors import RunStopped, run_cli
from pretrain.nan_guard import NanGuard
from pretrain.preemption import EXIT_INTERRUPTED, EXIT_PREEMPTED, STOP_REQUESTED, Preemption, StopSignals

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

STEPS, EVAL_STEPS = 20, 5
RUN_TIMEOUT = 300  # seconds: a tiny run takes about 15
# Evaluations of 100 global batches of 4 samples, 200 batches of 2 on one process (a few seconds), so that a signal
# sent when step 5 is logged lands in one.
EVAL = ("--do_eval", "true", "--evaluation_strategy", "steps", "--eval_steps", str(EVAL_STEPS), "--eval_iters", "100")


def _args(out, cache, *extra, nproc=1) -> list:
    batch = ("--per_device_train_batch_size", str(4 // nproc), "--per_device_eval_batch_size", "2")
    return tiny_args(str(out), str(cache), *EVAL, *batch, *extra, steps=STEPS, save_steps=1000)


def _command(nproc: int, logs: str, args: list) -> list:
    return python_script(*args) if nproc == 1 else launch_command(nproc, logs) + args


def _history(out) -> dict:
    with open(os.path.join(out, "loss_history.json"), encoding="utf-8") as f:
        return json.load(f)


def _logged(path: str, text: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return text in f.read()
    except FileNotFoundError:
        return False


def _wait_for(condition, process, timeout: float = RUN_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None or time.monotonic() > deadline:
            kill_group(process)
            pytest.fail("the run ended (or timed out) before the moment to signal it")
        time.sleep(0.01)


def _stop_lines(log: str) -> list:
    with open(log, encoding="utf-8", errors="replace") as f:
        text = f.read()
    assert "Traceback" not in text, log
    return [line for line in text.splitlines() if line.startswith("stopped: ")]


def assert_stopped_at(out: str, log: str, step: int = None) -> int:
    """One ``stopped:`` line naming checkpoint-<k>, complete on disk, and no later checkpoint; returns k."""
    (line,) = _stop_lines(log)
    saved = sorted(step for step, _ in checkpoint.list_checkpoints(out))
    assert len(saved) == 1, saved
    assert f"stopped at step {saved[0]} of {STEPS} and saved {out}/checkpoint-{saved[0]};" in line, line
    assert checkpoint.checkpoint_problem(os.path.join(out, f"checkpoint-{saved[0]}")) is None
    assert not os.path.exists(os.path.join(out, "model_state.pdparams")), "the final model was saved"
    assert step is None or saved[0] == step, (saved, line)
    return saved[0]


def assert_same_run(out: str, reference: str) -> None:
    want, got = final_weights(reference), final_weights(out)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert _history(out) == _history(reference)


def _resume(out, cache, logs, nproc=1) -> None:
    os.makedirs(logs, exist_ok=True)
    log = os.path.join(logs, "resumed.log")
    assert run(_command(nproc, logs, _args(out, cache, nproc=nproc)), log_path=log, timeout=RUN_TIMEOUT) == 0, log


@pytest.fixture(scope="module")
def references(tmp_path_factory, demo_dir) -> dict:
    """{nproc: output_dir} of uninterrupted runs, built on demand."""
    root, built = tmp_path_factory.mktemp("reference"), {}

    def reference(nproc: int) -> str:
        if nproc not in built:
            out, logs = str(root / f"out{nproc}"), str(root / f"logs{nproc}")
            os.makedirs(logs)
            log = os.path.join(logs, "launch.log")
            command = _command(nproc, logs, _args(out, root / "cache", nproc=nproc))
            assert run(command, log_path=log, timeout=RUN_TIMEOUT) == 0, log
            built[nproc] = out
        return built[nproc]

    return reference


# --- unit: the agreement, the callback, the entry points ----------------------------------------------


def _preemption(signals: StopSignals, max_wall_time=None) -> Preemption:
    preemption = Preemption(max_wall_time, world_size=1, signals=signals)
    args = SimpleNamespace(output_dir="unused")
    preemption.on_train_begin(args, SimpleNamespace(global_step=0, max_steps=10), SimpleNamespace())
    return preemption


def test_a_stop_request_rides_the_nan_guards_all_reduce_and_saves_at_that_step(tmp_path):
    signals = StopSignals()
    preemption = _preemption(signals)
    guard = NanGuard("stop", 0, world_size=1)
    assert preemption.local_request() == 0
    guard.verdict([], 3, "unused", requests=preemption.local_request())
    preemption.agreed(guard.agreed_requests, 3)
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    preemption.on_step_end(None, SimpleNamespace(global_step=3, max_steps=10), control)
    assert not control.should_save and preemption.stopped_at is None

    signals.received = "SIGTERM"
    guard.verdict([], 4, "unused", requests=preemption.local_request())
    assert guard.agreed_requests == STOP_REQUESTED
    preemption.agreed(guard.agreed_requests, 4)
    preemption.on_step_end(None, SimpleNamespace(global_step=4, max_steps=10), control)
    assert control.should_save and control.should_training_stop and preemption.stopped_at == 4
    os.makedirs(tmp_path / "checkpoint-4")
    checkpoint.mark_complete(str(tmp_path / "checkpoint-4"), 4)  # what the trainer saves on should_save
    with pytest.raises(
        RunStopped, match=rf"^SIGTERM: stopped at step 4 of 10 and saved {tmp_path}/checkpoint-4;"
    ) as stop:
        preemption.raise_if_stopped(str(tmp_path))
    assert stop.value.exit_status == EXIT_PREEMPTED == 75


def test_a_request_at_the_last_step_lets_the_run_finish():
    signals = StopSignals()
    signals.received = "SIGUSR1"
    preemption = _preemption(signals)
    preemption.agreed(STOP_REQUESTED, 10)
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    preemption.on_step_end(None, SimpleNamespace(global_step=10, max_steps=10), control)
    assert not control.should_save and preemption.stopped_at is None
    preemption.raise_if_stopped("out")  # nothing to raise


def test_a_request_during_evaluation_saves_at_the_evaluated_step():
    signals = StopSignals()
    preemption = _preemption(signals)
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    preemption.on_evaluate(None, SimpleNamespace(global_step=5, max_steps=10), control)
    assert not control.should_save
    signals.received = "SIGTERM"
    preemption.on_evaluate(None, SimpleNamespace(global_step=5, max_steps=10), control)
    assert control.should_save and control.should_training_stop and preemption.stopped_at == 5
    finished = _preemption(signals)
    finished.on_train_end(None, None, None)
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    finished.on_evaluate(None, SimpleNamespace(global_step=8, max_steps=10), control)
    assert not control.should_save and finished.stopped_at is None  # the evaluation after training


def test_max_wall_time_requests_a_stop_once_passed():
    signals = StopSignals()
    assert _preemption(signals, max_wall_time=3600).local_request() == 0
    signals.started -= 3601
    preemption = _preemption(signals, max_wall_time=3600)
    assert preemption.local_request() == STOP_REQUESTED
    preemption.agreed(STOP_REQUESTED, 2)
    assert preemption.reason == "max_wall_time 3600 s"


def test_run_launched_prints_one_line_and_exits_with_the_stop_status(capsys, monkeypatch):
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "1")

    def main():
        raise RunStopped("SIGTERM: stopped at step 4", EXIT_PREEMPTED)

    with pytest.raises(SystemExit) as end:
        run_launched(main)
    assert end.value.code == 75
    assert capsys.readouterr().err == "stopped: SIGTERM: stopped at step 4\n"

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as end:
        run_cli(interrupted)
    assert end.value.code == 130 == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "stopped: interrupted (SIGINT)\n"


WORKER_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    from paddle.io import DataLoader, Dataset
    from pretrain.preemption import SIGNALS, install_stop_handlers

    class Slow(Dataset):
        def __len__(self):
            return 200
        def __getitem__(self, i):
            time.sleep(0.005)
            return [i]

    install_stop_handlers()
    loader = DataLoader(Slow(), batch_size=2, num_workers=1)
    loader.worker_init_fn = SIGNALS.worker_init
    batches = iter(loader)
    next(batches)
    with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
        (worker,) = map(int, f.read().split())
    os.killpg(os.getpgid(0), signal.SIGTERM)  # as paddle's launcher does: the rank and its workers
    os.kill(worker, signal.SIGUSR1)
    time.sleep(0.5)
    print("batches", 1 + sum(1 for _ in batches), "request", SIGNALS.received, flush=True)
    """
)


def test_dataloader_workers_outlive_the_launchers_sigterm(tmp_path):
    """paddle's worker dies on a SIGTERM its rank did not send, and the rank raises; with the handlers
    of pretrain.preemption the workers go on and the rank records the request."""
    script = tmp_path / "loader.py"
    script.write_text(WORKER_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "batches 100 request SIGTERM"


# --- end to end ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_max_wall_time_saves_and_the_same_command_resumes_exactly(tmp_path, references):
    out, cache, log = str(tmp_path / "out"), str(tmp_path / "cache"), str(tmp_path / "stopped.log")
    # 1 ms: passed before the first step ends, however fast the machine
    command = python_script(*_args(out, cache, "--max_wall_time", "0.001"))
    assert run(command, log_path=log, timeout=RUN_TIMEOUT) == EXIT_PREEMPTED, log
    assert_stopped_at(out, log, step=1)
    assert "max_wall_time 0.001 s: stopped at step 1" in _stop_lines(log)[0]
    _resume(out, cache, str(tmp_path))
    assert_same_run(out, references(1))


@pytest.mark.slow
def test_sigterm_while_evaluating_saves_that_step_and_resumes_exactly(tmp_path, references):
    out, cache, log = str(tmp_path / "out"), str(tmp_path / "cache"), str(tmp_path / "stopped.log")
    process = start(python_script(*_args(out, cache, "--dataloader_num_workers", "1")), log_path=log)
    _wait_for(lambda: _logged(log, f"] step {EVAL_STEPS}/"), process)  # logged just before its evaluation
    process.send_signal(signal.SIGTERM)
    assert wait(process, RUN_TIMEOUT) == EXIT_PREEMPTED, log
    assert_stopped_at(out, log, step=EVAL_STEPS)
    assert [entry[0] for entry in _history(out)["eval"]] == [EVAL_STEPS]  # the evaluation finished first
    _resume(out, cache, str(tmp_path))
    assert_same_run(out, references(1))


@pytest.mark.slow
def test_sigint_is_one_line_naming_the_step_and_the_checkpoint(tmp_path, demo_dir):
    out, log = str(tmp_path / "out"), str(tmp_path / "run.log")
    process = start(python_script(*_args(out, tmp_path / "cache")), log_path=log)
    _wait_for(lambda: _logged(log, "] step 3/"), process)
    process.send_signal(signal.SIGINT)
    assert wait(process, RUN_TIMEOUT) == EXIT_INTERRUPTED, log
    (line,) = _stop_lines(log)
    assert line.startswith("stopped: interrupted (SIGINT) at step "), line
    assert line.endswith("no complete checkpoint was saved: the same command starts the run over"), line


def _rank_pid(launcher: subprocess.Popen, rank: int) -> int:
    """The pid of ``rank``: a child of the launcher (its DataLoader workers are the rank's children)."""
    for pid in descendants(launcher.pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if parent == launcher.pid and f"PADDLE_TRAINER_ID={rank}".encode() in environ:
            return pid
    raise AssertionError(f"no process of rank {rank}")


@pytest.mark.slow
@pytest.mark.parametrize("target", ["launcher", "rank 1"])
def test_two_ranks_agree_to_stop_and_resume_exactly(tmp_path, references, launches, target):
    """SIGTERM to paddle's launcher (it sends SIGTERM to each rank's process group, DataLoader workers
    included, and exits 15), or SIGUSR1 to rank 1 alone (the other rank learns it in the step's
    all-reduce; the launcher exits with the ranks' 75). No process of the run outlives it."""
    out, cache, logs = str(tmp_path / "out"), str(tmp_path / "cache"), str(tmp_path / "logs")
    os.makedirs(logs)
    args = _args(out, cache, "--dataloader_num_workers", "1", nproc=2)
    process = launches.start(launch_command(2, logs) + args, logs, "launch.log")
    rank_0_log = os.path.join(logs, "workerlog.0")
    _wait_for(lambda: _logged(rank_0_log, "] step 2/"), process)
    trained = max(logged_losses(rank_0_log))  # steps done when the signal is sent
    if target == "launcher":
        process.send_signal(signal.SIGTERM)
        want = signal.SIGTERM  # paddle's launcher exits with the signal's number
    else:
        os.kill(_rank_pid(process, 1), signal.SIGUSR1)
        want = EXIT_PREEMPTED
    assert launches.wait(RUN_TIMEOUT)[0] == [want]
    steps = {assert_stopped_at(out, os.path.join(logs, f"workerlog.{rank}")) for rank in (0, 1)}
    assert len(steps) == 1
    stopped = steps.pop()
    assert trained < stopped < STEPS, (trained, stopped)  # a step after the signal, not the last one
    assert launches.left_behind() == []  # the ranks and their DataLoader workers
    _resume(out, cache, str(tmp_path / "resumed"), nproc=2)
    assert_same_run(out, references(2))
