"""A multi-rank run fails together, in bounded time, and leaves no process behind.

Two nodes are simulated on localhost (two ``paddle.distributed.launch --nnodes 2`` launches with their
own working folders, gloo), or one launch of 2 ranks; faults are injected for real (a node's data
missing, kill -9, kill -STOP). Every launch runs in its own session with a unique environment mark,
so that what is left of it afterwards can be found by that mark (``tiny_run.Launches``, the
``launches`` fixture).
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, script_env
from test_multinode import _free_port, _node_data
from tiny_run import launch_command, tiny_args, tmpfs_disk

from pretrain.checkpoint import checkpoint_problem
from pretrain.cluster.process_end import descendants
from pretrain.cluster.watchdog import SIDECAR_GRACE_S

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

ONE_LOADER_WORKER = ("--dataloader_num_workers", "1")  # a worker process per rank, as every GPU recipe sets
RUN_TIMEOUT = 300  # s: a launch that has not ended by then has hung (under load, starting paddle takes ~20 s)


def _two_nodes(launches, root, *extra: str, steps=2, save_steps=1000, data_on=(0, 1), env_of=None, script=None) -> list:
    """Start node ranks 0 and 1 (one rank each, cwd root/node<i>, worker logs in root/node<i>/log; ``env_of``:
    node rank -> extra environment of that node's launch; ``script``: run instead of run_pretrain.py);
    return the node dirs."""
    port = _free_port()
    nodes = []
    for rank in (0, 1):
        node = str(root / f"node{rank}")
        os.makedirs(node, exist_ok=True)
        if rank in data_on:
            _node_data(node)
        command = launch_command(
            1, os.path.join(node, "log"), "--nnodes", "2", "--master", f"127.0.0.1:{port}", "--rank", str(rank)
        )
        command = command[:-1] + [script or command[-1]]
        command += tiny_args("out", "cache", "--input_dir", "data", *extra, steps=steps, save_steps=save_steps)
        launches.start(command, node, "launch.log", (env_of or {}).get(rank))
        nodes.append(node)
    return nodes


def _errors(node: str) -> list:
    """The ``error: ...`` lines of a node's worker log."""
    with open(os.path.join(node, "log", "workerlog.0"), encoding="utf-8", errors="replace") as f:
        return [line.strip() for line in f if line.startswith("error: ")]


@pytest.mark.slow
def test_data_missing_on_one_node_stops_both_nodes_with_the_same_verdict(tmp_path, demo_dir, launches):
    nodes = _two_nodes(launches, tmp_path, data_on=(0,))
    codes, ended = launches.wait()
    assert codes[0] != 0 and codes[1] != 0, codes
    assert abs(ended[0] - ended[1]) < 30, ended  # together, not one node after a collective's timeout
    assert max(ended) - launches.first_start < 60, ended  # paddle's start included (measured: 13-19 s)
    verdicts = [_errors(node) for node in nodes]
    assert len(verdicts[0]) == 1 and verdicts[0] == verdicts[1], verdicts
    assert verdicts[0][0].startswith("error: rank 1 (node 1, host "), verdicts
    assert "input_dir" in verdicts[0][0] and "data" in verdicts[0][0]
    assert launches.left_behind() == []


@pytest.mark.slow
def test_fused_op_missing_on_one_node_stops_both_nodes_with_the_same_verdict(tmp_path, demo_dir, launches):
    # node 1 has no usable op: a plain module named fused_ln first on its path, where the op was never built
    os.makedirs(tmp_path / "no_op")
    (tmp_path / "no_op" / "fused_ln.py").write_text("raise ImportError('not the compiled op')\n")
    no_op = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "no_op"), script_env()["PYTHONPATH"]])}
    nodes = _two_nodes(launches, tmp_path, "--use_fused_rms_norm", "true", env_of={1: no_op})
    codes, ended = launches.wait()
    assert codes[0] != 0 and codes[1] != 0, codes
    assert abs(ended[0] - ended[1]) < 30, ended  # together, not one node after a collective's timeout
    assert max(ended) - launches.first_start < 60, ended  # paddle's start included (measured: 13-19 s)
    verdicts = [_errors(node) for node in nodes]
    assert len(verdicts[0]) == 1 and verdicts[0] == verdicts[1], verdicts
    assert verdicts[0][0].startswith("error: rank 1 (node 1, host ") and "fused_ln" in verdicts[0][0], verdicts
    assert launches.left_behind() == []


