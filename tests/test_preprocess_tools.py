"""The tools around the token files: merge, inspect --verify, legacy conversion, trans_to_json."""

import importlib.util
import json
import os
import shutil

import numpy as np
import pytest
from conftest import REPO, load_script, pretrain_log_records, run_script

from pretrain.corpus import IndexedWriter, convert_legacy, merge, read_stats
from pretrain.errors import UserError
from pretrain.preprocess import pipeline
from pretrain.preprocess.arguments import PretrainingDataArguments, TextsToJsonArguments
from pretrain.preprocess.raw_text import texts_to_jsonl

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

# The script, loaded as a module to call its main() in this process.
_spec = importlib.util.spec_from_file_location(
    "inspect_data", os.path.join(REPO, "tools", "preprocess", "inspect_data.py")
)
inspect_data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(inspect_data)

DEMO_PREFIX = "demo_text_document"


@pytest.fixture(scope="module")
def parts(demo_dir, tmp_path_factory):
    """The first 60 demo documents tokenized as a whole and as two parts: (folder, whole, part_a, part_b)."""
    folder = tmp_path_factory.mktemp("parts")
    with open(os.path.join(demo_dir, "corpus.jsonl"), "rb") as f:
        lines = [line for line, _ in zip(f, range(60))]
    tokenizer = os.path.join(demo_dir, "tokenizer")
    prefixes = []
    for name, chunk in (("whole", lines), ("part_a", lines[:25]), ("part_b", lines[25:])):
        (folder / f"{name}.jsonl").write_bytes(b"".join(chunk))
        prefix = str(folder / name)
        pipeline.create_pretraining_data(
            PretrainingDataArguments(str(folder / f"{name}.jsonl"), tokenizer, prefix, progress=False)
        )
        prefixes.append(prefix)
    return (folder, *prefixes)


def read_bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_index_is_byte_for_byte_what_paddlenlp_writes(tmp_path, dtype):
    from paddlenlp.data.indexed_dataset import MMapIndexedDataset

    sizes, doc_items = np.array([3, 1, 4, 1, 5], np.int32), np.array([2, 1, 2], np.int32)
    writer = IndexedWriter(str(tmp_path / "ours.bin"), dtype)
    writer.add_documents(np.arange(sizes.sum(), dtype=dtype), sizes, doc_items)
    writer.finalize(str(tmp_path / "ours.idx"))
    with MMapIndexedDataset.Index.writer(str(tmp_path / "theirs.idx"), dtype) as index:
        index.write(sizes.tolist(), [0, 2, 3, 5])
    assert read_bytes(tmp_path / "ours.idx") == read_bytes(tmp_path / "theirs.idx")
    dataset = MMapIndexedDataset(str(tmp_path / "ours"), skip_warmup=True)
    assert [dataset[i].tolist() for i in range(5)] == [[0, 1, 2], [3], [4, 5, 6, 7], [8], [9, 10, 11, 12, 13]]


def test_merge_equals_tokenizing_the_concatenation(parts, tmp_path):
    _, whole, part_a, part_b = parts
    merged = str(tmp_path / "merged")
    merge([part_a, part_b], merged)
    for suffix in (".bin", ".idx"):
        assert read_bytes(merged + suffix) == read_bytes(whole + suffix), suffix
    stats, expected = read_stats(merged), read_stats(whole)
    for key in ("documents", "tokens", "max_token_id", "dtype", "vocab_size", "tokenizer"):
        assert stats[key] == expected[key], key
    assert stats["merged_from"] == [part_a, part_b]


def test_merge_without_every_sidecar_writes_none(parts, tmp_path):
    _, _, part_a, part_b = parts
    for suffix in (".bin", ".idx"):
        shutil.copy(part_b + suffix, tmp_path / f"b{suffix}")
    merge([part_a, str(tmp_path / "b")], str(tmp_path / "merged"))
    assert read_stats(str(tmp_path / "merged")) is None
    assert os.path.isfile(tmp_path / "merged.idx")


def test_merge_refuses_mixed_dtypes(parts, tmp_path):
    folder, _, part_a, _ = parts
    wide = str(tmp_path / "wide")
    pipeline.create_pretraining_data(
        PretrainingDataArguments(
            str(folder / "part_b.jsonl"), read_stats(part_a)["tokenizer"], wide, dtype="int32", progress=False
        )
    )
    with pytest.raises(UserError, match=f"{wide} holds int32 tokens but {part_a} holds uint16"):
        merge([part_a, wide], str(tmp_path / "merged"))
    assert not os.path.exists(tmp_path / "merged.bin") and not os.path.exists(tmp_path / "merged.idx")


