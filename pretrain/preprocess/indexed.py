"""Tokenize a jsonl corpus into paddlenlp's mmap indexed format (``<prefix>.bin`` + ``<prefix>.idx``).

One document per jsonl line; each becomes one item (``sizes`` entry) and one document in the
index, with the tokenizer's EOS appended when ``append_eos``. Token dtype: uint16 when every id
fits (vocabulary <= 65536), else int32. Files are written aside and renamed only on success.
"""

from __future__ import annotations

import os

import numpy as np
from paddlenlp.data.indexed_dataset import make_builder

from pretrain.atomic import atomic_outputs
from pretrain.errors import UserError
from pretrain.preprocess.jsonl import iter_texts


def token_dtype(vocab_size: int):
    """np.uint16 when ids 0..vocab_size-1 fit in 16 bits, else np.int32."""
    return np.uint16 if vocab_size <= 65536 else np.int32


def write_indexed_dataset(jsonl_path: str, tokenizer, output_prefix: str, json_key: str = "text",
                          append_eos: bool = True) -> dict:
    """Tokenize every document of ``jsonl_path`` and write ``output_prefix``.bin/.idx.

    Returns:
        ``{"documents": int, "tokens": int, "skipped_empty": int, "dtype": str}``.

    Raises:
        UserError: the corpus holds no non-empty document, or a line is malformed.
    """
    vocab_size = len(tokenizer)
    dtype = token_dtype(vocab_size)
    os.makedirs(os.path.dirname(os.path.abspath(output_prefix)), exist_ok=True)
    documents = tokens = skipped = 0
    with atomic_outputs(output_prefix + ".bin", output_prefix + ".idx") as (tmp_bin, tmp_idx):
        builder = make_builder(tmp_bin, impl="mmap", save_dtype=dtype)
        for text in iter_texts(jsonl_path, json_key):
            ids = tokenizer.encode(text, add_special_tokens=False)["input_ids"] if text.strip() else []
            if not ids:
                skipped += 1
                continue
            if append_eos:
                ids.append(tokenizer.eos_token_id)
            builder.add_item(np.asarray(ids, dtype=np.int64))
            builder.end_document()
            documents += 1
            tokens += len(ids)
        if documents == 0:  # atomic_outputs removes the partial files
            raise UserError(f"{jsonl_path}: no non-empty document under key '{json_key}'; nothing to tokenize")
        builder.finalize(tmp_idx)
    return {"documents": documents, "tokens": tokens, "skipped_empty": skipped, "dtype": np.dtype(dtype).name}
