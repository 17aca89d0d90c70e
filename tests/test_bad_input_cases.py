"""Bad input: each case ends in a clear one-line error naming the key or file (or, for a corrupt
checkpoint, a warning and a fall-back), and nothing is lost or half-written."""

import json
import os
import stat
from contextlib import ExitStack
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import DEMO_DIR, pretrain_log_records, resolve_plan
from paddlenlp.data.indexed_dataset import make_builder
from tiny_run import launch_command, run, tiny_args, tmpfs_disk

from pretrain import checkpoint
from pretrain.arguments import parse_arguments
from pretrain.data import build_datasets
from pretrain.errors import UserError
from pretrain.preflight import check_run, raise_problems

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

DEMO_PREFIX = os.path.join(DEMO_DIR, "demo_text_document")


def preflight_error(tmp_path, *extra: str) -> str:
    """The preflight's UserError text for the tiny run with ``extra`` overrides ('' when it passes)."""
    plan = resolve_plan(tiny_args(str(tmp_path / "out"), str(tmp_path / "cache"), *extra))
    try:
        raise_problems(check_run(plan))
    except UserError as error:
        return str(error)
    return ""


def _problem_lines(message: str) -> list:
    """The problems of a preflight error: the message itself when it is one, else its "  - " lines."""
    lines = message.splitlines()
    return lines if len(lines) == 1 else [line[4:] for line in lines if line.startswith("  - ")]


def _copy_demo(tmp_path, idx_bytes: int = None, bin_bytes: int = None) -> str:
    """A copy of the demo .bin/.idx in tmp_path/data, optionally cut to the given sizes; returns the folder."""
    folder = tmp_path / "data"
    folder.mkdir()
    for suffix, size in ((".bin", bin_bytes), (".idx", idx_bytes)):
        with open(DEMO_PREFIX + suffix, "rb") as f:
            data = f.read() if size is None else f.read(size)
        (folder / ("demo" + suffix)).write_bytes(data)
    return str(folder)


def test_good_input_passes(tmp_path, demo_dir):
    assert preflight_error(tmp_path) == ""


