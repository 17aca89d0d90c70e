"""Throughput of create_pretraining_data against the tokenizer's own speed, and its peak memory.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/preprocess.py [--repeat 3] [--workers 1 2]

Corpus: the demo corpus (data/demo/corpus.jsonl, 9.4 MB of Shakespeare and the King James Bible)
written ``--repeat`` times into one jsonl (3 x = 28 MB: issue 3 asks for >= 20 MB). Tokenizer:
the demo's LLaMA-style SentencePiece BPE (data/demo/tokenizer) unless --tokenizer_name_or_path.

Reported, per worker count: documents/s, tokens/s, MB/s (input bytes / wall seconds of the whole
pipeline: reading, parsing, tokenizing, writing), and the tokenizer's own batch-encode speed on
the same documents in one process (``encode.encode_batch`` on batches of ``CHUNK_LINES``
documents, parsing excluded). Targets (issue 3): 2 workers >= 1.6 x the 1-worker tokens/s;
1 worker >= 80% of the tokenizer's speed. CPU seconds (all processes) are shown beside wall seconds,
since on shared cores wall-clock scaling depends on the other load. Peak RSS of the command-line tool (os.wait4) on the
1x and the repeated corpus shows whether memory grows with corpus size.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from pretrain.preprocess.encode import encode_batch  # noqa: E402
from pretrain.preprocess.pipeline import CHUNK_LINES, create_pretraining_data  # noqa: E402
from pretrain.tokenizers import load_tokenizer_from  # noqa: E402


def repeat_corpus(source: str, target: str, repeat: int) -> int:
    """Write ``source`` ``repeat`` times into ``target``; return its size in bytes."""
    with open(source, "rb") as f:
        data = f.read()
    with open(target, "wb") as f:
        for _ in range(repeat):
            f.write(data)
    return os.path.getsize(target)


def tokenizer_speed(corpus: str, tokenizer_path: str) -> dict:
    """Documents/s, tokens/s, MB/s of the tokenizer's batch encode alone, one process, same documents."""
    tokenizer = load_tokenizer_from(tokenizer_path)
    documents = tokens = 0
    seconds = cpu = 0.0
    with open(corpus, encoding="utf-8") as f:
        while True:
            batch = [json.loads(line)["text"] for line, _ in zip(f, range(CHUNK_LINES))]
            if not batch:
                break
            start, start_cpu = time.perf_counter(), cpu_seconds()
            ids = encode_batch(tokenizer, batch)
            seconds += time.perf_counter() - start
            cpu += cpu_seconds() - start_cpu
            documents += len(batch)
            tokens += sum(map(len, ids))
    return rates(documents, tokens, os.path.getsize(corpus), seconds, cpu)


def rates(documents: int, tokens: int, input_bytes: int, seconds: float, cpu_seconds: float) -> dict:
    return {
        "documents_per_s": documents / seconds,
        "tokens_per_s": tokens / seconds,
        "mb_per_s": input_bytes / 1e6 / seconds,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
    }


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its reaped children (pool workers) so far."""
    return sum(
        u.ru_utime + u.ru_stime
        for u in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


def pipeline_speed(corpus: str, tokenizer_path: str, workers: int, output_prefix: str) -> dict:
    start, start_cpu = time.perf_counter(), cpu_seconds()
    stats = create_pretraining_data(corpus, tokenizer_path, output_prefix, workers=workers, progress=False)
    return rates(
        stats["documents"],
        stats["tokens"] - stats["documents"],
        stats["input_bytes"],  # EOS excluded
        time.perf_counter() - start,
        cpu_seconds() - start_cpu,
    )


def peak_rss_mib(corpus: str, tokenizer_path: str, output_prefix: str) -> float:
    """Peak resident memory (MiB) of the command-line tool, 1 worker, on ``corpus``."""
    cmd = [
        sys.executable,
        os.path.join(REPO, "tools", "preprocess", "create_pretraining_data.py"),
        "--input",
        corpus,
        "--tokenizer_name_or_path",
        tokenizer_path,
        "--output_prefix",
        output_prefix,
        "--no_progress",
    ]
    env = dict(os.environ, PYTHONPATH=REPO)
    process = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    if status != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed with status {status}")
    return usage.ru_maxrss / 1024  # Linux reports KiB


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=os.path.join(REPO, "data", "demo", "corpus.jsonl"), help="jsonl to repeat.")
    parser.add_argument("--tokenizer_name_or_path", default=os.path.join(REPO, "data", "demo", "tokenizer"))
    parser.add_argument("--repeat", type=int, default=3, help="Copies of the corpus in the benchmark input (count).")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="Worker counts to measure.")
    parser.add_argument("--skip_memory", action="store_true", help="Skip the two peak-memory runs.")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as work:
        corpus = os.path.join(work, "corpus.jsonl")
        size = repeat_corpus(args.corpus, corpus, args.repeat)
        print(
            f"corpus: {args.corpus} x {args.repeat} = {size / 1e6:.1f} MB; tokenizer: {args.tokenizer_name_or_path}; "
            f"{os.cpu_count()} CPU cores"
        )
        rows = {"tokenizer batch encode (1 process)": tokenizer_speed(corpus, args.tokenizer_name_or_path)}
        for workers in args.workers:
            rows[f"create_pretraining_data, {workers} worker(s)"] = pipeline_speed(
                corpus, args.tokenizer_name_or_path, workers, os.path.join(work, f"w{workers}")
            )
        base = rows["tokenizer batch encode (1 process)"]["tokens_per_s"]
        one = rows.get("create_pretraining_data, 1 worker(s)", {}).get("tokens_per_s")
        print(
            f"| {'run':<40} | {'documents/s':>11} | {'tokens/s':>10} | {'MB/s':>6} | {'vs tokenizer':>12} | "
            f"{'vs 1 worker':>11} | {'wall s':>6} | {'CPU s':>6} |"
        )
        print(f"|{'-' * 42}|{'-' * 13}|{'-' * 12}|{'-' * 8}|{'-' * 14}|{'-' * 13}|{'-' * 8}|{'-' * 8}|")
        for name, r in rows.items():
            scaling = f"{r['tokens_per_s'] / one:.2f}x" if one and "worker" in name else ""
            print(
                f"| {name:<40} | {r['documents_per_s']:>11.0f} | {r['tokens_per_s']:>10.0f} | {r['mb_per_s']:>6.2f} | "
                f"{r['tokens_per_s'] / base:>11.0%} | {scaling:>11} | {r['seconds']:>6.1f} | {r['cpu_seconds']:>6.1f} |"
            )
        print(
            "CPU s: user + system seconds of all processes; with other jobs on the cores, wall-clock scaling "
            "understates what more workers give, equal CPU s means no parallel overhead."
        )
        if not args.skip_memory:
            small = peak_rss_mib(args.corpus, args.tokenizer_name_or_path, os.path.join(work, "m1"))
            large = peak_rss_mib(corpus, args.tokenizer_name_or_path, os.path.join(work, "m3"))
            print(
                f"peak RSS, 1 worker: {small:.0f} MiB on {os.path.getsize(args.corpus) / 1e6:.1f} MB, "
                f"{large:.0f} MiB on {size / 1e6:.1f} MB"
            )


if __name__ == "__main__":
    main()
