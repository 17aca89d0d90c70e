"""Data faults: a damaged or stale index cache, a stale stats sidecar, an inconsistent legacy pair, a
sample that cannot be read, unreadable files and odd input_dir values. Each ends in a rebuilt cache,
a correct run or one clear error line, in bounded time (a hang fails the test instead of blocking)."""

import glob
import os
import shutil
import stat
import subprocess
import threading
import time

import numpy as np
import pytest
from conftest import DEMO_DIR, REPO, resolve_plan, script_env
from paddle.io import DataLoader
from paddlenlp.data.indexed_dataset import MMapIndexedDataset, make_builder
from test_preprocess_tools import write_legacy
from tiny_run import python_script, run, tiny_args, without_root_override

from pretrain.corpus import summarize_prefix
from pretrain.data import CheckedDataset, build_datasets, raise_read_error, resolve_data_sources
from pretrain.errors import UserError
from pretrain.preflight import check_data_source, check_run

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

DEMO_PREFIX = os.path.join(DEMO_DIR, "demo_text_document")
BOUND = 120  # seconds any single case may take before it counts as a hang


def within(seconds: float, function, *args):
    """``function(*args)`` in a daemon thread; fail the test if it has not returned after ``seconds``."""
    result = {}

    def call():
        try:
            result["value"] = function(*args)
        except BaseException as e:  # handed to the test below
            result["error"] = e

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{function.__name__} still running after {seconds} s: a hang"
    if "error" in result:
        raise result["error"]
    return result["value"]


def _copy_demo(folder, name: str = "demo", with_stats: bool = True) -> str:
    """The demo .bin/.idx (and stats sidecar) in ``folder``, dated as preprocessing an hour ago leaves them:
    the sidecar written after the .bin (file times are coarser than a copy takes)."""
    os.makedirs(folder, exist_ok=True)
    prefix = os.path.join(folder, name)
    written = time.time() - 3600
    for suffix in (".bin", ".idx") + ((".stats.json",) if with_stats else ()):
        shutil.copyfile(DEMO_PREFIX + suffix, prefix + suffix)
        os.utime(prefix + suffix, (written, written))
        written += 1
    return prefix


def _plan(tmp_path, input_dir: str, *extra):
    return resolve_plan(tiny_args(str(tmp_path / "out"), str(tmp_path / "cache"), "--input_dir", input_dir, *extra))


def _train_cache_file(cache_root: str, suffix: str) -> str:
    """The train split's index cache file ending in ``suffix`` (paddlenlp's .dsc names the split)."""
    for root, _, names in os.walk(cache_root):
        for name in names:
            if name.endswith(".dsc") and "Dataset name train\n" in open(os.path.join(root, name)).read():
                return os.path.join(root, name[: -len(".dsc")] + suffix)
    raise AssertionError(f"no train split cached in {cache_root}")


@pytest.fixture
def built_cache(tmp_path, demo_dir):
    """(plan, cache root) of the tiny run on a copy of the demo data, with its index cache built."""
    prefix = _copy_demo(tmp_path / "data")
    plan = _plan(tmp_path, prefix)
    within(BOUND, build_datasets, plan)
    return plan, str(tmp_path / "cache")


def _truncate(path: str) -> None:  # what a kill -9 or a full disk in the middle of np.save leaves
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _garbage_header(path: str) -> None:  # same size, the .npy header overwritten
    with open(path, "r+b") as f:
        f.write(os.urandom(64))


def _empty(path: str) -> None:  # a kill -9 after np.save created the file, before its first byte
    open(path, "wb").close()


@pytest.mark.parametrize("suffix", ["_shuffle_idx.npy", "_sample_idx.npy", "_doc_idx.npy"])
@pytest.mark.parametrize("damage", [_truncate, _garbage_header, _empty])
def test_damaged_index_cache_is_rebuilt(built_cache, suffix, damage):
    plan, cache = built_cache
    damaged = _train_cache_file(cache, suffix)
    expected = np.load(damaged)
    damage(damaged)
    train, _, _ = within(BOUND, build_datasets, plan)  # paddlenlp alone waits forever for this file
    np.testing.assert_array_equal(np.load(damaged), expected)
    assert len(train) == 40 and len(train[0]["text"]) == 65