def test_merging_a_folder_into_itself_twice_leaves_out_the_output(parts, tmp_path):
    _, whole, part_a, part_b = parts
    folder = tmp_path / "parts"
    folder.mkdir()
    for prefix in (part_a, part_b):
        for suffix in (".bin", ".idx", ".stats.json"):
            shutil.copy(prefix + suffix, folder / (os.path.basename(prefix) + suffix))
    merge_tool, merged = load_script("tools/preprocess/merge.py"), str(folder / "all")
    for _ in range(2):  # the second run finds all.bin/.idx in the folder: not an input
        merge_tool.main(["--inputs", str(folder), "--output_prefix", merged])
        for suffix in (".bin", ".idx"):
            assert read_bytes(merged + suffix) == read_bytes(whole + suffix), suffix
    assert read_stats(merged)["documents"] == 60
    with pytest.raises(UserError, match=f"input {merged} is also --output_prefix"):
        merge_tool.main(["--inputs", str(folder / "part_a"), merged, "--output_prefix", merged])
    assert read_bytes(merged + ".bin") == read_bytes(whole + ".bin")
    with open(folder / "part_b.bin", "r+b") as f:  # a truncated input would shift every later item
        f.truncate(10)
    with pytest.raises(UserError, match="part_b.bin: 10 bytes, the index needs"):
        merge_tool.main(["--inputs", str(folder), "--output_prefix", merged])
    assert read_bytes(merged + ".bin") == read_bytes(whole + ".bin")


