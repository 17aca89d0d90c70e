"""jsonl, Parquet or Arrow corpus -> ``<prefix>.bin/.idx/.stats.json``: streaming, ordered, multi-process
tokenization.

The main process reads the inputs line by line into chunks (``CHUNK_LINES`` lines or
``CHUNK_BYTES`` bytes of one file), workers tokenize chunks (``encode.encode_chunk``), and the main
process writes the results in input order. At most ``IN_FLIGHT_PER_WORKER`` chunks per worker are
pending, so memory does not grow with the corpus; and since every chunk is encoded the same way
wherever it runs, any number of workers writes byte-identical files. Workers are forked and keep
the main process's tokenizer; a worker that dies (killed, out of memory) stops the run with an
error instead of a hang (``concurrent.futures``' broken-pool detection).

Nothing here imports paddlenlp for the tokenizer classes of ``pretrain.tokenizers.TOKENIZER_CLASSES``:
start-up counts in the run time (``python -X importtime``: ~0.3 s instead of ~3.5 s).
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Generator, Iterator

import numpy as np
from tqdm import tqdm

from pretrain.corpus import (
    DTYPES,
    IndexedWriter,
    check_token_range,
    indexed_outputs,
    token_dtype,
    write_stats,
)
from pretrain.errors import UserError
from pretrain.log import logger
from pretrain.preprocess.arguments import PretrainingDataArguments
from pretrain.preprocess.encode import Chunk, DocumentEncoder, EncodedChunk, encode_chunk, init_worker
from pretrain.preprocess.jsonl import (
    BAD_LINE_KINDS,
    COLUMNAR_SUFFIXES,
    describe_bad_line,
    input_files,
    open_lines,
)
from pretrain.preprocess.native import load_encoder

CHUNK_LINES = 256
CHUNK_BYTES = 1 << 20
IN_FLIGHT_PER_WORKER = 4
BAD_LINES_LISTED = 10  # bad lines named one by one in the summary; the rest are counted


def read_chunks(files: list, json_key: str = "text") -> Iterator[Chunk]:
    """Consecutive lines of each file, ``CHUNK_LINES`` lines or ``CHUNK_BYTES`` bytes at most per chunk;
    of a Parquet or Arrow file, ``CHUNK_LINES`` rows of its ``json_key`` column.

    Raises:
        UserError: a compressed file cannot be decompressed (see ``jsonl.open_lines``); a Parquet or
            Arrow file cannot be read or has no string column ``json_key`` (see ``parquet.read_texts``).
    """
    for file_index, path in enumerate(files):
        if path.endswith(COLUMNAR_SUFFIXES):
            from pretrain.preprocess.parquet import read_texts  # pyarrow only when needed (start-up time)

            for first_row, texts, text_bytes, disk_bytes in read_texts(path, json_key, CHUNK_LINES):
                yield Chunk(file_index, first_row, texts, disk_bytes, text_bytes)
            continue
        with open_lines(path) as (lines_of_file, disk_bytes):
            lines, size, first_line, position = [], 0, 1, 0
            for line_number, raw in enumerate(lines_of_file, start=1):
                lines.append(raw)
                size += len(raw)
                if len(lines) >= CHUNK_LINES or size >= CHUNK_BYTES:
                    yield Chunk(file_index, first_line, lines, disk_bytes() - position)
                    position = disk_bytes()
                    lines, size, first_line = [], 0, line_number + 1
            if lines:
                yield Chunk(file_index, first_line, lines, disk_bytes() - position)


def _encoded_in_order(
    chunks: Iterator[Chunk], workers: int, encoder: DocumentEncoder
) -> Generator[EncodedChunk, None, None]:
    """Encode chunks in input order: in this process for 1 worker, else in a pool with a bounded window.

    Raises:
        UserError: a worker process died.
    """
    if workers == 1:
        yield from map(encoder.encode, chunks)
        return
    context = multiprocessing.get_context("fork")  # workers inherit the loaded tokenizer
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=init_worker, initargs=(encoder, os.getpid())
    ) as pool:
        pending = collections.deque()
        try:
            for chunk in chunks:
                pending.append(pool.submit(encode_chunk, chunk))
                if len(pending) >= workers * IN_FLIGHT_PER_WORKER:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except BrokenProcessPool as e:
            raise UserError(
                "a tokenizing worker process died (killed, or out of memory: try fewer --workers); nothing was written"
            ) from e
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


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


def _document_encoder(args: PretrainingDataArguments) -> DocumentEncoder:
    """The tokenizer folder's native encoder, checked against the arguments, wrapped for whole documents.

    Raises:
        UserError: ``tokenizer_name`` differs from the folder's class; no EOS token while ``append_eos``.
    """
    encoder = load_encoder(args.tokenizer_name_or_path)
    if args.tokenizer_name is not None and args.tokenizer_name != encoder.tokenizer_class:
        raise UserError(
            f"--tokenizer_name {args.tokenizer_name}: {args.tokenizer_name_or_path}/tokenizer_config.json names "
            f"{encoder.tokenizer_class}; drop --tokenizer_name or point --model_name at a {args.tokenizer_name} folder"
        )
    out_dtype = DTYPES[args.dtype] if args.dtype else token_dtype(encoder.vocab_size)
    if args.append_eos and encoder.eos_token_id is None:
        raise UserError(
            f"{args.tokenizer_name_or_path}: the tokenizer defines no eos_token; set eos_token in its "
            "tokenizer_config.json or pass --no_append_eos"
        )
    eos_token_id = encoder.eos_token_id if args.append_eos else None
    language = args.language if args.split_sentences else None
    return DocumentEncoder(encoder, args.json_key, eos_token_id, language, out_dtype, args.max_repeated_len)


def _check_result(result, path: str, args: PretrainingDataArguments, out_dtype, skipped, listed: list) -> None:
    """Account for one encoded chunk's bad lines (``skipped`` counts by kind, the first few ``listed``).

    Raises:
        UserError: a token id out of the dtype's range, or a bad line under ``on_bad_line="fail"``.
    """
    if result.out_of_range is not None:
        line, token_id = result.out_of_range
        check_token_range(token_id, out_dtype, f"{path}:{line}")
        raise UserError(f"{path}:{line}: negative token id {token_id} from the tokenizer")
    for line, kind in result.bad_lines:
        if args.on_bad_line == "fail":
            raise UserError(
                describe_bad_line(path, line, kind, args.json_key) + "; fix the line or pass --on_bad_line skip"
            )
        skipped[kind] += 1
        if len(listed) < BAD_LINES_LISTED:
            listed.append(describe_bad_line(path, line, kind, args.json_key))


def _encoding_stats(args: PretrainingDataArguments, document_encoder: DocumentEncoder) -> dict:
    """The ``.stats.json`` keys that say how the corpus was encoded (dtype, tokenizer, EOS, BOS, sentences)."""
    encoder = document_encoder.encoder
    return {
        "dtype": np.dtype(document_encoder.dtype).name,
        "vocab_size": encoder.vocab_size,
        "tokenizer": args.tokenizer_name_or_path,
        "tokenizer_class": encoder.tokenizer_class,
        "encoder": encoder.library,
        "eos_token_id": document_encoder.eos_token_id,
        "bos_token_id": encoder.bos_token_id,  # the tokenizer's; no BOS is written
        "json_key": args.json_key,
        "sentence_language": document_encoder.language,
        "max_repeated_len": args.max_repeated_len,
    }


def create_pretraining_data(args: PretrainingDataArguments) -> dict:
    """Tokenize the jsonl corpus ``args.input_path`` into ``args.output_prefix``.bin/.idx/.stats.json.

    See ``PretrainingDataArguments`` for the options. Documents are encoded as text by the
    tokenizer's native library (``pretrain.preprocess.native``); EOS is appended by id.

    Returns:
        The stats written to ``<prefix>.stats.json`` (documents, items, tokens, max_token_id, dtype,
        vocab_size, tokenizer, skipped counts by kind, input bytes, ...).

    Raises:
        UserError: bad input under ``on_bad_line="fail"``; a token id that does not fit the dtype;
            no document; no EOS token while ``append_eos``; a bad input path, tokenizer folder or
            compressed file; ``tokenizer_name`` differs from the folder's class. No output file is
            left behind then (nor after SIGTERM/SIGINT, see ``pretrain.preprocess.interrupt``).
    """
    files = input_files(args.input_path)
    if any(path.endswith(COLUMNAR_SUFFIXES) for path in files):
        from pretrain.preprocess.parquet import check_file

        for path in files:  # a missing or non-text column stops the run before any tokenizing
            if path.endswith(COLUMNAR_SUFFIXES):
                check_file(path, args.json_key)
    document_encoder = _document_encoder(args)
    out_dtype = document_encoder.dtype

    skipped = collections.Counter()
    listed = []
    largest = -1
    read = 0
    start = time.perf_counter()
    total = sum(os.path.getsize(path) for path in files)  # on disk: compressed bytes for .gz/.zst
    interval = 0 if args.log_interval else 1.0
    # the bar is drawn once the outputs are open: an error opening them ends no half-drawn bar line
    with (
        indexed_outputs(args.output_prefix) as (tmp_bin, tmp_idx, tmp_stats),
        tqdm(
            total=total, unit="B", unit_scale=True, desc="tokenizing", disable=not args.progress, mininterval=interval
        ) as bar,
    ):
        writer = IndexedWriter(tmp_bin, out_dtype)
        results = _encoded_in_order(read_chunks(files, args.json_key), args.workers, document_encoder)
        shown_documents, unshown_bytes = 0, 0
        try:
            for result in results:
                path = files[result.file_index]
                if args.max_doc_num is not None and writer.documents + len(result.doc_items) >= args.max_doc_num:
                    result = _truncate(result, args.max_doc_num - writer.documents)
                _check_result(result, path, args, out_dtype, skipped, listed)
                writer.add_documents(result.tokens, result.item_sizes, result.doc_items)
                largest = max(largest, int(result.tokens.max()) if result.tokens.size else -1)
                read += result.input_bytes
                unshown_bytes += result.disk_bytes
                if args.log_interval is None or writer.documents - shown_documents >= args.log_interval:
                    seconds = time.perf_counter() - start
                    bar.set_postfix_str(
                        f"{writer.documents} docs, {writer.documents / seconds:.0f} docs/s, "
                        f"{writer.tokens / seconds / 1e6:.2f} M tokens/s",
                        refresh=False,
                    )
                    bar.update(unshown_bytes)
                    shown_documents, unshown_bytes = writer.documents, 0
                if args.max_doc_num is not None and writer.documents >= args.max_doc_num:
                    break
        finally:
            results.close()  # stops the worker pool
        bar.update(unshown_bytes)
        if writer.documents == 0:
            raise UserError(
                f"--input_path {args.input_path}: no document with text under '{args.json_key}'; nothing to tokenize"
            )
        writer.finalize(tmp_idx)
        stats = {
            "documents": writer.documents,
            "items": len(writer.sizes),
            "tokens": writer.tokens,
            "max_token_id": largest,
            **_encoding_stats(args, document_encoder),
            "inputs": files,
            "input_bytes": read,
            "skipped": {kind: skipped[kind] for kind in BAD_LINE_KINDS},
        }
        write_stats(tmp_stats, stats)
    _log_summary(args.output_prefix, stats, listed, time.perf_counter() - start)
    return stats


def _log_summary(output_prefix: str, stats: dict, listed: list, seconds: float) -> None:
    written = sum(os.path.getsize(output_prefix + suffix) for suffix in (".bin", ".idx"))
    logger.info(
        f"wrote {output_prefix}.bin/.idx/.stats.json: {stats['documents']} documents, {stats['items']} items, "
        f"{stats['tokens']} tokens ({stats['dtype']}), max token id {stats['max_token_id']} "
        f"(vocabulary {stats['vocab_size']}), {written / 1e6:.1f} MB written"
    )
    logger.info(
        f"read {stats['input_bytes'] / 1e6:.1f} MB in {seconds:.1f} s with {stats['encoder']}: "
        f"{stats['documents'] / seconds:.0f} documents/s, {stats['tokens'] / seconds:.0f} tokens/s, "
        f"{stats['input_bytes'] / 1e6 / seconds:.2f} MB/s"
    )
    skipped = {kind: n for kind, n in stats["skipped"].items() if n}
    if skipped:
        logger.info(f"skipped lines: {skipped}; the first: " + " | ".join(listed))