@pytest.mark.slow
def test_garbage_in_the_index_cache_is_named_in_one_line(built_cache, tmp_path):
    # The .npy headers intact, the shuffle order garbage: the first sample read fails in the loader thread.
    plan, cache = built_cache
    shuffle = _train_cache_file(cache, "_shuffle_idx.npy")
    header = 128  # bytes of an .npy header
    with open(shuffle, "r+b") as f:
        f.seek(header)
        f.write(os.urandom(os.path.getsize(shuffle) - header))
    # A cache with no checksums recorded (built by paddlenlp itself, or before they were kept): only the
    # loader can find the garbage (with them, the entry is rebuilt: test_bad_input_cases's in-place change test)
    for descriptor in glob.glob(os.path.join(os.path.dirname(shuffle), "*.dsc")):
        with open(descriptor, encoding="utf-8") as f:
            kept = [line for line in f if not line.startswith("CRC-32C ")]
        with open(descriptor, "w", encoding="utf-8") as f:
            f.writelines(kept)
    log = str(tmp_path / "run.log")
    args = tiny_args(str(tmp_path / "out"), cache, "--input_dir", plan.data[0].prefix)
    assert run(python_script(*args), log_path=log, timeout=BOUND) == 2  # not a hang, not a traceback
    with open(log, encoding="utf-8") as f:
        text = f.read()
    (error,) = [line for line in text.splitlines() if line.startswith("error: ")]
    assert "reading train sample" in error and os.path.dirname(shuffle) in error and "Traceback" not in text


def _first_documents(prefix: str, output_prefix: str, documents: int) -> None:
    """Rewrite ``output_prefix`` .bin/.idx with the first ``documents`` documents of ``prefix``."""
    source = MMapIndexedDataset(prefix, skip_warmup=True)
    builder = make_builder(output_prefix + ".bin", impl="mmap", save_dtype=np.uint16)
    for i in range(documents):
        builder.add_item(np.asarray(source[i], dtype=np.int64))
        builder.end_document()
    builder.finalize(output_prefix + ".idx")


def test_data_regenerated_under_the_same_name_gets_its_own_index_cache(built_cache, tmp_path):
    plan, cache = built_cache
    prefix = plan.data[0].prefix
    os.remove(prefix + ".stats.json")
    _first_documents(DEMO_PREFIX, prefix, 1500)  # same name, sample count, seed and split: paddlenlp's cache key
    regenerated = within(BOUND, build_datasets, _plan(tmp_path, prefix))[0]
    fresh_plan = _plan(tmp_path, prefix, "--data_cache", str(tmp_path / "fresh_cache"))
    fresh = within(BOUND, build_datasets, fresh_plan)[0]
    assert len(os.listdir(cache)) == 2  # one folder per version of the data
    for i in range(len(fresh)):
        np.testing.assert_array_equal(regenerated[i]["text"], fresh[i]["text"])


def test_unkeyed_cache_files_next_to_the_data_are_removed(built_cache, tmp_path):
    # An older version of this application (or paddlenlp itself) left its cache in <data folder>/index-cache,
    # where paddlenlp looks first whatever the data now holds.
    plan, cache = built_cache
    (fingerprint,) = os.listdir(cache)
    old = os.path.join(os.path.dirname(plan.data[0].prefix), "index-cache")
    shutil.copytree(os.path.join(cache, fingerprint), old)
    within(BOUND, build_datasets, plan)
    assert os.listdir(old) == []


def test_loader_thread_failure_ends_the_epoch_and_is_raised(tmp_path):
    class Broken:
        def __len__(self):
            return 8

        def __getitem__(self, index):
            if index == 5:
                raise IndexError("index 99999 is out of bounds for axis 0 with size 40")
            return {"text": np.arange(4, dtype=np.int64)}

    dataset = CheckedDataset(Broken(), "train", sample_tokens=4, cache=str(tmp_path))
    batches = within(BOUND, lambda: list(DataLoader(dataset, batch_size=1, num_workers=0)))  # paddle alone: forever
    assert len(batches) == 5
    with pytest.raises(UserError, match=r"input_dir: reading train sample 5 failed \(IndexError: index 99999"):
        raise_read_error(dataset)
    with pytest.raises(IndexError):  # in the main thread it is raised as it is
        dataset[5]


