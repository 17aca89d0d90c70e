"""Two nodes simulated on localhost: two ``paddle.distributed.launch --nnodes 2`` launches, one process each,
with their own working directories.

paddlenlp's causal_dataset builds the index cache (per split: ``<hash>.dsc`` and ``_doc_idx``,
``_sample_idx``, ``_shuffle_idx`` .npy) on each node's local rank 0, or only on global rank 0 with
``share_folder``; the other ranks poll until the three .npy files exist and the last one loads,
then all meet at a barrier.
"""

import glob
import json
import os
import re
import socket
import time

import numpy as np
import pytest
from conftest import DEMO_DIR
from tiny_run import final_weights, kill_group, kill_on, launch_command, start, tiny_args

from pretrain.checkpoint import MARKER, checkpoint_problem

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

BUILDER = re.compile(r"check_rank_flag (True|False)")
CACHE_SUFFIXES = (".dsc", "_doc_idx.npy", "_sample_idx.npy", "_shuffle_idx.npy")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_data(node_dir: str) -> str:
    """The node's own data folder: symlinks to the demo .bin/.idx."""
    data = os.path.join(node_dir, "data")
    os.makedirs(data)
    for suffix in (".bin", ".idx"):
        name = "demo_text_document" + suffix
        os.symlink(os.path.join(DEMO_DIR, name), os.path.join(data, name))
    return data


def _start_two_nodes(root, input_dir: str, data_cache: str, *extra: str, steps=2, save_steps=1000, log="log") -> tuple:
    """Launch node ranks 0 and 1 (cwd root/node<i>, relative paths resolve per node, worker logs in
    root/node<i>/<log>); return (node dirs, launcher processes)."""
    port = _free_port()
    nodes, processes = [], []
    for rank in (0, 1):
        node = str(root / f"node{rank}")
        os.makedirs(node, exist_ok=True)
        command = launch_command(
            1, os.path.join(node, log), "--nnodes", "2", "--master", f"127.0.0.1:{port}", "--rank", str(rank)
        )
        command += tiny_args("out", data_cache, "--input_dir", input_dir, *extra, steps=steps, save_steps=save_steps)
        processes.append(start(command, cwd=node, log_path=os.path.join(node, f"{log}.launch")))
        nodes.append(node)
    return nodes, processes


