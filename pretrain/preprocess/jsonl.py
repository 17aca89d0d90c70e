"""Reading jsonl corpora: one JSON object per line, the document text under a key (default ``text``).

Inputs are ``.jsonl`` files, compressed ``.jsonl.gz`` (gzip) or ``.jsonl.zst`` (Zstandard, the
format OpenWebText2 and the Pile ship in), or a folder holding any of them. Lines are streamed as
bytes and parsed one at a time (``parse_line``), so the corpus is never held in memory.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from contextlib import contextmanager

from pretrain.errors import UserError

SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
# Why a line yields no document; the keys of the skipped-line counts in summaries and stats.
BAD_JSON, MISSING_KEY, NOT_UTF8, EMPTY = "bad_json", "missing_key", "not_utf8", "empty"
BAD_LINE_KINDS = (BAD_JSON, MISSING_KEY, NOT_UTF8, EMPTY)


def input_files(path: str) -> list:
    """The jsonl files of ``path``: the file itself, or every file with a jsonl suffix under the folder.

    Returns:
        Paths sorted by name (folders walked recursively), so the output order is reproducible.

    Raises:
        UserError: the path does not exist, has an unsupported suffix, or the folder holds no jsonl.
    """
    if os.path.isfile(path):
        if not path.endswith(SUFFIXES):
            raise UserError(
                f"--input {path}: unsupported file type; give one of {', '.join(SUFFIXES)} or a folder of them"
            )
        return [path]
    if not os.path.isdir(path):
        raise UserError(f"--input {path}: no such file or folder")
    files = sorted(
        os.path.join(root, name) for root, _, names in os.walk(path) for name in names if name.endswith(SUFFIXES)
    )
    if not files:
        raise UserError(f"--input {path}: the folder holds no {', '.join(SUFFIXES)} file")
    return files


@contextmanager
def open_binary(path: str):
    """Open a jsonl file for reading bytes, decompressing ``.gz`` and ``.zst`` on the fly.

    Raises:
        UserError: a ``.zst`` file is given but the ``zstandard`` package is not installed.
    """
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            yield f
    elif path.endswith(".zst"):
        try:
            import zstandard
        except ImportError as e:
            raise UserError(f"{path}: reading .zst needs the zstandard package; run `pip install zstandard`") from e
        with open(path, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as reader:
            yield io.BufferedReader(reader)
    else:
        with open(path, "rb") as f:
            yield f


def parse_line(raw: bytes, json_key: str):
    """The document text of one jsonl line, or why there is none.

    Returns:
        ``(text, None)`` for a document, ``(None, kind)`` with ``kind`` one of ``BAD_LINE_KINDS``,
        or ``(None, None)`` for a blank line (not a document; not counted).
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
    if not text.strip():
        return None, EMPTY
    return text, None


def iter_texts(path: str, json_key: str = "text"):
    """Yield the ``json_key`` string of every document of a jsonl file (strict: any bad line is an error).

    Raises:
        UserError: a line is not UTF-8, not valid JSON, or lacks a string ``json_key`` (message
            names file and line). Empty documents are skipped.
    """
    with open_binary(path) as f:
        for line_number, raw in enumerate(f, start=1):
            text, problem = parse_line(raw, json_key)
            if problem in (NOT_UTF8, BAD_JSON, MISSING_KEY):
                raise UserError(describe_bad_line(path, line_number, problem, json_key))
            if text is not None:
                yield text


def describe_bad_line(path: str, line_number: int, kind: str, json_key: str) -> str:
    """One sentence saying what is wrong with a line and how to fix it."""
    reasons = {
        BAD_JSON: "not valid JSON",
        MISSING_KEY: f"no string under '{json_key}' (pass --json_key with the field holding the text)",
        NOT_UTF8: "not UTF-8 text (re-encode the file, e.g. with iconv)",
        EMPTY: f"an empty document under '{json_key}'",
    }
    return f"{path}:{line_number}: {reasons[kind]}"
