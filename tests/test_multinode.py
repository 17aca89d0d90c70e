"""Two nodes simulated on localhost: two ``paddle.distributed.launch --nnodes 2`` launches, one process each,
with their own working directories.

paddlenlp's causal_dataset builds the index cache (per split: ``<hash>.dsc`` and ``_doc_idx``,
``_sample_idx``, ``_shuffle_idx`` .npy) on each node's local rank 0, or only on global rank 0 with
``share_folder``; the other ranks poll until the three .npy files exist and the last one loads,
then all meet at a barrier.
"""

import glob
import os
import re
import socket

import numpy as np
import pytest
from conftest import DEMO_DIR
from tiny_run import kill_group, launch_command, start, tiny_args

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


def _run_two_nodes(tmp_path, input_dir: str, data_cache: str, *extra: str) -> list:
    """Launch node ranks 0 and 1 (cwd tmp_path/node<i>, relative paths resolve per node); return their dirs."""
    port = _free_port()
    nodes, processes = [], []
    for rank in (0, 1):
        node = str(tmp_path / f"node{rank}")
        os.makedirs(node, exist_ok=True)
        command = launch_command(
            1, os.path.join(node, "log"), "--nnodes", "2", "--master", f"127.0.0.1:{port}", "--rank", str(rank)
        )
        command += tiny_args("out", data_cache, "--input_dir", input_dir, *extra, steps=2, save_steps=1000)
        processes.append(start(command, cwd=node, log_path=os.path.join(node, "launch.log")))
        nodes.append(node)
    try:
        codes = [process.wait(timeout=300) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                kill_group(process)
    assert codes == [0, 0], f"a node failed; see {tmp_path}/node*/log"
    return nodes


def _built_here(node: str) -> list:
    """check_rank_flag of each index mapping the node's worker looked up (True = it built that cache)."""
    with open(os.path.join(node, "log", "workerlog.0"), encoding="utf-8", errors="replace") as f:
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
