"""jsonl corpus -> ``<prefix>.bin/.idx/.stats.json``: streaming, ordered, multi-process tokenization.

The main process reads the inputs line by line into chunks (``CHUNK_LINES`` lines or
``CHUNK_BYTES`` bytes of one file), workers tokenize chunks (``encode.encode_chunk``), and the main
process writes the results in input order. At most ``IN_FLIGHT_PER_WORKER`` chunks per worker are
pending, so memory does not grow with the corpus; and since every chunk is encoded the same way
wherever it runs, any number of workers writes byte-identical files.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import time
from typing import Iterator, Optional

import numpy as np
from tqdm import tqdm

from pretrain.errors import UserError
from pretrain.log import logger
from pretrain.preprocess.encode import Chunk, DocumentEncoder, EncodedChunk, encode_chunk, init_worker
from pretrain.preprocess.indexed import (
    DTYPES,
    IndexedWriter,
    check_token_range,
    indexed_outputs,
    token_dtype,
    write_stats,
)
from pretrain.preprocess.jsonl import BAD_LINE_KINDS, describe_bad_line, input_files, open_binary
from pretrain.tokenizers import load_tokenizer_from

CHUNK_LINES = 256
CHUNK_BYTES = 1 << 20
IN_FLIGHT_PER_WORKER = 4
BAD_LINES_LISTED = 10  # bad lines named one by one in the summary; the rest are counted


def read_chunks(files: list) -> Iterator[Chunk]:
    """Consecutive lines of each file, ``CHUNK_LINES`` lines or ``CHUNK_BYTES`` bytes at most per chunk."""
    for file_index, path in enumerate(files):
        with open_binary(path) as f:
            lines, size, first_line = [], 0, 1
            for line_number, raw in enumerate(f, start=1):
                lines.append(raw)
                size += len(raw)
                if len(lines) >= CHUNK_LINES or size >= CHUNK_BYTES:
                    yield Chunk(file_index, first_line, lines)
                    lines, size, first_line = [], 0, line_number + 1
            if lines:
                yield Chunk(file_index, first_line, lines)


def _encoded_in_order(chunks: Iterator[Chunk], workers: int, encoder_args: tuple, tokenizer) -> Iterator[EncodedChunk]:
    """Encode chunks in input order: in this process for 1 worker, else in a pool with a bounded window."""
    if workers == 1:
        encoder = DocumentEncoder(tokenizer, *encoder_args[1:])  # init_worker's arguments, tokenizer already loaded
        yield from map(encoder.encode, chunks)
        return
    with multiprocessing.get_context("fork").Pool(workers, initializer=init_worker, initargs=encoder_args) as pool:
        pending = collections.deque()
        for chunk in chunks:
            pending.append(pool.apply_async(encode_chunk, (chunk,)))
            if len(pending) >= workers * IN_FLIGHT_PER_WORKER:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _truncate(result: EncodedChunk, documents: int) -> EncodedChunk:
    """The first ``documents`` documents of a chunk (for --max_doc_num)."""
    items = int(result.doc_items[:documents].sum())
    last_line = int(result.doc_lines[documents - 1]) if documents else 0
    return result._replace(
        tokens=result.tokens[: int(result.item_sizes[:items].sum())],
        item_sizes=result.item_sizes[:items],
        doc_items=result.doc_items[:documents],
        doc_lines=result.doc_lines[:documents],
        bad_lines=[(line, kind) for line, kind in result.bad_lines if line < last_line],
        out_of_range=result.out_of_range if result.out_of_range and result.out_of_range[0] <= last_line else None,
    )


def create_pretraining_data(
    input_path: str,
    tokenizer_name_or_path: str,
    output_prefix: str,
    json_key: str = "text",
    append_eos: bool = True,
    split_sentences: bool = False,
    language: str = "en",
    workers: int = 1,
    max_doc_num: Optional[int] = None,
    on_bad_line: str = "skip",
    dtype: Optional[str] = None,
    progress: bool = True,
) -> dict:
    """Tokenize the jsonl corpus ``input_path`` into ``output_prefix``.bin/.idx/.stats.json.

    Args:
        input_path: a ``.jsonl``/``.jsonl.gz``/``.jsonl.zst`` file or a folder of them.
        tokenizer_name_or_path: local tokenizer folder (see ``pretrain.tokenizers``).
        append_eos: end every document with the tokenizer's EOS id.
        split_sentences: one item per sentence (``language``: sentencex code, e.g. en, zh).
        workers: tokenizing processes.
        max_doc_num: stop after this many documents (None: all).
        on_bad_line: ``skip`` (count and report) or ``fail`` (stop at the first) for lines that are
            not UTF-8, not JSON, lack ``json_key``, or hold an empty document.
        dtype: ``uint16`` or ``int32``; None picks uint16 when the vocabulary fits in 16 bits.

    Returns:
        The stats written to ``<prefix>.stats.json`` (documents, items, tokens, max_token_id, dtype,
        vocab_size, tokenizer, skipped counts by kind, input bytes, ...).

    Raises:
        UserError: bad input under ``fail``; a token id that does not fit the dtype; no document;
            no EOS token while ``append_eos``; or a bad input path / tokenizer folder. No output
            file is left behind then.
    """
    if workers < 1:
        raise UserError(f"--workers {workers}: must be at least 1")
    if on_bad_line not in ("skip", "fail"):
        raise UserError(f"--on_bad_line {on_bad_line}: choose skip or fail")
    files = input_files(input_path)
    tokenizer = load_tokenizer_from(tokenizer_name_or_path)
    vocab_size = len(tokenizer)
    out_dtype = DTYPES[dtype] if dtype else token_dtype(vocab_size)
    eos_token_id = tokenizer.eos_token_id if append_eos else None
    if append_eos and eos_token_id is None:
        raise UserError(
            f"{tokenizer_name_or_path}: the tokenizer defines no eos_token; set eos_token in its tokenizer_config.json "
            "or pass --no-append_eos"
        )
    language_code = language if split_sentences else None
    encoder_args = (tokenizer_name_or_path, json_key, eos_token_id, language_code, out_dtype)
    input_bytes = sum(os.path.getsize(path) for path in files)
    compressed = any(path.endswith((".gz", ".zst")) for path in files)

    skipped = collections.Counter()
    listed = []
    largest = -1
    start = time.perf_counter()
    bar = tqdm(
        total=None if compressed else input_bytes,
        unit="B",
        unit_scale=True,
        desc="tokenizing",
        disable=not progress,
        mininterval=1.0,
    )
    with indexed_outputs(output_prefix) as (tmp_bin, tmp_idx, tmp_stats):
        writer = IndexedWriter(tmp_bin, out_dtype)
        read = 0
        results = _encoded_in_order(read_chunks(files), workers, encoder_args, tokenizer)
        try:
            for result in results:
                path = files[result.file_index]
                if max_doc_num is not None and writer.documents + len(result.doc_items) >= max_doc_num:
                    result = _truncate(result, max_doc_num - writer.documents)
                if result.out_of_range is not None:
                    line, token_id = result.out_of_range
                    check_token_range(token_id, out_dtype, f"{path}:{line}")
                    raise UserError(f"{path}:{line}: negative token id {token_id} from the tokenizer")
                for line, kind in result.bad_lines:
                    if on_bad_line == "fail":
                        raise UserError(
                            describe_bad_line(path, line, kind, json_key) + "; fix the line or pass --on_bad_line skip"
                        )
                    skipped[kind] += 1
                    if len(listed) < BAD_LINES_LISTED:
                        listed.append(describe_bad_line(path, line, kind, json_key))
                writer.add_documents(result.tokens, result.item_sizes, result.doc_items)
                largest = max(largest, int(result.tokens.max()) if result.tokens.size else -1)
                read += result.input_bytes
                bar.update(result.input_bytes)
                bar.set_postfix_str(
                    f"{writer.documents} docs, {writer.documents / (time.perf_counter() - start):.0f} docs/s",
                    refresh=False,
                )
                if max_doc_num is not None and writer.documents >= max_doc_num:
                    break
        finally:
            results.close()  # stops the worker pool
        bar.close()
        if writer.documents == 0:
            raise UserError(f"--input {input_path}: no document with text under '{json_key}'; nothing to tokenize")
        writer.finalize(tmp_idx)
        stats = {
            "documents": writer.documents,
            "items": len(writer.sizes),
            "tokens": writer.tokens,
            "max_token_id": largest,
            "dtype": np.dtype(out_dtype).name,
            "vocab_size": vocab_size,
            "tokenizer": tokenizer_name_or_path,
            "tokenizer_class": type(tokenizer).__name__,
            "eos_token_id": eos_token_id,
            "json_key": json_key,
            "sentence_language": language_code,
            "inputs": files,
            "input_bytes": read,
            "skipped": {kind: skipped[kind] for kind in BAD_LINE_KINDS},
        }
        write_stats(tmp_stats, stats)
    seconds = time.perf_counter() - start
    _log_summary(output_prefix, stats, listed, seconds)
    return stats


def _log_summary(output_prefix: str, stats: dict, listed: list, seconds: float) -> None:
    written = sum(os.path.getsize(output_prefix + suffix) for suffix in (".bin", ".idx"))
    logger.info(
        f"wrote {output_prefix}.bin/.idx/.stats.json: {stats['documents']} documents, {stats['items']} items, "
        f"{stats['tokens']} tokens ({stats['dtype']}), max token id {stats['max_token_id']} "
        f"(vocabulary {stats['vocab_size']}), {written / 1e6:.1f} MB written"
    )
    logger.info(
        f"read {stats['input_bytes'] / 1e6:.1f} MB in {seconds:.1f} s: {stats['documents'] / seconds:.0f} documents/s, "
        f"{stats['tokens'] / seconds:.0f} tokens/s, {stats['input_bytes'] / 1e6 / seconds:.2f} MB/s"
    )
    skipped = {kind: n for kind, n in stats["skipped"].items() if n}
    if skipped:
        logger.info(f"skipped lines: {skipped}; the first: " + " | ".join(listed))
