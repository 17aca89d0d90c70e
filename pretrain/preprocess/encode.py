"""Tokenizing chunks of jsonl lines or table rows: the work one process of create_pretraining_data does.

A chunk is consecutive lines (jsonl: raw bytes) or rows (Parquet/Arrow: the text column's values) of
one input file. Each document becomes one item (or, with
sentence splitting, one item per sentence) of token ids; EOS, when asked for, ends the last item.
The chunk's texts go to the native encoder in one call (``pretrain.preprocess.native``) and the
items, EOS ids and document boundaries are laid out with numpy, so no Python loop runs per token
and only parsing runs per document. Chunks are encoded independently and in order, so the output
does not depend on how many processes share the work. In a worker pool each process uses the
``DocumentEncoder`` it inherited from the main process (``init_worker``).
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import signal
import sys
from typing import Any, List, NamedTuple, Optional, Tuple

import numpy as np
from sentencex import segment

from pretrain.preprocess.jsonl import EMPTY, MISSING_KEY, parse_line

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class Chunk(NamedTuple):
    """Consecutive raw lines (or rows) of one input file."""

    file_index: int  # position in the run's list of input files
    first_line: int  # 1-based line (or row) number of lines[0]
    lines: list  # jsonl: raw lines (bytes); Parquet/Arrow: the texts (str, or None for a null)
    disk_bytes: int  # bytes of the file on disk read for these lines (compressed bytes for .gz/.zst)
    text_bytes: Optional[int] = None  # Parquet/Arrow: UTF-8 bytes of the texts (jsonl: None, the lines' bytes)


class EncodedChunk(NamedTuple):
    """The tokenized documents of one chunk, in input order."""

    file_index: int
    tokens: np.ndarray  # [tokens] in the output dtype: every item of every document, concatenated
    item_sizes: np.ndarray  # [items] int32: tokens per item (a document, or a sentence of one)
    doc_items: np.ndarray  # [documents] int32: items per document
    doc_lines: np.ndarray  # [documents] int64: 1-based line number of each document
    bad_lines: List[Tuple[int, str]]  # (line number, kind) of each line that gave no document
    out_of_range: Optional[Tuple[int, int]]  # (line number, token id) of the first id the dtype cannot hold
    input_bytes: int  # raw (uncompressed) bytes of the chunk's lines
    disk_bytes: int  # the chunk's Chunk.disk_bytes


class DocumentEncoder:
    """Turns the lines of a chunk into token arrays.

    Args:
        encoder: a native encoder from ``pretrain.preprocess.native.load_encoder``.
        json_key: the field holding the document text.
        eos_token_id: appended to every document, or None for no EOS.
        language: sentence-split each document with ``sentencex`` for this language code
            (e.g. ``en``, ``zh``), each sentence one item; None keeps whole documents.
        dtype: output token dtype (np.uint16 or np.int32); ids outside it are reported, not wrapped.
        max_repeated_len: a character repeated more than this many times in a row becomes one
            (PaddleNLP's ``--max_repeated_len``; newlines are kept); None keeps the text as it is.
    """

    def __init__(
        self,
        encoder,
        json_key: str,
        eos_token_id: Optional[int],
        language: Optional[str],
        dtype,
        max_repeated_len: Optional[int],
    ):
        self.encoder = encoder
        self.repeats = None if max_repeated_len is None else re.compile(r"(.)\1{%d,}" % max_repeated_len)
        self.json_key = json_key
        self.eos_token_id = eos_token_id
        self.language = language
        self.dtype = np.dtype(dtype)
        self.max_id = np.iinfo(self.dtype).max

    def _pieces(self, text: str) -> list:
        if self.repeats is not None:
            text = self.repeats.sub(r"\1", text)
        if self.language is None:
            return [text]
        return [sentence.strip() for sentence in segment(self.language, text) if sentence.strip()]

    def encode(self, chunk: Chunk) -> EncodedChunk:
        bad_lines, doc_pieces, pieces = [], [], []
        doc_lines: Any = []  # [documents] first line of each; an int64 array once encoded
        parse = _parse_row if chunk.text_bytes is not None else functools.partial(parse_line, json_key=self.json_key)
        for line_number, raw in enumerate(chunk.lines, start=chunk.first_line):
            text, problem = parse(raw)
            if problem is not None:
                bad_lines.append((line_number, problem))
            elif text is not None:
                document = self._pieces(text)
                doc_lines.append(line_number)
                doc_pieces.append(len(document))
                pieces.extend(document)

        ids, lengths = self.encoder.encode(pieces)  # [tokens], [pieces]
        piece_doc = np.repeat(np.arange(len(doc_lines)), doc_pieces)  # [pieces] document of each piece
        kept = lengths > 0  # a piece the tokenizer turns into nothing is no item
        item_doc, item_sizes = piece_doc[kept], lengths[kept]  # [items]
        doc_items = np.bincount(item_doc, minlength=len(doc_lines))  # [documents]
        doc_lines = np.asarray(doc_lines, dtype=np.int64)
        bad_lines += [(int(line), EMPTY) for line in doc_lines[doc_items == 0]]
        bad_lines.sort()
        if self.eos_token_id is not None and item_sizes.size:
            last = np.append(item_doc[1:] != item_doc[:-1], True)  # [items] the last item of its document
            ids = np.insert(ids, np.cumsum(item_sizes)[last], self.eos_token_id)
            item_sizes[last] += 1
        doc_lines, doc_items = doc_lines[doc_items > 0], doc_items[doc_items > 0]

        out_of_range = None
        bad = np.flatnonzero((ids < 0) | (ids > self.max_id))
        if bad.size:
            item = np.searchsorted(np.cumsum(item_sizes), bad[0], side="right")
            document = np.searchsorted(np.cumsum(doc_items), item, side="right")
            out_of_range = (int(doc_lines[document]), int(ids[bad[0]]))
        return EncodedChunk(
            file_index=chunk.file_index,
            tokens=ids.astype(self.dtype),
            item_sizes=item_sizes.astype(np.int32),
            doc_items=doc_items.astype(np.int32),
            doc_lines=doc_lines,
            bad_lines=bad_lines,
            out_of_range=out_of_range,
            input_bytes=sum(map(len, chunk.lines)) if chunk.text_bytes is None else chunk.text_bytes,
            disk_bytes=chunk.disk_bytes,
        )


def _parse_row(text: Optional[str]) -> tuple:
    """A table row's text as ``parse_line`` returns a line's: a null is a missing text, a blank one empty."""
    if text is None:
        return None, MISSING_KEY
    if not text.strip():
        return None, EMPTY
    return text, None


_encoder: Optional[DocumentEncoder] = None  # this worker process's encoder, set by init_worker


def init_worker(encoder: DocumentEncoder, parent_pid: int) -> None:
    """Pool initializer in a forked worker: keep the main process's encoder; leave signals to the main
    process; die with it.

    SIGINT (Ctrl-C reaches the whole process group) is ignored and SIGTERM ends the worker at
    once: the main process stops the pool and removes the partial outputs; workers write no file.
    When the main process ``parent_pid`` dies, even by SIGKILL (the OOM killer), the kernel sends
    this worker SIGKILL (Linux ``PR_SET_PDEATHSIG``); a worker whose parent is already gone exits.
    """
    global _encoder
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent(parent_pid)
    _encoder = encoder


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux; elsewhere nothing is set), and exit
    now if ``parent_pid`` is no longer the parent (it died before the request took effect)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


def encode_chunk(chunk: Chunk) -> EncodedChunk:
    """Encode a chunk with the encoder ``init_worker`` kept in this process."""
    assert _encoder is not None, "encode_chunk runs in a worker that init_worker set up"
    return _encoder.encode(chunk)