def _exit_codes(processes: list) -> list:
    """The launches' exit statuses, each within 300 s (else all are killed and TimeoutExpired raised)."""
    try:
        return [process.wait(timeout=300) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                kill_group(process)


def _wait_for_both(processes: list, root) -> None:
    """Both launches end with status 0 within 300 s (else both are killed and the test fails)."""
    assert _exit_codes(processes) == [0, 0], f"a node failed; see {root}/node*/log*"


def _run_two_nodes(root, input_dir: str, data_cache: str, *extra: str, **launch) -> list:
    """``_start_two_nodes`` and wait for both; return the node dirs."""
    nodes, processes = _start_two_nodes(root, input_dir, data_cache, *extra, **launch)
    _wait_for_both(processes, root)
    return nodes


def _built_here(node: str) -> list:
    """check_rank_flag of each index mapping the node's worker looked up (True = it built that cache), from
    paddlenlp's index-building output, which run_pretrain.py keeps in <output_dir>/data_build.rank<N>.log."""
    (path,) = glob.glob(os.path.join(node, "out", "data_build.rank*.log"))
    with open(path, encoding="utf-8", errors="replace") as f:
        return [flag == "True" for flag in BUILDER.findall(f.read())]


def _assert_complete_cache(cache_root: str) -> str:
    """One fingerprint folder of the data holding one .dsc plus its three .npy per dataset, nothing else,
    every .npy loading in full; returns the fingerprint."""
    (fingerprint,) = os.listdir(cache_root)
    cache = os.path.join(cache_root, fingerprint)
    names = sorted(os.listdir(cache))
    hashes = {name.split("_")[0].split(".")[0] for name in names}
    assert names == sorted(h + suffix for h in hashes for suffix in CACHE_SUFFIXES), names
    assert len(hashes) == 3  # train, validation, test
    for path in glob.glob(os.path.join(cache, "*.npy")):
        assert np.load(path, allow_pickle=True).size > 0, path
    return fingerprint


@pytest.mark.slow
def test_each_node_builds_its_own_cache_without_share_folder(tmp_path, demo_dir):
    for rank in (0, 1):
        _node_data(str(tmp_path / f"node{rank}"))
    nodes = _run_two_nodes(tmp_path, "data", "cache")
    fingerprints = []
    for node in nodes:
        assert _built_here(node) == [True, True, True], node
        fingerprints.append(_assert_complete_cache(os.path.join(node, "cache")))
    assert fingerprints[0] == fingerprints[1]  # the same data, the same cache key on every node
    caches = [os.path.join(node, "cache", fingerprints[0]) for node in nodes]
    assert sorted(os.listdir(caches[0])) == sorted(os.listdir(caches[1]))


@pytest.mark.slow
def test_only_global_rank_0_builds_the_shared_cache(tmp_path, demo_dir):
    shared = _node_data(str(tmp_path / "shared"))
    cache = os.path.join(shared, "cache")
    nodes = _run_two_nodes(tmp_path, shared, cache, "--share_folder", "true")
    assert _built_here(nodes[0]) == [True, True, True]
    assert _built_here(nodes[1]) == [False, False, False]  # node 1 waited and read node 0's files
    _assert_complete_cache(cache)


def _final_run(node: str) -> tuple:
    """(final weights, loss history) a node's run left in its output_dir."""
    with open(os.path.join(node, "out", "loss_history.json"), encoding="utf-8") as f:
        return final_weights(os.path.join(node, "out")), json.load(f)


@pytest.mark.slow
def test_nodes_agree_on_the_newest_checkpoint_complete_on_both(tmp_path, demo_dir):
    # Node-local output_dirs (each node saves its own copy: save_on_each_node) and save_total_limit 1: if node 0
    # rotated checkpoint-2 away as soon as it had marked checkpoint-4, a kill before node 1 marks checkpoint-4
    # would leave no checkpoint common to both nodes.
    run_args = ("--save_on_each_node", "true", "--save_total_limit", "1")
    launch = {"steps": 6, "save_steps": 2}
    reference = tmp_path / "reference"
    for rank in (0, 1):
        _node_data(str(reference / f"node{rank}"))
    _run_two_nodes(reference, "data", "cache", *run_args, **launch)

    root = tmp_path / "killed"
    for rank in (0, 1):
        _node_data(str(root / f"node{rank}"))
    nodes, processes = _start_two_nodes(root, "data", "cache", *run_args, **launch)
    folders = [os.path.join(node, "out", "checkpoint-4") for node in nodes]
    # Node 1 marks slowly (as behind a slower disk): a 2 GB sparse file in its new checkpoint to checksum.
    deadline = time.monotonic() + 300
    while not os.path.isdir(folders[1]):
        assert processes[1].poll() is None and time.monotonic() < deadline, f"no checkpoint-4 on node 1; see {root}"
        time.sleep(0.001)
    with open(os.path.join(folders[1], "slow_to_read.bin"), "wb") as f:
        f.truncate(2 * 2**30)
    assert kill_on(processes[0], lambda: os.path.exists(os.path.join(folders[0], MARKER)), timeout=300)
    kill_group(processes[1])
    assert not os.path.exists(os.path.join(folders[1], MARKER)), "node 1 marked in time after all"
    assert checkpoint_problem(os.path.join(nodes[0], "out", "checkpoint-2")) is None  # not rotated: node 1 lacks 4

    _run_two_nodes(root, "data", "cache", *run_args, log="log_restart", **launch)
    for node in nodes:
        with open(os.path.join(node, "log_restart", "workerlog.0"), encoding="utf-8", errors="replace") as f:
            assert "Continuing training from global step 2" in f.read(), node
    for rank, node in enumerate(nodes):
        want, got = _final_run(str(reference / f"node{rank}")), _final_run(node)
        assert got[1] == want[1]
        for name in want[0]:
            np.testing.assert_array_equal(got[0][name], want[0][name], err_msg=name)


@pytest.mark.slow
def test_a_sharding_change_over_node_local_folders_is_refused_in_one_line(tmp_path, demo_dir):
    """Each node keeps its own output_dir, so sharding rank 1's optimizer shard is on node 1 only: resumed as
    plain data parallelism no rank can merge the shards, and both nodes stop with one line naming why,
    instead of loading half of the moments (a shared output_dir resumes: tests/test_resume_layout.py)."""
    for rank in (0, 1):
        _node_data(str(tmp_path / f"node{rank}"))
    batch = ("--save_on_each_node", "true", "--per_device_train_batch_size", "2")
    sharding = ("--sharding", "stage1", "--sharding_parallel_degree", "2")
    nodes = _run_two_nodes(tmp_path, "data", "cache", *batch, *sharding, steps=2, save_steps=2)
    for rank, node in enumerate(nodes):
        files = os.listdir(os.path.join(node, "out", "checkpoint-2"))
        assert [name for name in files if name.endswith(".pdopt")] == [f"optimizer.shard0{rank}.pdopt"], files
    _, processes = _start_two_nodes(tmp_path, "data", "cache", *batch, steps=4, save_steps=2, log="log_resume")
    codes = _exit_codes(processes)
    assert codes[0] != 0 and codes[1] != 0, codes
    for node in nodes:
        with open(os.path.join(node, "log_resume", "workerlog.0"), encoding="utf-8", errors="replace") as f:
            errors = [line.strip() for line in f if line.startswith("error: ")]
        assert (
            len(errors) == 1
            and "was saved over another sharding degree or stage, and the nodes keep output_dir in " in (errors[0])
        ), errors
        assert "resume with the sharding degree that saved it" in errors[0]
