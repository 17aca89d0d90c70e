"""create_pretraining_data: round trips with real tokenizers, worker-count invariance, bad input, atomicity."""

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import zstandard
from conftest import REPO, script_env
from paddlenlp.data.indexed_dataset import MMapIndexedDataset
from sentencex import segment

from pretrain.corpus import STATS_KEYS, read_stats
from pretrain.errors import UserError
from pretrain.preprocess import pipeline
from pretrain.preprocess.arguments import PretrainingDataArguments
from pretrain.preprocess.encode import DocumentEncoder
from pretrain.tokenizers import load_tokenizer_from

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

CHINESE = ["今天天气很好。我们去公园散步吧！你觉得怎么样？", "北京是中国的首都。上海是最大的城市。"]
SPECIAL = ["Text with <s> and </s> inside.", "GPT's <|endoftext|> and Qwen's <|im_start|>user\nhi<|im_end|>."]


@pytest.fixture(scope="module")
def demo_texts(demo_dir):
    """The first 40 documents of the demo corpus (Shakespeare and KJV) plus two Chinese ones."""
    with open(os.path.join(demo_dir, "corpus.jsonl"), encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line, _ in zip(f, range(40))]
    return texts + CHINESE


def write_jsonl(path, lines) -> str:
    """Write raw lines (str records are JSON-encoded, bytes are written as they are)."""
    with open(path, "wb") as f:
        for line in lines:
            f.write(
                line if isinstance(line, bytes) else (json.dumps({"text": line}, ensure_ascii=False) + "\n").encode()
            )
    return str(path)


def run(tmp_path, corpus, tokenizer, name="out", **options):
    prefix = str(tmp_path / name)
    args = PretrainingDataArguments(
        input_path=corpus, tokenizer_name_or_path=tokenizer, output_prefix=prefix, progress=False, **options
    )
    return prefix, pipeline.create_pretraining_data(args)


def read_back(prefix) -> list:
    """Every document as one list of ids, read through paddlenlp's dataset."""
    dataset = MMapIndexedDataset(prefix, skip_warmup=True)
    doc_idx = dataset.doc_idx
    return [np.concatenate(dataset[int(doc_idx[d]) : int(doc_idx[d + 1])]).tolist() for d in range(len(doc_idx) - 1)]


def output_files(tmp_path) -> list:
    return sorted(name for name in os.listdir(tmp_path) if not name.endswith((".jsonl", ".gz", ".zst")))


