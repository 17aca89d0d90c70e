"""Reading jsonl corpora: one JSON object per line, the document text under a key (default ``text``).

Inputs are ``.jsonl`` files, compressed ``.jsonl.gz`` (gzip) or ``.jsonl.zst`` (Zstandard, the
format OpenWebText2 and the Pile ship in), or a folder holding any of them. Lines are streamed as
bytes and parsed one at a time (``parse_line``), so the corpus is never held in memory.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from contextlib import contextmanager

from pretrain.errors import UserError

SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
COLUMNAR_SUFFIXES = (".parquet", ".arrow")  # one document per row, read by pretrain.preprocess.parquet
INPUT_SUFFIXES = SUFFIXES + COLUMNAR_SUFFIXES
# Why a line yields no document; the keys of the skipped-line counts in summaries and stats.
BAD_JSON, MISSING_KEY, NOT_UTF8, SURROGATE, EMPTY = "bad_json", "missing_key", "not_utf8", "lone_surrogate", "empty"
BAD_LINE_KINDS = (BAD_JSON, MISSING_KEY, NOT_UTF8, SURROGATE, EMPTY)


def input_files(path: str) -> list:
    """The input files of ``path``: the file itself, or every file with a jsonl, Parquet or Arrow
    suffix (``INPUT_SUFFIXES``) under the folder.

    Returns:
        Paths sorted by name (folders walked recursively), so the output order is reproducible.

    Raises:
        UserError: the path does not exist, has an unsupported suffix, or the folder holds no jsonl.
    """
    if os.path.isfile(path):
        if not path.endswith(INPUT_SUFFIXES):
            raise UserError(
                f"--input_path {path}: unsupported file type; give one of {', '.join(INPUT_SUFFIXES)} or a folder "
                "of them"
            )
        return [path]
    if not os.path.isdir(path):
        raise UserError(f"--input_path {path}: no such file or folder")
    files = sorted(
        os.path.join(root, name) for root, _, names in os.walk(path) for name in names if name.endswith(INPUT_SUFFIXES)
    )
    if not files:
        raise UserError(f"--input_path {path}: the folder holds no {', '.join(INPUT_SUFFIXES)} file")
    return files


ZSTD_BLOCK_BYTES = 1 << 18  # compressed bytes decompressed per step (bounds memory on highly compressible data)


def _zstd_lines(raw):
    """The lines of every frame of a Zstandard stream. Raises EOFError when the stream ends inside a frame
    (``zstandard``'s stream reader would end silently there, dropping the rest of the file)."""
    import zstandard

    decompressor = zstandard.ZstdDecompressor()
    frame, in_frame, pending = decompressor.decompressobj(), False, b""
    while data := raw.read(ZSTD_BLOCK_BYTES):
        while data:
            lines = (pending + frame.decompress(data)).split(b"\n")
            pending = lines.pop()
            yield from (line + b"\n" for line in lines)
            in_frame = not frame.eof
            data = frame.unused_data if frame.eof else b""
            if frame.eof:
                frame = decompressor.decompressobj()
    if in_frame:
        raise EOFError("the file ends inside a zstd frame")
    if pending:
        yield pending


def _checked(lines, path: str, kind: str, errors: tuple):
    """Pass ``lines`` through; a decompression error becomes a UserError naming the file and the last good line."""
    line_number = 0
    try:
        for line in lines:
            yield line
            line_number += 1
    except errors as e:
        raise UserError(
            f"{path}: cannot read {kind} data after line {line_number} ({e}); the file is truncated, corrupt or "
            f"not {kind}: re-create it, or name a plain text file .jsonl"
        ) from e


@contextmanager
def open_lines(path: str):
    """Open a jsonl file for reading lines as bytes, decompressing ``.gz`` and ``.zst`` on the fly.

    Yields:
        ``(lines, disk_bytes)``: an iterator over the raw lines (each ending in ``\\n`` but maybe the
        last), and a function giving the bytes of the file read from disk so far (compressed
        bytes for ``.gz``/``.zst``).

    Raises:
        UserError: while iterating, when the data cannot be decompressed (truncated, corrupt, or
            not that format: the message names the file and the last line read); when a ``.zst``
            file is given but the ``zstandard`` package is not installed.
    """
    with open(path, "rb") as raw:
        if path.endswith(".gz"):
            with gzip.GzipFile(fileobj=raw) as f:
                yield _checked(f, path, "gzip", (EOFError, OSError, zlib.error)), raw.tell
        elif path.endswith(".zst"):
            try:
                import zstandard
            except ImportError as e:
                raise UserError(f"{path}: reading .zst needs the zstandard package; run `pip install zstandard`") from e
            yield _checked(_zstd_lines(raw), path, "zstd", (EOFError, zstandard.ZstdError)), raw.tell
        else:
            yield raw, raw.tell


def parse_line(raw: bytes, json_key: str):
    """The document text of one jsonl line, or why there is none.

    Returns:
        ``(text, None)`` for a document (valid Unicode: encodable as UTF-8), ``(None, kind)`` with
        ``kind`` one of ``BAD_LINE_KINDS``, or ``(None, None)`` for a blank line (not a document;
        not counted).
    """
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, NOT_UTF8
    if not line.strip():
        return None, None
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None, BAD_JSON
    text = record.get(json_key) if isinstance(record, dict) else None
    if not isinstance(text, str):
        return None, MISSING_KEY
    if "\\u" in line and _has_lone_surrogate(text):  # only a JSON escape can put one into a str
        return None, SURROGATE
    if not text.strip():
        return None, EMPTY
    return text, None


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def iter_texts(path: str, json_key: str = "text"):
    """Yield the ``json_key`` string of every document of a jsonl file (strict: any bad line is an error).

    Raises:
        UserError: a line is not UTF-8, not valid JSON, or lacks a string ``json_key`` (message
            names file and line). Empty documents are skipped.
    """
    with open_lines(path) as (lines, _):
        for line_number, raw in enumerate(lines, start=1):
            text, problem = parse_line(raw, json_key)
            if problem in (NOT_UTF8, BAD_JSON, MISSING_KEY, SURROGATE):
                raise UserError(describe_bad_line(path, line_number, problem, json_key))
            if text is not None:
                yield text


def describe_bad_line(path: str, line_number: int, kind: str, json_key: str) -> str:
    """One sentence saying what is wrong with a line and how to fix it."""
    reasons = {
        BAD_JSON: "not valid JSON",
        MISSING_KEY: f"no string under '{json_key}' (pass --json_key with the field holding the text)",
        NOT_UTF8: "not UTF-8 text (re-encode the file, e.g. with iconv)",
        SURROGATE: f"a lone surrogate escape (e.g. \\ud800) under '{json_key}', which is no character (fix the text)",
        EMPTY: f"an empty document under '{json_key}'",
    }
    return f"{path}:{line_number}: {reasons[kind]}"