@pytest.mark.slow
def test_full_disk_on_one_node_stops_both_nodes_with_the_same_verdict(tmp_path, demo_dir, launches):
    os.makedirs(tmp_path / "node1")
    with tmpfs_disk(str(tmp_path / "node1" / "out"), 1024):  # node 1's output_dir: 1 MiB, a checkpoint needs 13 MB
        nodes = _two_nodes(launches, tmp_path)
        codes, ended = launches.wait()
    assert codes[0] != 0 and codes[1] != 0, codes
    assert abs(ended[0] - ended[1]) < 30, ended  # together, not one node after a collective's timeout
    assert max(ended) - launches.first_start < 60, ended  # paddle's start included (measured: 13-19 s)
    verdicts = [_errors(node) for node in nodes]
    assert len(verdicts[0]) == 1 and verdicts[0] == verdicts[1], verdicts
    assert (
        verdicts[0][0].startswith("error: rank 1 (node 1, host ")
        and "output_dir: one checkpoint needs" in verdicts[0][0]
    )
    assert launches.left_behind() == []


def _two_ranks(launches, root, *extra: str, steps=4, save_steps=1000) -> str:
    """Start one launch of 2 ranks on this node (worker logs in root/log); return its folder."""
    node = str(root)
    command = launch_command(2, os.path.join(node, "log"))
    command += tiny_args(
        os.path.join(node, "out"), os.path.join(node, "cache"), *extra, steps=steps, save_steps=save_steps
    )
    launches.start(command, node, "launch.log")
    return node


@pytest.mark.slow
def test_a_finished_two_rank_run_leaves_no_process_behind(tmp_path, demo_dir, launches):
    _two_ranks(launches, tmp_path, *ONE_LOADER_WORKER, "--do_eval", "true", "--eval_steps", "2")
    codes, _ = launches.wait()
    assert codes == [0], f"see {tmp_path}/log"
    assert launches.left_behind() == []  # DataLoader workers included (one per rank and live iterator)


