"""create_pretraining_data on Parquet and Arrow input: byte-identical to the jsonl path for any worker
count and any text column type (string, dictionary-encoded, string_view), and one-line errors for a
missing column, a non-text column and a corrupt file."""

import json
import os

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_script

from pretrain.preprocess import pipeline
from pretrain.preprocess.arguments import PretrainingDataArguments

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

SCRIPT = "tools/preprocess/create_pretraining_data.py"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, demo_dir):
    """The demo corpus as jsonl (its first 600 documents), as two Parquet files in a folder (row groups
    of 100 rows, an id column first), as the folder ``datasets``' ``save_to_disk`` writes (an Arrow
    stream file beside two .json files), as an Arrow IPC file (random-access format) and as Parquet and
    Arrow files whose text column is dictionary-encoded or ``string_view``."""
    folder = tmp_path_factory.mktemp("columnar")
    with open(os.path.join(demo_dir, "corpus.jsonl"), encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line, _ in zip(f, range(600))]
    jsonl = folder / "corpus.jsonl"
    jsonl.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    tables = folder / "tables"
    tables.mkdir()
    for part, rows in enumerate((texts[:250], texts[250:])):  # read in sorted path order
        table = pa.table({"id": list(range(len(rows))), "content": rows})
        pq.write_table(table, tables / f"part-{part}.parquet", row_group_size=100)
    saved = folder / "saved"
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(saved))
    arrow = folder / "corpus.arrow"
    with pa.OSFile(str(arrow), "wb") as sink, pa.ipc.new_file(sink, pa.schema([("text", pa.string())])) as writer:
        for start in range(0, len(texts), 64):
            writer.write_table(pa.table({"text": texts[start : start + 64]}))
    encoded = folder / "encoded"  # part-0: dictionary<string>, part-1: string_view, part-2: Arrow string_view
    encoded.mkdir()
    pq.write_table(pa.table({"text": pa.array(texts[:300]).dictionary_encode()}), encoded / "part-0.parquet")
    pq.write_table(pa.table({"text": pa.array(texts[300:500], pa.string_view())}), encoded / "part-1.parquet")
    views = pa.table({"text": pa.array(texts[500:], pa.string_view())})
    with pa.OSFile(str(encoded / "part-2.arrow"), "wb") as sink, pa.ipc.new_file(sink, views.schema) as writer:
        writer.write_table(views)
    assert [pq.read_schema(encoded / f"part-{part}.parquet").field("text").type for part in (0, 1)] == [
        pa.dictionary(pa.int32(), pa.string()),
        pa.string_view(),
    ]
    return {
        "jsonl": str(jsonl),
        "parquet": str(tables),
        "saved": str(saved),
        "arrow": str(arrow),
        "encoded": str(encoded),
        "folder": folder,
    }


def _tokenize(corpus, source, prefix, demo_dir, **options) -> bytes:
    args = PretrainingDataArguments(
        input_path=corpus[source],
        tokenizer_name_or_path=os.path.join(demo_dir, "tokenizer"),
        output_prefix=str(corpus["folder"] / prefix),
        progress=False,
        **options,
    )
    stats = pipeline.create_pretraining_data(args)
    assert stats["documents"] == 600
    with open(args.output_prefix + ".bin", "rb") as f, open(args.output_prefix + ".idx", "rb") as g:
        return f.read() + g.read()


def test_parquet_and_arrow_write_what_jsonl_writes_for_any_worker_count(corpus, demo_dir):
    reference = _tokenize(corpus, "jsonl", "jsonl", demo_dir)
    assert _tokenize(corpus, "parquet", "parquet1", demo_dir, json_key="content") == reference
    assert _tokenize(corpus, "parquet", "parquet2", demo_dir, json_key="content", workers=2) == reference
    assert _tokenize(corpus, "saved", "saved2", demo_dir, workers=2) == reference
    assert _tokenize(corpus, "arrow", "arrow1", demo_dir) == reference


def test_dictionary_encoded_and_string_view_columns_are_text(corpus, demo_dir):
    reference = _tokenize(corpus, "jsonl", "jsonl_again", demo_dir)
    assert _tokenize(corpus, "encoded", "encoded1", demo_dir) == reference


def _error(corpus, demo_dir, path, *extra) -> str:
    result = run_script(
        SCRIPT,
        "--input",
        str(path),
        "--model_name",
        os.path.join(demo_dir, "tokenizer"),
        "--output_prefix",
        str(corpus["folder"] / "bad" / "out"),
        "--no_progress",
        *extra,
    )
    assert result.returncode == 2
    assert not os.path.exists(corpus["folder"] / "bad" / "out.bin")
    (line,) = result.stderr.strip().splitlines()
    return line


def test_a_missing_column_a_non_text_column_and_a_corrupt_file_are_one_line(corpus, demo_dir):
    part = os.path.join(corpus["parquet"], "part-0.parquet")
    assert _error(corpus, demo_dir, part) == (
        f"error: {part}: no column 'text' (columns: id, content); pass --json_key with the column holding the text"
    )
    assert _error(corpus, demo_dir, part, "--json_key", "id") == (
        f"error: {part}: column 'id' holds int64, not text; pass --json_key with the column holding the text"
    )
    corrupt = corpus["folder"] / "corrupt.parquet"
    with open(part, "rb") as f:
        data = f.read()
    corrupt.write_bytes(data[: len(data) // 2])  # cut short: no footer
    line = _error(corpus, demo_dir, corrupt, "--json_key", "content")
    assert line.startswith(f"error: {corrupt}: cannot read parquet data (")
    assert line.endswith("the file is truncated, corrupt or not parquet: re-create it")
    damaged = corpus["folder"] / "damaged.parquet"  # the footer intact, a data page overwritten
    damaged.write_bytes(data[:4] + b"\xff" * 2000 + data[2004:])
    line = _error(corpus, demo_dir, damaged, "--json_key", "content")
    assert line.startswith(f"error: {damaged}: cannot read parquet data (")