def test_stale_sidecar_is_ignored_and_the_token_file_scanned(tmp_path, demo_dir):
    prefix = _copy_demo(tmp_path)
    tokens = np.memmap(prefix + ".bin", dtype=np.uint16, mode="r+")
    tokens[1000] = 9000  # rewritten after the sidecar: ids beyond the 8064-row model
    tokens.flush()
    del tokens
    summary = summarize_prefix(prefix, "949,50,1")
    assert summary.max_token_id == 9000
    assert summary.max_token_id_source == "full scan (demo.stats.json ignored: demo.bin was written after it)"
    (problem,) = check_data_source(prefix, "949,50,1", vocab_size=8064, need_valid=False)
    assert "holds token id 9000 but the model has 8064 embedding rows" in problem


def test_sidecar_of_another_token_count_is_ignored(tmp_path, demo_dir):
    prefix = _copy_demo(tmp_path, with_stats=False)
    _first_documents(DEMO_PREFIX, prefix, 100)
    shutil.copyfile(DEMO_PREFIX + ".stats.json", prefix + ".stats.json")  # newer, but of the whole corpus
    source = summarize_prefix(prefix, "949,50,1").max_token_id_source
    assert source.startswith("full scan (demo.stats.json ignored: it counts 2657388 tokens, demo.bin holds")


def test_inconsistent_legacy_pair_is_refused_before_indexing(tmp_path, demo_dir):
    legacy = str(tmp_path / "legacy")
    write_legacy(DEMO_PREFIX, legacy)
    ids = np.load(legacy + "_ids.npy")
    np.save(legacy + "_ids.npy", ids[: len(ids) // 2])  # fewer ids than the index promises
    (problem,) = check_data_source(legacy, "949,50,1", vocab_size=8064, need_valid=False)
    assert problem.startswith(f"input_dir: {legacy}_ids.npy: 1328694 ids") and "the index needs 2657388" in problem


def test_legacy_pair_token_ids_are_checked(tmp_path, demo_dir):
    legacy = str(tmp_path / "legacy")
    write_legacy(DEMO_PREFIX, legacy)
    summary = summarize_prefix(legacy, "949,50,1")
    assert (summary.documents, summary.tokens, summary.dtype) == (2398, 2657388, "int32")
    (problem,) = check_data_source(legacy, "949,50,1", vocab_size=7000, need_valid=False)
    assert "holds token id 7999 but the model has 7000 embedding rows" in problem


def test_input_dir_with_spaces_is_one_folder(tmp_path, demo_dir):
    folder = tmp_path / "my corpus"
    prefix = _copy_demo(folder)
    assert [source.prefix for source in resolve_data_sources(str(folder))] == [prefix]
    assert check_run(_plan(tmp_path, str(folder))) == []


@pytest.mark.parametrize("weight", ["nan", "inf", "-1", "0"])
def test_weight_that_is_not_a_positive_number_is_refused(demo_dir, weight):
    with pytest.raises(UserError, match=rf"input_dir: weight {weight} before .* must be a positive number"):
        resolve_data_sources(f"{weight} {DEMO_PREFIX} 1 {DEMO_PREFIX}")


@pytest.mark.parametrize("suffix", [".bin", ".idx"])
def test_unreadable_data_file_is_one_line(tmp_path, demo_dir, suffix):
    prefix = _copy_demo(tmp_path / "data")
    os.chmod(prefix + suffix, 0)
    args = tiny_args(str(tmp_path / "out"), str(tmp_path / "cache"), "--input_dir", prefix, "--dry_run", "true")
    result = subprocess.run(
        without_root_override(python_script(*args)),
        cwd=REPO,
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=BOUND,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert f"input_dir: cannot read {prefix}{suffix} (Permission denied)" in line, line


def test_unwritable_data_cache_is_refused(tmp_path, demo_dir):
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    target = str(folder) if not os.access(folder, os.W_OK) else "/sys"  # root ignores modes; sysfs refuses files
    plan = _plan(tmp_path, DEMO_DIR, "--data_cache", os.path.join(target, "cache"))
    (problem,) = check_run(plan)
    assert problem.startswith("data_cache: cannot write to") and "choose a writable data_cache" in problem