@pytest.mark.parametrize(
    "name, dtype", [("mistral", "uint16"), ("gpt2", "uint16"), ("qwen", "int32"), ("llama3", "int32")]
)
def test_round_trip_equals_tokenizer_encoding_plus_eos(real_tokenizers, demo_texts, tmp_path, name, dtype):
    corpus = write_jsonl(tmp_path / "c.jsonl", demo_texts + SPECIAL)
    prefix, stats = run(tmp_path, corpus, real_tokenizers[name])
    tokenizer = load_tokenizer_from(real_tokenizers[name])
    expected = [
        tokenizer.encode(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in demo_texts
    ]
    # special-token strings are text: what paddlenlp gives once they are split as plain text
    tiktoken_based = name in ("qwen", "llama3")  # their paddlenlp classes split no special token as text
    plain = (
        tokenizer.encode if not tiktoken_based else lambda t, **_: {"input_ids": tokenizer.tokenizer.encode_ordinary(t)}
    )
    expected += [
        plain(t, add_special_tokens=False, split_special_tokens=True)["input_ids"] + [tokenizer.eos_token_id]
        for t in SPECIAL
    ]
    assert read_back(prefix) == expected
    assert all(tokenizer.eos_token_id not in ids[:-1] for ids in expected)
    assert MMapIndexedDataset(prefix, skip_warmup=True)._index.dtype == np.dtype(dtype)
    on_disk = read_stats(prefix)
    assert on_disk == stats and set(STATS_KEYS) <= set(on_disk)
    assert (on_disk["documents"], on_disk["tokens"], on_disk["dtype"]) == (
        len(expected),
        sum(map(len, expected)),
        dtype,
    )
    assert on_disk["max_token_id"] == max(max(ids) for ids in expected)
    assert on_disk["vocab_size"] == len(tokenizer) and on_disk["tokenizer"] == real_tokenizers[name]


def test_one_and_two_workers_write_identical_files(demo_dir, demo_texts, tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "CHUNK_LINES", 5)  # many chunks, so both workers get work
    corpus = write_jsonl(tmp_path / "c.jsonl", demo_texts[:20] + [b"{broken\n", ""] + demo_texts[20:])
    tokenizer = os.path.join(demo_dir, "tokenizer")
    one, _ = run(tmp_path, corpus, tokenizer, "one", workers=1, split_sentences=True)
    two, _ = run(tmp_path, corpus, tokenizer, "two", workers=2, split_sentences=True)
    for suffix in (".bin", ".idx", ".stats.json"):
        with open(one + suffix, "rb") as a, open(two + suffix, "rb") as b:
            assert a.read() == b.read(), suffix


def test_compressed_inputs_and_folders_give_the_same_tokens(demo_dir, demo_texts, tmp_path):
    plain = write_jsonl(tmp_path / "c.jsonl", demo_texts)
    with open(plain, "rb") as f:
        raw = f.read()
    folder = tmp_path / "parts"
    folder.mkdir()
    (folder / "a.jsonl.gz").write_bytes(gzip.compress(raw[: raw.index(b"\n", len(raw) // 2) + 1]))
    (folder / "b.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(raw[raw.index(b"\n", len(raw) // 2) + 1 :])
    )
    tokenizer = os.path.join(demo_dir, "tokenizer")
    reference, _ = run(tmp_path, plain, tokenizer, "plain")
    from_folder, stats = run(tmp_path, str(folder), tokenizer, "folder")
    assert read_back(from_folder) == read_back(reference)
    assert stats["inputs"] == [str(folder / "a.jsonl.gz"), str(folder / "b.jsonl.zst")]
    # progress counts the bytes on disk: for .gz/.zst the compressed bytes, which sum to the file sizes
    chunks = list(pipeline.read_chunks(stats["inputs"]))
    assert sum(c.disk_bytes for c in chunks) == sum(os.path.getsize(p) for p in stats["inputs"])
    assert sum(map(len, (line for c in chunks for line in c.lines))) == len(raw)
    # a .zst of two frames (as concatenating shards gives) is read to the end
    (folder / "a.jsonl.gz").unlink()
    (folder / "b.jsonl.zst").write_bytes(
        b"".join(zstandard.ZstdCompressor().compress(half) for half in (raw[: len(raw) // 2], raw[len(raw) // 2 :]))
    )
    assert read_back(run(tmp_path, str(folder), tokenizer, "frames")[0]) == read_back(reference)


def test_broken_compressed_files_fail_with_one_line_naming_file(demo_dir, demo_texts, tmp_path):
    raw = b"".join(json.dumps({"text": t}).encode() + b"\n" for t in demo_texts)
    packed_gz, packed_zst = gzip.compress(raw), zstandard.ZstdCompressor().compress(raw)
    corrupt = bytearray(packed_gz)
    corrupt[len(corrupt) // 2] ^= 0xFF
    broken = {
        "truncated.jsonl.gz": (
            packed_gz[: len(packed_gz) // 2],
            r"cannot read gzip data after line \d+ \(Compressed file",
        ),
        "text.jsonl.gz": (raw, r"cannot read gzip data after line 0 \(Not a gzipped file"),
        "corrupt.jsonl.gz": (bytes(corrupt), r"cannot read gzip data after line \d+"),
        "corrupt.jsonl.zst": (
            b"not zstd" * 100,
            r"cannot read zstd data after line 0 \(zstd decompressor error: Unknown frame",
        ),
        "truncated.jsonl.zst": (
            packed_zst[: len(packed_zst) // 2],
            r"cannot read zstd data after line \d+ \(the file ends inside a zstd frame",
        ),
    }
    tokenizer = os.path.join(demo_dir, "tokenizer")
    for name, (data, message) in broken.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(UserError, match=f"{tmp_path / name}: {message}.*; the file is truncated, corrupt"):
            run(tmp_path, str(tmp_path / name), tokenizer, "out", on_bad_line="skip")
        assert not [f for f in output_files(tmp_path) if f.startswith("out")]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_removes_partial_outputs_and_stops_workers(demo_dir, tmp_path, signum):
    with open(os.path.join(demo_dir, "corpus.jsonl"), "rb") as f:
        (tmp_path / "c.jsonl").write_bytes(f.read() * 4)  # 38 MB: some seconds of work
    cmd = [
        sys.executable,
        os.path.join(REPO, "tools", "preprocess", "create_pretraining_data.py"),
        *("--input_path", str(tmp_path / "c.jsonl"), "--output_prefix", str(tmp_path / "out")),
        *("--tokenizer_name_or_path", os.path.join(demo_dir, "tokenizer"), "--workers", "2", "--no_progress"),
    ]
    process = subprocess.Popen(cmd, env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    partial = tmp_path / f"out.bin.partial.{socket.gethostname()}.{process.pid}"
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(f"/proc/{process.pid}/task/{process.pid}/children") as f:
        workers = [int(pid) for pid in f.read().split()]
    assert len(workers) == 2, "the run ended before the signal"
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signum
    assert (
        stderr.strip()
        == f"error: stopped by {signal.Signals(signum).name}; partial outputs were removed, nothing was written"
    )
    assert sorted(os.listdir(tmp_path)) == ["c.jsonl"]
    assert not [pid for pid in workers if os.path.exists(f"/proc/{pid}")]


BAD_LINES = {
    "bad_json": b'{"text": "unterminated\n',
    "missing_key": json.dumps({"body": "text under another key"}).encode() + b"\n",
    "not_utf8": b'{"text": "caf\xe9"}\n',
    "lone_surrogate": b'{"text": "half a pair: \\ud800 of an emoji"}\n',  # valid JSON, no valid Unicode
    "empty": json.dumps({"text": "  \n "}).encode() + b"\n",
}


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
def test_bad_line_is_skipped_and_counted_or_fails_with_file_and_line(demo_dir, tmp_path, kind):
    corpus = write_jsonl(tmp_path / "c.jsonl", ["First good document.", BAD_LINES[kind], "Second good document."])
    tokenizer = os.path.join(demo_dir, "tokenizer")
    prefix, stats = run(tmp_path, corpus, tokenizer, on_bad_line="skip")
    assert stats["documents"] == 2
    assert stats["skipped"] == {k: int(k == kind) for k in BAD_LINES}
    assert len(read_back(prefix)) == 2
    with pytest.raises(UserError, match=f"{corpus}:2: .*; fix the line or pass --on_bad_line skip$"):
        run(tmp_path, corpus, tokenizer, "failed", on_bad_line="fail")
    assert not [name for name in output_files(tmp_path) if name.startswith("failed")]


def test_lone_surrogate_is_a_bad_line_for_every_tokenizer(real_tokenizers, tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", ["Good.", BAD_LINES["lone_surrogate"], "Also good \U0001f600."])
    for name, folder in real_tokenizers.items():
        _, stats = run(tmp_path, corpus, folder, name)
        assert (stats["documents"], stats["skipped"]["lone_surrogate"]) == (2, 1), name


def test_token_id_beyond_dtype_is_an_error_not_a_wrap(real_tokenizers, tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", ["plain ascii", CHINESE[0]])  # Chinese ids of Qwen exceed 65535
    with pytest.raises(UserError, match=rf"{corpus}:2: token id \d+ does not fit uint16.*--dtype int32"):
        run(tmp_path, corpus, real_tokenizers["qwen"], dtype="uint16", append_eos=False)
    assert output_files(tmp_path) == []


def test_interrupted_run_leaves_no_output(demo_dir, demo_texts, tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "CHUNK_LINES", 4)
    encode = DocumentEncoder.encode
    calls = []

    def interrupted(self, chunk):
        calls.append(chunk)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return encode(self, chunk)

    monkeypatch.setattr(DocumentEncoder, "encode", interrupted)
    corpus = write_jsonl(tmp_path / "c.jsonl", demo_texts)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, corpus, os.path.join(demo_dir, "tokenizer"))
    assert output_files(tmp_path) == []


def test_sentence_split_eos_max_doc_num(demo_dir, tmp_path):
    english = "Mr. Smith went to Washington. He arrived at 3 p.m. on Jan. 5! Did he stay? Yes."
    corpus = write_jsonl(tmp_path / "c.jsonl", [english, CHINESE[0], "A third document."])
    tokenizer_dir = os.path.join(demo_dir, "tokenizer")
    tokenizer = load_tokenizer_from(tokenizer_dir)
    for document, language, text, count in ((0, "en", english, 4), (1, "zh", CHINESE[0], 3)):
        prefix, stats = run(
            tmp_path,
            corpus,
            tokenizer_dir,
            language,
            split_sentences=True,
            language=language,
            append_eos=False,
            max_doc_num=2,
        )
        sentences = [s.strip() for s in segment(language, text)]
        assert len(sentences) == count and stats["documents"] == 2
        dataset = MMapIndexedDataset(prefix, skip_warmup=True)
        items = dataset[int(dataset.doc_idx[document]) : int(dataset.doc_idx[document + 1])]
        assert [ids.tolist() for ids in items] == [
            tokenizer.encode(s, add_special_tokens=False)["input_ids"] for s in sentences
        ]


def test_max_repeated_len_collapses_runs_as_paddlenlp_does(demo_dir, tmp_path):
    tokenizer = load_tokenizer_from(os.path.join(demo_dir, "tokenizer"))
    corpus = write_jsonl(tmp_path / "c.jsonl", ["a" * 150 + " then " + "-" * 5 + "\n" * 300 + "end"])
    prefix, _ = run(tmp_path, corpus, os.path.join(demo_dir, "tokenizer"), max_repeated_len=100, append_eos=False)
    # PaddleNLP: re.sub(r"(.)\1{100,}", r"\1", text): 101 or more of one character become one; newlines stay
    expected = "a then " + "-" * 5 + "\n" * 300 + "end"
    assert read_back(prefix) == [tokenizer.encode(expected, add_special_tokens=False)["input_ids"]]


def test_input_errors_name_the_fix(demo_dir, tmp_path):
    tokenizer = os.path.join(demo_dir, "tokenizer")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UserError, match="unsupported file type"):
        run(tmp_path, str(tmp_path / "notes.txt"), tokenizer)
    with pytest.raises(UserError, match="holds no .jsonl"):
        run(tmp_path, str(tmp_path), tokenizer)
    corpus = write_jsonl(tmp_path / "c.jsonl", [b"\n", json.dumps({"text": ""}).encode() + b"\n"])
    with pytest.raises(UserError, match="no document with text under 'text'"):
        run(tmp_path, corpus, tokenizer)
    assert output_files(tmp_path) == ["notes.txt"]
