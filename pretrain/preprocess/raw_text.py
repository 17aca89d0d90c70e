"""Raw text files -> jsonl documents (the step before create_pretraining_data).

Each file is cut into blocks (``SPLITTERS``: the whole file, paragraphs at blank lines, or single
lines); consecutive blocks are joined until a document holds at least ``min_doc_chars``
characters, and a shorter remainder at the end of a file is dropped. With ``shuffle`` the
documents are written in a seeded random order: they are first written in file order to a
temporary file, then copied line by line in permuted order, so only one offset per document
(8 bytes) is held in memory.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from array import array

import numpy as np

from pretrain.atomic import atomic_outputs, partial_path
from pretrain.errors import UserError

SPLITTERS = {
    "file": lambda text: [text],
    "paragraph": lambda text: re.split(r"\n\s*\n", text),
    "line": lambda text: text.split("\n"),
}


def join_blocks(blocks, min_doc_chars: int):
    """Join consecutive non-empty blocks (stripped) with blank lines into pieces of >= ``min_doc_chars`` characters.

    Yields the pieces; the last one may be shorter.
    """
    piece, size = [], 0
    for block in blocks:
        block = block.strip()
        if not block:
            continue
        piece.append(block)
        size += len(block)
        if size >= min_doc_chars:
            yield "\n\n".join(piece)
            piece, size = [], 0
    if piece:
        yield "\n\n".join(piece)


def text_files(folder: str, pattern: str) -> list:
    """Files under ``folder`` (recursive) whose name matches the glob ``pattern``, sorted.

    Raises:
        UserError: the folder does not exist or no file matches.
    """
    if not os.path.isdir(folder):
        raise UserError(f"--input_path {folder}: no such folder")
    files = sorted(
        os.path.join(root, name)
        for root, _, names in os.walk(folder)
        for name in names
        if fnmatch.fnmatch(name, pattern)
    )
    if not files:
        raise UserError(f"--input_path {folder}: no file matches --pattern {pattern!r}")
    return files


def _documents(path: str, split: str, min_doc_chars: int):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise UserError(
            f"{path}: not UTF-8 text at byte {e.start}; re-encode it (e.g. iconv -t UTF-8) or leave it out"
        ) from e
    return join_blocks(SPLITTERS[split](text), min_doc_chars)


def texts_to_jsonl(args) -> dict:
    """Write the documents of every text file under ``args.input_path`` to ``args.output_path`` as jsonl.

    Args:
        args: a ``pretrain.preprocess.arguments.TextsToJsonArguments`` (pattern, split, min_doc_chars,
            json_key, shuffle, seed; see its help).

    Returns:
        ``{"files", "documents", "dropped_short", "bytes"}``.

    Raises:
        UserError: see ``text_files``; a file is not UTF-8; no document is long enough.
    """
    files = text_files(args.input_path, args.pattern)
    documents = dropped = 0
    os.makedirs(os.path.dirname(os.path.abspath(args.output_path)), exist_ok=True)
    with atomic_outputs(args.output_path) as (tmp,):
        ordered = partial_path(tmp) if args.shuffle else tmp
        offsets = array("q", [0])  # byte offset of each document line in ``ordered``, then its size
        try:
            with open(ordered, "wb") as f:
                for path in files:
                    for document in _documents(path, args.split, args.min_doc_chars):
                        if len(document) < args.min_doc_chars:
                            dropped += 1
                            continue
                        line = json.dumps({args.json_key: document}, ensure_ascii=False) + "\n"
                        offsets.append(offsets[-1] + f.write(line.encode("utf-8")))
                        documents += 1
            if documents == 0:
                raise UserError(
                    f"--input_path {args.input_path}: no document of at least {args.min_doc_chars} characters; "
                    "lower --min_doc_chars"
                )
            if args.shuffle:
                _copy_shuffled(ordered, tmp, offsets, args.seed)
        finally:
            if args.shuffle and os.path.exists(ordered):
                os.remove(ordered)
    return {
        "files": len(files),
        "documents": documents,
        "dropped_short": dropped,
        "bytes": os.path.getsize(args.output_path),
    }


def _copy_shuffled(source: str, target: str, offsets: array, seed: int) -> None:
    """Copy the lines of ``source`` (line i spans offsets[i]:offsets[i+1]) to ``target`` in seeded random order."""
    order = np.random.default_rng(seed).permutation(len(offsets) - 1)  # [documents]
    with open(source, "rb") as src, open(target, "wb") as dst:
        for i in order:
            src.seek(offsets[i])
            dst.write(src.read(offsets[i + 1] - offsets[i]))
