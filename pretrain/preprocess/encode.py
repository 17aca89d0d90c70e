"""Tokenizing chunks of jsonl lines: the work one process of create_pretraining_data does.

A chunk is consecutive lines of one input file. Each document becomes one item (or, with
sentence splitting, one item per sentence) of token ids; EOS, when asked for, ends the last item.
Chunks are encoded independently and in order, so the output does not depend on how many
processes share the work. In a worker pool the tokenizer is loaded once per process by
``init_worker``; ``encode_chunk`` then uses that process's ``DocumentEncoder``.
"""

from __future__ import annotations

import itertools
from typing import List, NamedTuple, Optional, Tuple

import numpy as np
from sentencex import segment

from pretrain.preprocess.jsonl import EMPTY, parse_line
from pretrain.tokenizers import load_tokenizer_from


class Chunk(NamedTuple):
    """Consecutive raw lines of one input file."""

    file_index: int  # position in the run's list of input files
    first_line: int  # 1-based line number of lines[0]
    lines: List[bytes]


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


def encode_batch(tokenizer, texts: list) -> list:
    """Token ids of each text, without special tokens: the tokenizer's own batch encode.

    Returns:
        ``[len(texts)]`` lists of int ids.
    """
    if not texts:
        return []
    return tokenizer(texts, add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False)[
        "input_ids"
    ]


class DocumentEncoder:
    """Turns the lines of a chunk into token arrays.

    Args:
        tokenizer: a paddlenlp tokenizer.
        json_key: the field holding the document text.
        eos_token_id: appended to every document, or None for no EOS.
        language: sentence-split each document with ``sentencex`` for this language code
            (e.g. ``en``, ``zh``), each sentence one item; None keeps whole documents.
        dtype: output token dtype (np.uint16 or np.int32); ids outside it are reported, not wrapped.
    """

    def __init__(self, tokenizer, json_key: str, eos_token_id: Optional[int], language: Optional[str], dtype):
        self.tokenizer = tokenizer
        self.json_key = json_key
        self.eos_token_id = eos_token_id
        self.language = language
        self.dtype = np.dtype(dtype)
        self.max_id = np.iinfo(self.dtype).max

    def _pieces(self, text: str) -> list:
        if self.language is None:
            return [text]
        return [sentence.strip() for sentence in segment(self.language, text) if sentence.strip()]

    def encode(self, chunk: Chunk) -> EncodedChunk:
        bad_lines, doc_lines, doc_pieces, pieces = [], [], [], []
        for line_number, raw in enumerate(chunk.lines, start=chunk.first_line):
            text, problem = parse_line(raw, self.json_key)
            if problem is not None:
                bad_lines.append((line_number, problem))
            elif text is not None:
                document = self._pieces(text)
                doc_lines.append(line_number)
                doc_pieces.append(len(document))
                pieces.extend(document)

        encoded = iter(encode_batch(self.tokenizer, pieces))
        item_ids, item_sizes, doc_items, kept_lines = [], [], [], []
        for line_number, count in zip(doc_lines, doc_pieces):
            items = [ids for ids in (next(encoded) for _ in range(count)) if ids]
            if not items:  # nothing the tokenizer turns into ids
                bad_lines.append((line_number, EMPTY))
                continue
            if self.eos_token_id is not None:
                items[-1] = items[-1] + [self.eos_token_id]
            item_ids.extend(items)
            item_sizes.extend(len(ids) for ids in items)
            doc_items.append(len(items))
            kept_lines.append(line_number)
        bad_lines.sort()

        ids = np.fromiter(itertools.chain.from_iterable(item_ids), dtype=np.int64, count=sum(item_sizes))
        out_of_range = None
        if ids.size:
            bad = np.flatnonzero((ids < 0) | (ids > self.max_id))
            if bad.size:
                item = np.searchsorted(np.cumsum(item_sizes), bad[0], side="right")
                document = np.searchsorted(np.cumsum(doc_items), item, side="right")
                out_of_range = (kept_lines[document], int(ids[bad[0]]))
        return EncodedChunk(
            file_index=chunk.file_index,
            tokens=ids.astype(self.dtype),
            item_sizes=np.asarray(item_sizes, dtype=np.int32),
            doc_items=np.asarray(doc_items, dtype=np.int32),
            doc_lines=np.asarray(kept_lines, dtype=np.int64),
            bad_lines=bad_lines,
            out_of_range=out_of_range,
            input_bytes=sum(len(line) for line in chunk.lines),
        )


_encoder: Optional[DocumentEncoder] = None  # this worker process's encoder, set by init_worker


def init_worker(tokenizer_path: str, json_key: str, eos_token_id, language, dtype) -> None:
    """Pool initializer: load the tokenizer once in this process."""
    global _encoder
    _encoder = DocumentEncoder(load_tokenizer_from(tokenizer_path), json_key, eos_token_id, language, dtype)


def encode_chunk(chunk: Chunk) -> EncodedChunk:
    """Encode a chunk with the encoder ``init_worker`` made in this process."""
    return _encoder.encode(chunk)