def _worker_pid(launch: subprocess.Popen, rank_in_node: int = 0) -> int:
    """The pid of the launch's worker process ``rank_in_node`` (a child of the launcher running run_pretrain.py)."""
    for pid in descendants(launch.pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if b"run_pretrain.py" in cmdline and f"PADDLE_RANK_IN_NODE={rank_in_node}".encode() in environ:
            if b"paddle.distributed.launch" not in cmdline:
                return pid
    raise AssertionError(f"no worker {rank_in_node} under launcher {launch.pid}")


def _wait_for_step(log_path: str, step: int, launch: subprocess.Popen) -> None:
    """Wait until rank 0's log shows the record of ``step`` (so the ranks are in the training loop)."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while True:
        if os.path.exists(log_path):
            with open(log_path, encoding="utf-8", errors="replace") as f:
                if f"] step {step}/" in f.read():
                    return
        assert launch.poll() is None and time.monotonic() < deadline, f"no step {step} in {log_path}"
        time.sleep(0.2)


def _log(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


HANG_TIMEOUT = 12  # s, the hang_timeout of the fault tests (default 600): below gloo's own 30 s timeout


REPORT = r"error: rank {rank} \(node {node}, host [^)]+\) {what}.*? at step (\d+), phase ([a-z/]+)"
TRAINING_PHASES = ("data", "forward/backward", "collective", "optimizer")


def _signal_node_1_mid_step(launches, root, signum: int, *extra: str) -> tuple:
    """Two nodes training with HANG_TIMEOUT (``extra``: more run_pretrain.py arguments); ``signum`` to node 1's
    rank once rank 0 logged step 3. Both launches must end non-zero; return (the nodes' worker logs, seconds
    from the signal until both had ended, the monotonic time of the signal)."""
    nodes = _two_nodes(launches, root, "--hang_timeout", str(HANG_TIMEOUT), *extra, steps=100000)
    _wait_for_step(os.path.join(nodes[0], "log", "workerlog.0"), 3, launches.processes[0])
    os.kill(_worker_pid(launches.processes[1]), signum)
    signalled_at = time.monotonic()
    codes, ended = launches.wait()
    assert codes[0] != 0 and codes[1] != 0, codes
    return [_log(os.path.join(node, "log", "workerlog.0")) for node in nodes], max(ended) - signalled_at, signalled_at


@pytest.mark.slow
def test_kill_9_of_a_rank_on_one_node_ends_both_nodes_naming_rank_step_and_phase(tmp_path, demo_dir, launches):
    """With a DataLoader worker per rank, as every GPU recipe has: no process of the run is left 20 s after the
    kill. Before the sidecar ended the killed rank's process group, each rank's worker outlived the run
    (adopted by init, waiting on its pipe for ever): ``assert [5934] == []``."""
    logs, seconds, killed_at = _signal_node_1_mid_step(launches, tmp_path, signal.SIGKILL, *ONE_LOADER_WORKER)
    assert seconds < HANG_TIMEOUT + 30, seconds
    # node 1: its rank's sidecar names it; node 0: gloo aborts rank 0 when the connection drops (its sidecar
    # reports), or rank 0 reports itself (a Python error, or the watchdog if it was left waiting)
    killed = re.search(REPORT.format(rank=1, node=1, what="ended without finishing"), logs[1])
    assert killed and int(killed.group(1)) >= 3 and killed.group(2) in TRAINING_PHASES, logs[1][-3000:]
    survivor = re.search(
        REPORT.format(rank=0, node=0, what="(failed|made no progress|ended without finishing)"), logs[0]
    )
    assert survivor and survivor.group(3) in TRAINING_PHASES, logs[0][-3000:]
    assert launches.left_behind(grace=killed_at + 20 - time.monotonic()) == []


@pytest.mark.slow
def test_kill_stop_of_the_only_rank_of_a_node_ends_both_nodes(tmp_path, demo_dir, launches):
    logs, seconds, _ = _signal_node_1_mid_step(launches, tmp_path, signal.SIGSTOP)
    assert seconds < HANG_TIMEOUT + SIDECAR_GRACE_S + 30, seconds
    assert re.search(REPORT.format(rank=0, node=0, what="made no progress"), logs[0]), logs[0][-3000:]
    assert re.search(r"rank 1 \(node 1, host [^)]+\): stopped or gone, last heard \d+ s ago at step \d+", logs[0])
    stopped = re.search(REPORT.format(rank=1, node=1, what="made no progress"), logs[1])  # from its sidecar
    assert stopped and "did not end itself" in logs[1], logs[1][-3000:]
    assert launches.left_behind() == []


@pytest.mark.slow
def test_kill_stop_of_a_rank_ends_the_job_within_hang_timeout_naming_it(tmp_path, demo_dir, launches):
    node = _two_ranks(launches, tmp_path, "--hang_timeout", str(HANG_TIMEOUT), steps=100000)
    _wait_for_step(os.path.join(node, "log", "workerlog.0"), 3, launches.processes[0])
    stopped = _worker_pid(launches.processes[0], rank_in_node=1)
    os.kill(stopped, signal.SIGSTOP)
    stopped_at = time.monotonic()
    codes, ended = launches.wait()
    assert codes[0] != 0, codes
    assert HANG_TIMEOUT - 1 < ended[0] - stopped_at < HANG_TIMEOUT + 30, ended[0] - stopped_at
    log = _log(os.path.join(node, "log", "workerlog.0"))
    report = re.search(
        r"error: rank 0 \(node 0, host [^)]+\) made no progress for (\d+) s at step (\d+), phase ([a-z/]+)", log
    )
    assert report and int(report.group(1)) >= HANG_TIMEOUT, log[-3000:]
    assert re.search(r"rank 1 \(node 0, host [^)]+\): stopped or gone, last heard \d+ s ago at step \d+", log), log[
        -3000:
    ]
    assert launches.left_behind() == []  # the launcher killed the stopped rank


@pytest.mark.slow
def test_a_slowed_rank_is_named_at_the_log_records(tmp_path, demo_dir, launches):
    # Rank 1 stopped 0.2 s of every 0.3 s (SIGSTOP/SIGCONT from here): its data wait and forward take longer,
    # while rank 0 waits for it inside backward (the gradient all-reduce), which is not counted as own work.
    node = _two_ranks(launches, tmp_path, "--logging_steps", "4", steps=40)
    _wait_for_step(os.path.join(node, "log", "workerlog.0"), 4, launches.processes[0])
    slowed = _worker_pid(launches.processes[0], rank_in_node=1)
    while launches.processes[0].poll() is None:
        try:
            os.kill(slowed, signal.SIGSTOP)
            time.sleep(0.2)
            os.kill(slowed, signal.SIGCONT)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    codes, _ = launches.wait()
    assert codes == [0]
    named = re.findall(
        r"slow rank: rank (\d) \(node 0, host [^)]+\) needs ([\d.]+) s per step",
        _log(os.path.join(node, "log", "workerlog.0")),
    )
    assert [rank for rank, _ in named].count("1") >= 3, named  # of 9 records after the first
    assert launches.left_behind() == []


@pytest.mark.slow
def test_share_folder_on_storage_that_is_not_shared_fails_on_both_nodes_in_one_line(tmp_path, demo_dir, launches):
    nodes = _two_nodes(launches, tmp_path, "--share_folder", "true")  # "cache" is relative: one per node
    codes, ended = launches.wait()
    assert codes[0] != 0 and codes[1] != 0, codes
    assert max(ended) - launches.first_start < 60, ended  # paddle's start included (measured: 13 s)
    verdicts = [_errors(node) for node in nodes]
    assert len(verdicts[0]) == 1 and verdicts[0] == verdicts[1], verdicts
    assert verdicts[0][0].startswith("error: rank 1 (node 1, host "), verdicts
    assert "share_folder: true, but the index cache folder" in verdicts[0][0]
    assert "rank 0 (" not in verdicts[0][0]
    assert [name for _, _, names in os.walk(os.path.join(nodes[0], "cache")) for name in names if "probe" in name] == []
    assert launches.left_behind() == []


def _writer(node: str, output_dir: str, trials: int, barrier, errors) -> None:
    """One node's local rank 0 on a shared output_dir, in a container whose pid equals the other's: marks
    checkpoint-<k> and rotates (save_total_limit 1) at the same moment as the other writer, ``trials`` times."""
    import types

    from pretrain import atomic, checkpoint

    atomic.os = types.SimpleNamespace(**{**vars(os), "getpid": lambda: 4242})  # equal pids, as in two containers
    atomic.socket = types.SimpleNamespace(gethostname=lambda: node)
    for step in range(1, trials + 1):
        barrier.wait(timeout=60)
        try:
            checkpoint.mark_complete(os.path.join(output_dir, f"checkpoint-{step}"), step)
            barrier.wait(timeout=60)  # both rotate at the same moment (marking takes each a different time)
            checkpoint.rotate(output_dir, 1, step)
        except Exception as e:  # noqa: BLE001 -- every failure is the test's finding
            errors.put(f"{node} step {step}: {type(e).__name__}: {e}")


def test_two_writers_mark_and_rotate_one_shared_output_dir_without_error(tmp_path):
    import multiprocessing

    from pretrain.checkpoint import list_checkpoints

    trials, output_dir = 50, str(tmp_path / "out")
    for step in range(1, trials + 1):
        folder = os.path.join(output_dir, f"checkpoint-{step}")
        os.makedirs(folder)
        for name in ("model_state.pdparams", "optimizer.pdopt", "trainer_state.json"):
            with open(os.path.join(folder, name), "wb") as f:
                f.write(os.urandom(4096))
    context = multiprocessing.get_context("fork")
    barrier, errors = context.Barrier(2), context.Queue()
    writers = [context.Process(target=_writer, args=(n, output_dir, trials, barrier, errors)) for n in ("n0", "n1")]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=120)
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert [w.exitcode for w in writers] == [0, 0] and found == [], found
    assert [step for step, _ in list_checkpoints(output_dir)] == [trials]
    assert checkpoint_problem(os.path.join(output_dir, f"checkpoint-{trials}")) is None
    assert [name for name in os.listdir(os.path.join(output_dir, f"checkpoint-{trials}")) if ".partial." in name] == []


# run_pretrain.py with pretrain.checkpoint's marker writer and rotation recorded: "<global rank> <function>"
# appended to the file $WRITERS (one for both nodes)
RECORD_WRITERS = f"""
import os, runpy, sys
sys.path.insert(0, {REPO!r})
from pretrain import checkpoint

def recorded(function):
    def call(*args, **kwargs):
        with open(os.environ["WRITERS"], "a") as f:
            f.write(os.environ["PADDLE_TRAINER_ID"] + " " + function.__name__ + "\\n")
        return function(*args, **kwargs)
    return call

checkpoint.mark_complete = recorded(checkpoint.mark_complete)
checkpoint.rotate = recorded(checkpoint.rotate)
sys.argv = [os.path.join({REPO!r}, "run_pretrain.py"), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_two_nodes_on_one_shared_output_dir_save_and_rotate_once(tmp_path, demo_dir, launches):
    shared, writers, script = str(tmp_path / "shared_out"), str(tmp_path / "writers"), tmp_path / "record_writers.py"
    script.write_text(RECORD_WRITERS)
    nodes = _two_nodes(
        launches,
        tmp_path,
        *("--output_dir", shared, "--save_total_limit", "1"),
        steps=6,
        save_steps=2,
        env_of={0: {"WRITERS": writers}, 1: {"WRITERS": writers}},
        script=str(script),
    )
    codes, _ = launches.wait()
    assert codes == [0, 0], f"see {tmp_path}/node*/log"
    # save_total_limit 1 keeps the newest, and checkpoint-4: the last one a later step confirmed healthy
    # (pretrain.recovery; checkpoint-6 has no later step)
    kept = sorted(name for name in os.listdir(shared) if name.startswith("checkpoint-"))
    assert kept == ["checkpoint-4", "checkpoint-6"]
    assert checkpoint_problem(os.path.join(shared, "checkpoint-6")) is None
    leftovers = [name for _, _, names in os.walk(shared) for name in names if ".partial." in name or "probe" in name]
    assert leftovers == []
    deleted = re.findall(r"deleting checkpoint (\S+)", _log(os.path.join(nodes[0], "log", "workerlog.0")))
    assert [os.path.basename(path) for path in deleted] == ["checkpoint-2"]  # once, by global rank 0
    with open(writers, encoding="utf-8") as f:  # node 1's local rank 0 (global rank 1) neither marks nor rotates
        assert f.read().splitlines() == ["0 mark_complete", "0 rotate"] * 3  # checkpoints 2, 4 and 6
    assert launches.left_behind() == []


def test_slow_rank_message_names_the_slowest_rank_only_above_the_threshold():
    from pretrain.cluster.watchdog import slow_rank_message

    where = [(0, "a"), (0, "a"), (1, "b"), (1, "b")]
    message = slow_rank_message([0.10, 0.11, 0.10, 0.20], 0.2, where)
    assert message.startswith("slow rank: rank 3 (node 1, host b) needs 0.200 s per step"), message
    assert "0.095 s (90%) more than the median rank" in message
    assert slow_rank_message([0.10, 0.11, 0.10, 0.115], 0.2, where) is None  # 10% over the median
    assert slow_rank_message([0.001, 0.001, 0.001, 0.003], 0.2, where) is None  # 2 ms: noise
    assert slow_rank_message([0.10, None, None, None], 0.2, where) is None  # one rank heard


def test_verdict_message_groups_ranks_with_the_same_problem_and_names_silent_ones():
    from pretrain.cluster.agreement import _verdict_message

    ok = {"node": 0, "host": "h0"}
    verdicts = {
        0: ok,
        1: {"node": 0, "host": "h0", "error": "input_dir: missing"},
        2: {"node": 1, "host": "h1", "error": "input_dir: missing"},
    }
    assert _verdict_message("preflight", {0: ok, 1: ok}, 2, 60) is None
    assert _verdict_message("preflight", verdicts, 3, 60) == (
        "rank 1 (node 0, host h0), rank 2 (node 1, host h1): input_dir: missing"
    )
    lines = _verdict_message("preflight", verdicts, 4, 60).splitlines()
    assert lines[0] == "preflight failed on 3 ranks, every rank stops:"
    assert lines[2] == "  - rank 3: gave no preflight verdict within 60 s (it crashed or hangs: see its log)"


def test_end_child_processes_leaves_no_child(tmp_path):
    # in a child of the test (the function ends its caller's children), one child ignoring SIGTERM, one not
    script = (
        "import subprocess, sys, time\n"
        "from pretrain.cluster.process_end import child_pids, end_child_processes\n"
        "stubborn = 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'\n"
        "codes = ('import time; time.sleep(600)', stubborn)\n"
        "kids = [subprocess.Popen([sys.executable, '-c', code]) for code in codes]\n"
        "time.sleep(1)\n"
        "end_child_processes()\n"
        "print(child_pids(), [kid.poll() is not None or kid.pid for kid in kids])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env=script_env(), capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "[] [True, True]", result.stderr[-2000:]