def test_truncated_idx(tmp_path, demo_dir):
    folder = _copy_demo(tmp_path, idx_bytes=os.path.getsize(DEMO_PREFIX + ".idx") // 2)
    (line,) = _problem_lines(preflight_error(tmp_path, "--input_dir", folder))
    assert "demo.idx: 24001 bytes, expected 48002 for 2398 items" in line and "create_pretraining_data.py" in line
    assert not os.path.exists(tmp_path / "cache")  # failed before any indexing


def test_bin_shorter_than_its_index(tmp_path, demo_dir):
    folder = _copy_demo(tmp_path, bin_bytes=1000)
    (line,) = _problem_lines(preflight_error(tmp_path, "--input_dir", folder))
    assert "demo.bin: 1000 bytes, the index needs" in line


def test_token_ids_beyond_the_model_vocabulary(tmp_path, demo_dir):
    # int32 data from a 100k-vocabulary tokenizer, fed to the demo model (8064 embedding rows).
    folder = tmp_path / "data"
    folder.mkdir()
    builder = make_builder(str(folder / "big.bin"), impl="mmap", save_dtype=np.int32)
    for document in ([5, 70000, 9, 2], [11, 99999, 2]):
        builder.add_item(np.array(document, dtype=np.int64))
        builder.end_document()
    builder.finalize(str(folder / "big.idx"))
    (line,) = _problem_lines(preflight_error(tmp_path, "--input_dir", str(folder), "--split", "1,1,0"))
    assert line.startswith("vocab_size:") and "(int32) holds token id 99999" in line and "8064" in line


def test_empty_split(tmp_path, demo_dir):
    (line,) = _problem_lines(preflight_error(tmp_path, "--split", "100,0,0", "--do_eval", "true"))
    assert line.startswith("split: '100,0,0' leaves the validation split") and "do_eval false" in line


def test_json_value_of_the_wrong_type(tmp_path, demo_dir):
    config = tmp_path / "bad.json"
    config.write_text(json.dumps({"model_name_or_path": "x", "input_dir": "y", "max_steps": "ten"}))
    with pytest.raises(UserError, match=r"bad.json: key 'max_steps' = 'ten' is not a valid int"):
        parse_arguments([str(config)])


@pytest.mark.slow
def test_degree_product_not_dividing_world_size(tmp_path, demo_dir):
    # Checked while parsing (pretrain.layout.check_degrees_divide_the_cards), before paddlenlp's assertion.
    logs = str(tmp_path / "logs")
    command = launch_command(2, logs) + tiny_args(
        str(tmp_path / "out"), str(tmp_path / "cache"), "--tensor_parallel_degree", "3", "--dry_run", "true"
    )
    assert run(command, log_path=str(tmp_path / "launch.log"), timeout=120) != 0
    # Both ranks refuse; the launcher ends the other rank as soon as one exits, sometimes before it has written
    # its line (seen in CI: rank 1 first, workerlog.0 empty), so the line is looked for in every rank's log.
    errors = set()
    for rank in (0, 1):
        with open(os.path.join(logs, f"workerlog.{rank}"), encoding="utf-8") as f:
            errors |= {line for line in f if line.startswith("error: ")}
    assert errors == {
        "error: tensor_parallel_degree 3 splits each model replica over 3 cards, which do not divide the 2 cards of "
        "the launch; launch on a multiple of 3 cards (e.g. 3) or choose degrees whose product divides 2\n"
    }
    assert not os.path.exists(tmp_path / "cache")


def test_problems_are_collected_one_line_each(tmp_path, demo_dir):
    lines = _problem_lines(
        preflight_error(
            tmp_path,
            "--use_flash_attention",
            "true",
            "--fp16",
            "true",
            "--max_seq_length",
            "2048",
            "--split",
            "100,0,0",
            "--do_eval",
            "true",
        )
    )
    keys = [line.split(":")[0] for line in lines]
    assert keys == ["use_flash_attention", "fp16", "max_seq_length", "split"], lines


def _unwritable_dir(tmp_path) -> str:
    """A folder this process cannot create files in: chmod 555, or (as root, who ignores modes) /sys."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    if not os.access(folder, os.W_OK) and os.geteuid() != 0:
        return str(folder)
    if os.path.isdir("/sys") and not os.path.exists("/sys/pretrain-test"):
        return "/sys"  # sysfs refuses new files even to root
    pytest.skip("no folder here refuses writes to this user")


def test_read_only_output_dir(tmp_path, demo_dir):
    output_dir = os.path.join(_unwritable_dir(tmp_path), "run")
    (line,) = _problem_lines(preflight_error(tmp_path, "--output_dir", output_dir))
    assert line.startswith("output_dir: cannot write to") and "choose a writable output_dir" in line
    assert not os.path.exists(output_dir)


def _fake_checkpoint(output_dir, step: int, complete: bool = True) -> str:
    folder = os.path.join(output_dir, f"checkpoint-{step}")
    os.makedirs(folder)
    for name in ("model_state.pdparams", "optimizer.pdopt", "trainer_state.json"):
        with open(os.path.join(folder, name), "wb") as f:
            f.write(os.urandom(1000))
    if complete:
        checkpoint.mark_complete(folder, step)
    return folder


def _resume_args(output_dir: str) -> SimpleNamespace:
    """What resolve_resume_checkpoint reads of the training arguments, for a plain restart in one process."""
    return SimpleNamespace(
        output_dir=output_dir, resume_from_checkpoint=None, overwrite_output_dir=False, local_process_index=0
    )


def test_corrupt_checkpoint_falls_back_to_the_previous_one(tmp_path):
    output_dir = str(tmp_path)
    previous = _fake_checkpoint(output_dir, 3)
    corrupt = _fake_checkpoint(output_dir, 6)
    with open(os.path.join(corrupt, "optimizer.pdopt"), "r+b") as f:
        f.truncate(10)  # disk trouble after the save
    _fake_checkpoint(output_dir, 9, complete=False)  # killed while saving
    with pretrain_log_records() as warnings:
        assert checkpoint.resolve_resume_checkpoint(_resume_args(output_dir)) == previous
    assert len(warnings) == 2
    assert "checkpoint-9: it has no checkpoint_complete.json" in warnings[0]
    assert "checkpoint-6: optimizer.pdopt is 10 bytes, the marker says 1000" in warnings[1]
    assert os.path.isdir(corrupt)  # nothing deleted by looking


def test_explicit_incomplete_resume_checkpoint_is_refused(tmp_path, demo_dir):
    incomplete = _fake_checkpoint(str(tmp_path / "out"), 9, complete=False)
    (line,) = _problem_lines(preflight_error(tmp_path, "--resume_from_checkpoint", incomplete))
    assert "resume_from_checkpoint:" in line and "no checkpoint_complete.json" in line


def test_rotation_keeps_complete_checkpoints_only(tmp_path):
    output_dir = str(tmp_path)
    for step in (3, 6):
        _fake_checkpoint(output_dir, step)
    _fake_checkpoint(output_dir, 7, complete=False)  # a stale leftover older than the newest complete one
    _fake_checkpoint(output_dir, 9)
    _fake_checkpoint(output_dir, 12, complete=False)  # an earlier attempt's, beyond the step just saved
    checkpoint.rotate(output_dir, save_total_limit=2, saved_step=9)
    assert [step for step, _ in checkpoint.list_checkpoints(output_dir)] == [6, 9, 12]


def test_rotation_never_counts_checkpoints_beyond_the_step_just_saved(tmp_path):
    # checkpoint-8 was skipped at resume (same-size corruption), the run resumed from 6 and has saved 7:
    # with save_total_limit 1, counting 8 would delete 7, the only good checkpoint left.
    output_dir = str(tmp_path)
    for step in (6, 7, 8):
        _fake_checkpoint(output_dir, step)
    checkpoint.rotate(output_dir, save_total_limit=1, saved_step=7)
    assert [step for step, _ in checkpoint.list_checkpoints(output_dir)] == [7, 8]


@pytest.mark.parametrize(
    "extra, expected",
    [
        (("--num_attention_heads", "5"), "num_attention_heads: 5 does not divide hidden_size 64"),
        (("--num_key_value_heads", "3"), "num_key_value_heads: 3 does not divide num_attention_heads 4"),
        (("--do_eval", "true", "--eval_iters", "0"), "eval_iters: 0 must be >= 1 with do_eval"),
        (("--save_steps", "0"), "save_steps: 0 saves no checkpoint"),
        (("--use_async_save", "true"), "use_async_save: asynchronous checkpoint writes are not supported"),
    ],
)
def test_values_that_would_fail_late_are_refused_first(tmp_path, demo_dir, extra, expected):
    (line,) = _problem_lines(preflight_error(tmp_path, *extra))
    assert line.startswith(expected), line
    assert not os.path.exists(tmp_path / "cache")


def test_json_key_given_twice_is_refused(tmp_path):
    config = tmp_path / "twice.json"
    config.write_text('{"model_name_or_path": "llama-debug", "input_dir": "x", "max_steps": 10, "max_steps": 20}')
    with pytest.raises(UserError, match=r"twice.json: key 'max_steps' is given twice; keep one of them"):
        parse_arguments([str(config)])


def test_config_that_is_a_folder_is_refused(tmp_path):
    folder = tmp_path / "run.json"
    folder.mkdir()
    with pytest.raises(UserError, match=r"config file .*run.json is a folder; pass a JSON file"):
        parse_arguments([str(folder)])


@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(kib)``: the mount point of a tmpfs of that size, for the test's duration."""
    with ExitStack() as stack:
        yield lambda kib: stack.enter_context(tmpfs_disk(str(tmp_path / f"disk{kib}"), kib))


def test_disk_that_holds_one_checkpoint_but_not_rotation_is_refused(tmp_path, demo_dir, small_disk):
    # The tiny model's checkpoint is about 13 MB; save_total_limit 2 keeps 3 on disk while the newest is written.
    disk = small_disk(32 * 1024)
    (line,) = _problem_lines(preflight_error(tmp_path, "--output_dir", os.path.join(disk, "out")))
    assert line.startswith("output_dir: 3 checkpoints on disk at once need about 0.04 GiB") and "0.03 GiB free" in line
    assert preflight_error(tmp_path, "--output_dir", os.path.join(disk, "out"), "--save_total_limit", "1") == ""


def test_full_data_cache_is_refused(tmp_path, demo_dir, small_disk):
    disk = small_disk(1024)
    (line,) = _problem_lines(
        preflight_error(tmp_path, "--data_cache", os.path.join(disk, "cache"), "--max_steps", "100000")
    )
    assert line.startswith("data_cache: the sample index needs about") and "point data_cache at a bigger disk" in line


def test_disk_full_while_writing_the_index_cache_is_one_line(tmp_path, demo_dir, small_disk):
    # No preflight here: the disk fills up while paddlenlp writes (paddlenlp prints the failure and goes on).
    disk = small_disk(64)
    plan = resolve_plan(tiny_args(str(tmp_path / "out"), os.path.join(disk, "cache"), "--max_steps", "1000"))
    with pytest.raises(UserError, match=r"data_cache: writing or reading the sample index in .* failed \(") as error:
        build_datasets(plan)
    assert "\n" not in str(error.value)


def test_index_cache_changed_in_place_is_rebuilt_and_said_on_the_console(tmp_path, demo_dir, capfd):
    from pretrain.log import captured_stdout

    plan = resolve_plan(tiny_args(str(tmp_path / "out"), str(tmp_path / "cache")))
    build_datasets(plan)
    shuffle = sorted((tmp_path / "cache").glob("*/*_shuffle_idx.npy"))[0]
    built = np.load(shuffle)
    swapped = built.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # every entry still in range: only the checksum tells
    np.save(shuffle, swapped)
    capfd.readouterr()
    with captured_stdout(str(tmp_path / "out" / "data_build.rank0.log")):  # as run_pretrain.py builds
        build_datasets(plan)
    console = capfd.readouterr().out
    assert f"is damaged ({shuffle.name}: its CRC-32C is not the" in console and "rebuilding it" in console
    assert np.array_equal(np.load(shuffle), built)
    assert "CRC-32C " + shuffle.name in shuffle.with_name(shuffle.name.split("_")[0] + ".dsc").read_text()
