"""Tiny CPU training runs of run_pretrain.py for the robustness tests (resume, NaN, parallel, multi-node).

The model is the demo LLaMA shrunk to 2 layers x 64 wide (about 1.1 M parameters, 8064-row
vocabulary); samples are 64 tokens, 4 per step; a step takes ~50 ms on one CPU core.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager

from conftest import REPO, script_env

from pretrain.cluster.process_end import kill_process_tree
from pretrain.support_matrix import with_overrides

CONFIG = os.path.join(REPO, "config", "llama", "pretrain_demo_cpu.json")
TINY_MODEL = [
    "--model_name_or_path",
    "llama-debug",
    "--tokenizer_name_or_path",
    os.path.join(REPO, "data", "demo", "tokenizer"),
    "--num_hidden_layers",
    "2",
    "--hidden_size",
    "64",
    "--intermediate_size",
    "128",
    "--num_attention_heads",
    "4",
    "--num_key_value_heads",
    "4",
    "--max_seq_length",
    "64",
]
# The demo's matmul microbenchmark (achievable FLOP/s, pretrain.metrics.hardware) costs about 4 s of CPU per
# process: off in tiny runs, on where a test reads its figure.
NO_PROBE = ("--measure_peak_flops", "false")


# A short run of a demo config (its own model): batch 4 x 128 tokens (no accumulation), loss logged every
# step, no eval, no checkpoint; add --max_steps.
SHORT_DEMO_RUN = (
    *("--warmup_steps", "2", "--logging_steps", "1", "--per_device_train_batch_size", "4"),
    *("--gradient_accumulation_steps", "1"),
    *("--max_seq_length", "128", "--do_eval", "false", "--evaluation_strategy", "no", "--save_steps", "1000"),
    *NO_PROBE,
)
LOSS_LINE = re.compile(r"\] step (\d+)/\d+ \| loss ([-\d.naif]+) \|")  # a record of pretrain.metrics.progress


def tiny_args(output_dir: str, data_cache: str, *extra: str, steps: int = 10, save_steps: int = 3) -> list:
    """run_pretrain.py arguments for a tiny run: ``steps`` optimizer steps of 4 x 64 tokens, loss logged every
    step; ``extra`` overrides (``with_overrides``)."""
    return with_overrides(
        [
            CONFIG,
            *TINY_MODEL,
            "--input_dir",
            os.path.join(REPO, "data", "demo"),
            "--per_device_train_batch_size",
            "4",
            "--max_steps",
            str(steps),
            "--warmup_steps",
            "2",
            "--save_steps",
            str(save_steps),
            "--logging_steps",
            "1",
            "--do_eval",
            "false",
            "--evaluation_strategy",
            "no",
            "--output_dir",
            output_dir,
            "--data_cache",
            data_cache,
            *NO_PROBE,
        ],
        *extra,
    )


ONE_AND_TWO_RANKS_STEPS = 6
ONE_AND_TWO_RANKS_EVAL_ITERS = 3  # global batches of 4: 12 samples, read in batches of 4 (on 2 ranks: 4 + 2 each)


def run_on_one_and_two_ranks(root: str) -> tuple:
    """(1-process output_dir, 2-rank output_dir) of the tiny run at one global batch of 4 samples: 4 per device on
    one process, 2 per device on 2 data-parallel gloo processes (rank 0's log in ``<root>/dp_logs/workerlog.0``).
    Each trains ``ONE_AND_TWO_RANKS_STEPS`` steps, saves its checkpoint at the last and is evaluated at the end on
    ``ONE_AND_TWO_RANKS_EVAL_ITERS`` global batches, in validation batches of 4 per device.

    Raises:
        AssertionError: a run failed (its log is named).
    """
    cache, outputs = os.path.join(root, "cache"), []
    for name, nproc in (("single", 1), ("dp", 2)):
        out, logs = os.path.join(root, name), os.path.join(root, f"{name}_logs")
        os.makedirs(logs)
        args = tiny_args(
            out,
            cache,
            *("--report_to", "none", "--per_device_train_batch_size", str(4 // nproc), "--do_eval", "true"),
            *("--eval_iters", str(ONE_AND_TWO_RANKS_EVAL_ITERS), "--per_device_eval_batch_size", "4"),
            steps=ONE_AND_TWO_RANKS_STEPS,
            save_steps=ONE_AND_TWO_RANKS_STEPS,
        )
        command = python_script(*args) if nproc == 1 else launch_command(nproc, logs) + args
        assert run(command, log_path=os.path.join(logs, "launch.log")) == 0, f"{name} failed; see {logs}"
        outputs.append(out)
    return tuple(outputs)


def launch_command(nproc: int, log_dir: str, *extra_launch: str) -> list:
    """``python -m paddle.distributed.launch`` for ``nproc`` CPU processes (gloo is chosen automatically on CPU)."""
    return [
        sys.executable,
        "-m",
        "paddle.distributed.launch",
        "--nproc_per_node",
        str(nproc),
        "--log_dir",
        log_dir,
        *extra_launch,
        os.path.join(REPO, "run_pretrain.py"),
    ]


def start(command: list, cwd: str = REPO, log_path: str = None) -> subprocess.Popen:
    """Start ``command`` in its own process group (so a SIGKILL reaches every worker), output to ``log_path``."""
    out = open(log_path, "w") if log_path else subprocess.DEVNULL
    return subprocess.Popen(
        command, cwd=cwd, env=script_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )


def run(command: list, cwd: str = REPO, log_path: str = None, timeout: int = 300) -> int:
    """Run ``command`` to completion; return its exit status."""
    return wait(start(command, cwd, log_path), timeout)


def wait(process: subprocess.Popen, timeout: float = 300) -> int:
    """``process``'s exit status; after ``timeout`` seconds its group is killed and TimeoutExpired raised."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(process)
        raise


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process and everything it started, like a node losing power (``kill_process_tree``), and
    reap it."""
    kill_process_tree(process.pid)
    process.wait()


MARK = "PRETRAIN_TEST_RUN_MARK"  # an environment variable every process of a test's launches inherits


def marked_processes(mark: str) -> list:
    """Pids of the live processes (zombies aside) whose environment holds ``MARK=mark``: every process a
    launch started, also once its parent is gone and it was adopted by init (an orphan)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ.split(b"\0") and state != "Z":
            found.append(int(entry))
    return found


class Launches:
    """The launches of one test (the ``launches`` fixture): started in sessions of their own with one unique
    ``MARK``, waited for with a deadline, and whatever is left of them killed at the end."""

    def __init__(self, root):
        self.root, self.mark, self.processes = root, uuid.uuid4().hex, []
        self.first_start = None  # monotonic time the first launch was started

    def start(self, command: list, cwd: str, log_name: str, env: dict = None) -> subprocess.Popen:
        """Start ``command`` in ``cwd``, output to ``cwd/log_name``; ``env`` adds variables to ``script_env()``."""
        if self.first_start is None:
            self.first_start = time.monotonic()
        with open(os.path.join(cwd, log_name), "w") as out:
            process = subprocess.Popen(
                command,
                cwd=cwd,
                env=script_env({MARK: self.mark, **(env or {})}),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def wait(self, timeout: float = 300) -> list:
        """Exit statuses of every launch, and the monotonic times they ended (polled every 0.1 s).

        Raises:
            AssertionError: a launch had not ended ``timeout`` seconds after this call.
        """
        deadline, ended = time.monotonic() + timeout, {}
        while len(ended) < len(self.processes) and time.monotonic() < deadline:
            for i, process in enumerate(self.processes):
                if i not in ended and process.poll() is not None:
                    ended[i] = time.monotonic()
            time.sleep(0.1)
        assert len(ended) == len(self.processes), f"a launch hung for {timeout} s; see {self.root}"
        return [p.returncode for p in self.processes], [ended[i] for i in range(len(self.processes))]

    def left_behind(self, grace: float = 10) -> list:
        """Processes of the launches still alive ``grace`` seconds after every launch ended (polled)."""
        deadline = time.monotonic() + grace
        while marked_processes(self.mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        return marked_processes(self.mark)

    def close(self) -> None:
        """SIGKILL every process of the launches still alive."""
        for process in self.processes:
            if process.poll() is None:
                kill_group(process)
        for pid in marked_processes(self.mark):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def kill_on(process: subprocess.Popen, condition, timeout: float = 300) -> bool:
    """SIGKILL ``process``'s group as soon as ``condition()`` is true (polled every 2 ms); False if the
    process ended first or ``timeout`` seconds passed (the group is killed then too, so nothing hangs)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            return False
        if time.monotonic() > deadline:
            kill_group(process)
            return False
        time.sleep(0.002)
    kill_group(process)
    return True


def kill_when(process: subprocess.Popen, path: str, timeout: float = 300) -> bool:
    """SIGKILL ``process``'s group as soon as ``path`` exists; False if the process ended first."""
    return kill_on(process, lambda: os.path.exists(path), timeout)


def without_root_override(command: list) -> list:
    """``command`` run without the capabilities that let root read any file (as non-root: unchanged), so
    that a file made unreadable with chmod is unreadable to it."""
    import pytest

    if os.geteuid() != 0:
        return command
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: file permissions cannot be enforced here")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *command]


def python_script(*args: str) -> list:
    """``python run_pretrain.py ARGS`` with this interpreter."""
    return [sys.executable, os.path.join(REPO, "run_pretrain.py"), *args]


def logged_losses(log_path: str) -> dict:
    """``{global_step: loss text}`` from a run's log (the records round the loss to 4 decimals; the
    run's loss_history.json has every digit)."""
    with open(log_path, encoding="utf-8", errors="replace") as f:
        return {int(step): loss for step, loss in LOSS_LINE.findall(f.read())}


def spike_norm_figures(output_dir: str, step: int) -> list:
    """[largest, smallest, moving average] of the gradient norms the spike detector kept over the healthy steps
    up to ``step`` (``pretrain.recovery``: checkpoint-<step>'s recovery.json)."""
    import json

    with open(os.path.join(output_dir, f"checkpoint-{step}", "recovery.json"), encoding="utf-8") as f:
        recovery = json.load(f)
    return [recovery[key] for key in ("max_grad_norm", "min_grad_norm", "ema_grad_norm")]


def text_of(path: str) -> str:
    """The text of ``path``; empty while it does not exist (a log a run has not written yet)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def final_weights(output_dir: str) -> dict:
    """``{name: numpy array}`` of the model saved at the end of training (``model_state.pdparams``)."""
    import paddle

    state = paddle.load(os.path.join(output_dir, "model_state.pdparams"))
    return {name: value.numpy() if hasattr(value, "numpy") else value for name, value in state.items()}


@contextmanager
def tmpfs_disk(point: str, kib: int):
    """A tmpfs of ``kib`` KiB mounted at ``point`` (created) for the ``with`` block: a disk that fills up
    for real. Skips the test where this process may not mount."""
    import pytest

    os.makedirs(point)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", point], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({result.stderr.decode().strip()}): no full disk to test")
    try:
        yield point
    finally:
        subprocess.run(["umount", "--lazy", point], check=True)  # files the test mapped may still be open