def test_inspect_refuses_negative_decode_tokens_and_empty_files_in_one_line(parts, tmp_path):
    _, whole, _, _ = parts
    with pytest.raises(UserError, match=r"--decode_tokens: -5 is out of range \[0, inf\)"):
        inspect_data.main(["--prefix", whole, "--decode_tokens", "-5"])
    for suffix in (".bin", ".idx"):
        (tmp_path / f"empty{suffix}").write_bytes(b"")
    # paddlenlp's reader, built on such a file, also printed two "Exception ignored" tracebacks from __del__
    result = run_script("tools/preprocess/inspect_data.py", "--prefix", str(tmp_path / "empty"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1:] == [
        f"error: {tmp_path}/empty.idx: 0 bytes, shorter than the 34-byte header; "
        "the index is corrupt, truncated or empty: recreate it"
    ]
    assert "Exception ignored" not in result.stderr and "Traceback" not in result.stderr
    shutil.copy(whole + ".idx", tmp_path / "empty.idx")  # a sound index, an empty .bin
    with pytest.raises(UserError, match="empty.bin: 0 bytes, it holds no tokens"):
        inspect_data.main(["--prefix", str(tmp_path / "empty")])


def test_inspect_verify_passes_then_fails_on_truncated_bin(parts, tmp_path, capsys):
    _, whole, _, _ = parts
    for suffix in (".bin", ".idx", ".stats.json"):
        shutil.copy(whole + suffix, tmp_path / f"copy{suffix}")
    copy = str(tmp_path / "copy")
    inspect_data.main(
        [
            "--prefix",
            copy,
            "--verify",
            "--tokenizer_name_or_path",
            read_stats(whole)["tokenizer"],
            "--decode_tokens",
            "8",
        ]
    )
    shown = capsys.readouterr().out
    assert "is consistent" in shown and "documents:    60" in shown and "decoded:" in shown
    with open(copy + ".bin", "r+b") as f:
        f.truncate(os.path.getsize(copy + ".bin") - 2)
    with pytest.raises(UserError, match=f"{copy}.bin: .* bytes, the index needs"):
        inspect_data.main(["--prefix", copy, "--verify"])
    with open(copy + ".idx", "r+b") as f:
        f.truncate(100)
    with pytest.raises(UserError, match=f"{copy}.idx: 100 bytes, expected"):
        inspect_data.main(["--prefix", copy, "--verify"])


def write_legacy(prefix_in: str, legacy: str) -> None:
    """Write the older pair (int32 ids, lens, docs) holding the same corpus as ``prefix_in``.bin/.idx."""
    from paddlenlp.data.indexed_dataset import MMapIndexedDataset

    dataset = MMapIndexedDataset(prefix_in, skip_warmup=True)
    ids = np.frombuffer(dataset._bin_buffer, dtype=dataset._index.dtype)
    np.save(legacy + "_ids.npy", ids.astype(np.int32))
    np.savez(legacy + "_idx.npz", lens=np.asarray(dataset.sizes, np.int32), docs=np.asarray(dataset.doc_idx, np.int64))


def test_legacy_pair_converts_to_the_same_bin_idx(parts, tmp_path):
    _, whole, _, _ = parts
    legacy = str(tmp_path / "legacy")
    write_legacy(whole, legacy)
    convert_legacy(legacy, str(tmp_path / "converted"), None)
    for suffix in (".bin", ".idx"):
        assert read_bytes(str(tmp_path / "converted") + suffix) == read_bytes(whole + suffix), suffix
    np.savez(legacy + "_idx.npz", lens=np.asarray([5, 5], np.int32), docs=np.asarray([0, 2], np.int64))
    with pytest.raises(UserError, match="the index needs 10"):
        convert_legacy(legacy, str(tmp_path / "broken"), None)


@pytest.mark.slow
def test_run_pretrain_trains_on_a_legacy_pair(demo_dir, tmp_path):
    folder = tmp_path / "legacy"
    folder.mkdir()
    write_legacy(os.path.join(demo_dir, DEMO_PREFIX), str(folder / "demo"))
    argv = ["config/llama/pretrain_demo_cpu.json", "--input_dir", str(folder), "--max_steps", "2"]
    argv += [
        "--warmup_steps",
        "1",
        "--do_eval",
        "false",
        "--evaluation_strategy",
        "no",
        "--save_steps",
        "1000",
        "--logging_steps",
        "1",
    ]
    argv += ["--per_device_train_batch_size", "2", "--max_seq_length", "64", "--output_dir", str(tmp_path / "out")]
    with pretrain_log_records() as records:
        summary = load_script("run_pretrain.py").main([*argv, "--data_cache", str(tmp_path / "cache")])
    with open(tmp_path / "out" / "data_build.rank0.log") as f:  # paddlenlp's index-building output
        assert "Using old dataet (.npy & .npz)" in f.read()  # paddlenlp's legacy reader was used
    assert any("(older _ids.npy/_idx.npz format)" in record for record in records)  # the header says so
    assert summary["global_step"] == 2
    assert abs(summary["train_loss_first"] - summary["ln_vocab_size"]) < 1.0  # real tokens into a fresh model


def test_trans_to_json_documents_minimum_and_shuffle(tmp_path):
    raw = tmp_path / "raw"
    (raw / "sub").mkdir(parents=True)
    (raw / "a.txt").write_text("alpha one.\n\nalpha two.\n\n\nalpha three is longer.\n\nx\n")
    (raw / "sub" / "b.txt").write_text("beta paragraph number one.\n\nbeta paragraph two.\n")
    (raw / "skip.md").write_text("not matched")
    summary = texts_to_jsonl(TextsToJsonArguments(str(raw), str(tmp_path / "out.jsonl"), min_doc_chars=15))
    with open(tmp_path / "out.jsonl", encoding="utf-8") as f:
        documents = [json.loads(line)["text"] for line in f]
    assert documents == [
        "alpha one.\n\nalpha two.",
        "alpha three is longer.",
        "beta paragraph number one.",
        "beta paragraph two.",
    ]
    assert summary == {"files": 2, "documents": 4, "dropped_short": 1, "bytes": os.path.getsize(tmp_path / "out.jsonl")}
    texts_to_jsonl(
        TextsToJsonArguments(str(raw), str(tmp_path / "shuffled.jsonl"), min_doc_chars=15, shuffle=True, seed=3)
    )
    with open(tmp_path / "shuffled.jsonl", encoding="utf-8") as f:
        shuffled = [json.loads(line)["text"] for line in f]
    assert sorted(shuffled) == sorted(documents) and shuffled != documents
    assert sorted(os.listdir(tmp_path)) == ["out.jsonl", "raw", "shuffled.jsonl"]
    (raw / "c.txt").write_bytes(b"caf\xe9 latin-1 text")
    with pytest.raises(UserError, match=r"c.txt: not UTF-8 text at byte 3"):
        texts_to_jsonl(TextsToJsonArguments(str(raw), str(tmp_path / "bad.jsonl")))
    assert not os.path.exists(tmp_path / "bad.jsonl")
