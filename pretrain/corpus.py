"""The tokenized corpus on disk: paddlenlp's mmap indexed dataset plus a ``.stats.json`` sidecar.

Files of a prefix (read by ``paddlenlp.data.indexed_dataset.make_dataset``):

- ``<prefix>.bin``: the token ids of every item, concatenated, in the dtype the ``.idx`` names
  (uint16 when the vocabulary fits in 16 bits, else int32).
- ``<prefix>.idx``: paddlenlp's ``MMapIndexedDataset.Index``: magic ``MMIDIDX\\x00\\x00``, version
  ``<Q`` 1, dtype code ``<B``, item count ``<Q`` n, document-index length ``<Q`` d + 1, then
  ``sizes`` int32[n] (tokens per item), ``pointers`` int64[n] (byte offset of each item in .bin),
  ``doc_idx`` int64[d + 1] (first item of each document, then n).
- ``<prefix>.stats.json`` (ours): counts and provenance, see ``STATS_KEYS``.

``IndexedWriter`` writes the ``.idx`` with numpy (``write_index``), byte for byte what paddlenlp's
``MMapIndexedDataset.Index.writer`` writes (tests/test_preprocess_tools.py): importing paddlenlp's
``indexed_dataset`` imports paddle and paddlenlp (about 3.4 s and 640 MB here), more than
tokenizing a 20 MB corpus takes. Reading goes through paddlenlp, imported on first use.

The older pair ``<prefix>_ids.npy`` (all ids, 1-D) + ``<prefix>_idx.npz`` (``lens``: tokens per
item, ``docs``: document index) is read by paddlenlp as well and converted by ``convert_legacy``.

One module for the format: detecting (``prefix_format``), writing (``IndexedWriter``,
``indexed_outputs``, ``merge``, ``convert_legacy``), verifying (``verify``) and reading (``read_index``,
``read_stats``, ``open_dataset``, ``index_counts``, ``summarize_prefix``). Training reads it here,
preprocessing writes it here; neither imports the other.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from array import array
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from io import StringIO
from typing import Optional

import numpy as np

from pretrain.atomic import atomic_outputs
from pretrain.errors import UserError
from pretrain.log import logger

DTYPES = {"uint16": np.uint16, "int32": np.int32}
DTYPE_CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}  # paddlenlp's indexed_dataset.code()
IDX_MAGIC = b"MMIDIDX\x00\x00"
# Header of the .idx: magic (9 bytes), version <Q, dtype code <B, item count <Q, doc_idx length <Q.
IDX_HEADER = struct.Struct("<9sQBQQ")
# Keys every .stats.json holds (preflight checks read them); more may follow.
STATS_KEYS = ("documents", "tokens", "max_token_id", "dtype", "vocab_size", "tokenizer")
COPY_BLOCK_TOKENS = 1 << 24  # tokens copied per step when streaming a token file
# (data file suffix, index file suffix) of each format; a prefix + suffix names the file.
FORMATS = ((".bin", ".idx"), ("_ids.npy", "_idx.npz"))
SCAN_BYTES = 64 * 2**20  # bytes read from each end of a .bin without a (current) stats sidecar


def _paddlenlp():
    """paddlenlp's ``indexed_dataset`` module, imported on first use (see the module docstring)."""
    from paddlenlp.data import indexed_dataset

    return indexed_dataset


def _causal_dataset():
    """paddlenlp's ``causal_dataset`` module (its split arithmetic), imported on first use."""
    from paddlenlp.data import causal_dataset

    return causal_dataset


def _has_files(prefix: str, suffixes: tuple) -> bool:
    """Whether every file of one format (a ``FORMATS`` entry) exists for ``prefix``."""
    return all(os.path.isfile(prefix + suffix) for suffix in suffixes)


def _has_pair(prefix: str) -> bool:
    return _has_files(prefix, FORMATS[0])


def _has_legacy_pair(prefix: str) -> bool:
    return _has_files(prefix, FORMATS[1])


def prefix_format(prefix: str):
    """The (data, index) suffix pair whose files exist for ``prefix``, or None."""
    return next((suffixes for suffixes in FORMATS if _has_files(prefix, suffixes)), None)


def write_index(idx_path: str, dtype, sizes, doc_idx) -> None:
    """Write an mmap ``.idx``: header, ``sizes`` int32 [items], byte ``pointers`` int64 [items], ``doc_idx`` int64.

    Args:
        dtype: the token dtype of the ``.bin`` (a key of ``DTYPE_CODES``).
        sizes: tokens per item, [items]; doc_idx: first item of each document, then the item count.
    """
    dtype = np.dtype(dtype)
    sizes = np.asarray(sizes, dtype=np.int32)
    pointers = np.zeros(sizes.size, dtype=np.int64)
    np.cumsum(sizes[:-1], dtype=np.int64, out=pointers[1:])
    pointers *= dtype.itemsize
    doc_idx = np.asarray(doc_idx, dtype=np.int64)
    with open(idx_path, "wb") as f:
        f.write(IDX_HEADER.pack(IDX_MAGIC, 1, DTYPE_CODES[dtype], sizes.size, doc_idx.size))
        for array in (sizes, pointers, doc_idx):
            f.write(array.tobytes())


def token_dtype(vocab_size: int):
    """np.uint16 when ids 0..vocab_size-1 fit in 16 bits, else np.int32."""
    return np.uint16 if vocab_size <= 65536 else np.int32


def check_token_range(max_token_id: int, dtype, where: str) -> None:
    """Raise unless ``max_token_id`` fits ``dtype`` (ids are never wrapped silently).

    Raises:
        UserError: naming ``where`` (file and line, or prefix) and the dtype to use instead.
    """
    if max_token_id > np.iinfo(dtype).max:
        raise UserError(
            f"{where}: token id {max_token_id} does not fit {np.dtype(dtype).name} "
            f"(max {np.iinfo(dtype).max}); use --dtype int32"
        )


class IndexedWriter:
    """Streams one corpus into a ``.bin`` and writes its ``.idx`` at the end.

    Token bytes go to disk as they come; only the index is held in memory (4 bytes per item and
    8 per document, compact arrays), and ``write_index`` writes it.
    """

    def __init__(self, bin_path: str, dtype):
        self.dtype = np.dtype(dtype)
        self._file = open(bin_path, "wb")
        self.sizes = array("i")  # [items] tokens per item
        self.doc_idx = array("q", [0])  # [documents + 1] first item of each document, then items
        self.tokens = 0

    def add_documents(self, tokens: np.ndarray, item_sizes: np.ndarray, doc_items: np.ndarray) -> None:
        """Append documents: ``tokens`` [sum(item_sizes)] (this dtype), ``item_sizes`` [items], ``doc_items`` [docs]."""
        if tokens.dtype != self.dtype:
            raise ValueError(f"tokens are {tokens.dtype}, the file holds {self.dtype}")
        self._file.write(tokens.tobytes())
        self.doc_idx.extend((len(self.sizes) + np.cumsum(doc_items, dtype=np.int64)).tolist())
        self.sizes.extend(item_sizes.tolist())
        self.tokens += int(tokens.size)

    def append_file(self, data_path: str, dtype, sizes: np.ndarray, doc_idx: np.ndarray) -> None:
        """Append another corpus: its token file (raw ids in ``dtype``, or a ``.npy``) and its index."""
        if data_path.endswith(".npy"):
            ids = np.load(data_path, mmap_mode="r")
        else:  # np.memmap cannot map an empty file
            ids = np.memmap(data_path, dtype=dtype, mode="r") if os.path.getsize(data_path) else np.zeros(0, dtype)
        for start in range(0, ids.size, COPY_BLOCK_TOKENS):
            self._file.write(np.asarray(ids[start : start + COPY_BLOCK_TOKENS]).astype(self.dtype).tobytes())
        self.doc_idx.extend((len(self.sizes) + np.asarray(doc_idx[1:], dtype=np.int64)).tolist())
        self.sizes.extend(np.asarray(sizes, dtype=np.int64).tolist())
        self.tokens += int(ids.size)

    @property
    def documents(self) -> int:
        return len(self.doc_idx) - 1

    def finalize(self, idx_path: str) -> None:
        """Close the ``.bin`` and write the ``.idx``."""
        self._file.close()
        write_index(idx_path, self.dtype, np.frombuffer(self.sizes, np.int32), np.frombuffer(self.doc_idx, np.int64))


@contextmanager
def indexed_outputs(output_prefix: str, with_stats: bool = True):
    """Temporary (bin, idx, stats) paths renamed to ``<prefix>.bin/.idx/.stats.json`` only on success.

    The ``.idx`` is renamed last, so a prefix with an ``.idx`` is complete. Without ``with_stats``
    the stats path is None and an older ``<prefix>.stats.json`` is removed on success (it would
    describe other data).
    """
    os.makedirs(os.path.dirname(os.path.abspath(output_prefix)), exist_ok=True)
    stats_path = output_prefix + ".stats.json"
    if with_stats:
        with atomic_outputs(output_prefix + ".bin", stats_path, output_prefix + ".idx") as (
            tmp_bin,
            tmp_stats,
            tmp_idx,
        ):
            yield tmp_bin, tmp_idx, tmp_stats
        return
    with atomic_outputs(output_prefix + ".bin", output_prefix + ".idx") as (tmp_bin, tmp_idx):
        yield tmp_bin, tmp_idx, None
    if os.path.exists(stats_path):
        os.remove(stats_path)


def write_stats(path: str, stats: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=2, ensure_ascii=False)
        f.write("\n")


def read_index(idx_path: str):
    """paddlenlp's ``MMapIndexedDataset.Index`` of ``idx_path``, without its progress prints.

    Call ``verify`` first on untrusted files: a truncated index makes the reader fail obscurely.
    """
    with redirect_stdout(StringIO()):
        return _paddlenlp().MMapIndexedDataset.Index(idx_path, skip_warmup=True)


def read_stats(prefix: str):
    """The ``<prefix>.stats.json`` dict, or None when there is none.

    Raises:
        UserError: the file is not a JSON object.
    """
    path = prefix + ".stats.json"
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            stats = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is unreadable ({e}); delete it or re-run create_pretraining_data.py") from e
    if not isinstance(stats, dict):
        raise UserError(f"{path} is not a JSON object; delete it or re-run create_pretraining_data.py")
    return stats


def _index_header(idx_path: str) -> tuple:
    """``(problem, dtype, items, doc_idx_len)`` of an mmap ``.idx``: ``problem`` is None when the header
    (magic, version, dtype code) is sound and the file size matches its counts, else says what is wrong
    (and the rest are None). Reads only the header: paddlenlp's reader, given such a file, fails with a
    bare assertion and prints two ``Exception ignored`` tracebacks from its ``__del__``.
    """
    idx_bytes = os.path.getsize(idx_path)
    with open(idx_path, "rb") as f:
        header = f.read(IDX_HEADER.size)
    if len(header) < IDX_HEADER.size:
        return f"{idx_path}: {idx_bytes} bytes, shorter than the {IDX_HEADER.size}-byte header", None, None, None
    magic, version, dtype_code, items, doc_idx_len = IDX_HEADER.unpack(header)
    if magic != IDX_MAGIC or version != 1:
        return f"{idx_path}: not an mmap index (magic {magic!r}, version {version})", None, None, None
    dtype = {code: t for t, code in DTYPE_CODES.items()}.get(dtype_code)
    if dtype is None:
        return f"{idx_path}: token dtype code {dtype_code} is not uint16 (8) or int32 (4)", None, None, None
    expected_idx = IDX_HEADER.size + 12 * items + 8 * doc_idx_len
    if idx_bytes != expected_idx:
        problem = (
            f"{idx_path}: {idx_bytes} bytes, expected {expected_idx} for {items} items and {doc_idx_len - 1} documents"
        )
        return problem, None, None, None
    return None, dtype, items, doc_idx_len


def check_index(idx_path: str) -> None:
    """Raise unless ``idx_path`` has a sound mmap header and the size its counts need (see ``_index_header``).

    Checked before paddlenlp's reader is built on a file; ``verify`` checks more (sizes, offsets, stats).

    Raises:
        UserError: naming the file, what is wrong, and to recreate it.
    """
    problem = _index_header(idx_path)[0]
    if problem:
        raise UserError(f"{problem}; the index is corrupt, truncated or empty: recreate it")


def open_dataset(prefix: str):
    """paddlenlp's dataset over ``prefix`` (mmap ``.bin/.idx`` or legacy ``_ids.npy/_idx.npz``).

    Raises:
        UserError: neither pair exists, the index is unsound (``check_index``), the ``.bin`` is empty
            (paddlenlp cannot map it), or the index cannot be read.
    """
    if not (_has_pair(prefix) or _has_legacy_pair(prefix)):
        raise UserError(f"{prefix}: no {prefix}.bin/.idx (or _ids.npy/_idx.npz) pair; check the prefix")
    if not _has_legacy_pair(prefix):  # paddlenlp's make_dataset reads the legacy pair when both exist
        check_index(prefix + ".idx")
        if os.path.getsize(prefix + ".bin") == 0:
            raise UserError(f"{prefix}.bin: 0 bytes, it holds no tokens; recreate it with create_pretraining_data.py")
    try:
        return _paddlenlp().make_dataset(prefix, "mmap", skip_warmup=True)
    except (AssertionError, ValueError, OSError, struct.error) as e:
        raise UserError(f"{prefix}: cannot read the index ({e}); run inspect_data.py --verify for details") from e


def id_range(ids: np.ndarray) -> tuple:
    """(smallest, largest) id of a 1-D (memory-mapped) id array, read block by block; (0, -1) when empty."""
    smallest, largest = 0, -1
    for start in range(0, ids.size, COPY_BLOCK_TOKENS):
        block = np.asarray(ids[start : start + COPY_BLOCK_TOKENS])
        smallest = min(smallest, int(block.min()))
        largest = max(largest, int(block.max()))
    return smallest, largest


def token_range_problem(prefix: str, ids: np.ndarray) -> Optional[str]:
    """Why the token ids ``ids`` of ``prefix`` (``token_ids``) disagree with its ``.stats.json``: an id above
    the recorded ``max_token_id`` or at or above the recorded ``vocab_size``; None when they agree or there
    is no sidecar. Reads every id (``id_range``): for ``inspect_data.py --verify``, not for every run.

    Raises:
        UserError: the sidecar is unreadable (see ``read_stats``).
    """
    stats = read_stats(prefix)
    if stats is None:
        return None
    smallest, largest = id_range(ids)
    recorded, vocab = stats.get("max_token_id"), stats.get("vocab_size")
    if smallest < 0:
        return f"{prefix}.bin holds the negative token id {smallest}"
    if isinstance(recorded, int) and largest > recorded:
        return f"{prefix}.bin holds token id {largest} but {prefix}.stats.json says the largest is {recorded}"
    if isinstance(vocab, int) and largest >= vocab:
        return f"{prefix}.bin holds token id {largest}, beyond the {vocab}-token vocabulary {prefix}.stats.json records"
    return None


def token_ids(dataset) -> np.ndarray:
    """All ids of a dataset from ``open_dataset`` as one 1-D memory-mapped array (nothing is read yet)."""
    if isinstance(dataset, _paddlenlp().CompatibleIndexedDataset):
        return dataset._token_ids
    return np.frombuffer(dataset._bin_buffer, dtype=dataset._index.dtype)


def verify(prefix: str) -> list:
    """Check that the index matches the token file. Returns the problems found (empty when sound).

    Checks: header (magic, version, dtype); ``.idx`` size; ``.bin`` size == sum(sizes) x itemsize;
    pointers == byte offsets of the sizes; ``doc_idx`` starts at 0, never decreases, ends at the item
    count; and, when present, the ``.stats.json`` counts.
    """
    if _has_legacy_pair(prefix) and not _has_pair(prefix):
        return _verify_legacy(prefix)
    idx_path, bin_path = prefix + ".idx", prefix + ".bin"
    if not (os.path.isfile(idx_path) and os.path.isfile(bin_path)):
        return [f"{prefix}: no .bin/.idx pair"]
    problem, dtype, items, doc_idx_len = _index_header(idx_path)
    if problem:
        return [problem]
    index = read_index(idx_path)
    sizes = index.sizes.astype(np.int64)
    problems = []
    itemsize = np.dtype(dtype).itemsize
    expected_bin = int(sizes.sum()) * itemsize
    if os.path.getsize(bin_path) != expected_bin:
        problems.append(
            f"{bin_path}: {os.path.getsize(bin_path)} bytes, the index needs {expected_bin} "
            f"({int(sizes.sum())} tokens of {np.dtype(dtype).name})"
        )
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]) * itemsize if items else np.zeros(0, np.int64)
    if not np.array_equal(index._pointers, offsets):
        problems.append(
            f"{idx_path}: pointers disagree with sizes at item {int(np.argmax(index._pointers != offsets))}"
        )
    problems += _check_doc_idx(idx_path, np.asarray(index.doc_idx), items)
    problems += _check_stats(prefix, documents=doc_idx_len - 1, tokens=int(sizes.sum()))
    del index
    return problems


def _verify_legacy(prefix: str) -> list:
    try:
        ids = np.load(prefix + "_ids.npy", mmap_mode="r")
    except (ValueError, EOFError) as e:  # numpy's errors for a file that is not an .npy array
        return [f"{prefix}_ids.npy is not a numpy array file ({e})"]
    try:
        index = np.load(prefix + "_idx.npz")
    except (ValueError, EOFError, zipfile.BadZipFile) as e:
        return [f"{prefix}_idx.npz is not a numpy .npz archive ({e})"]
    if "lens" not in index or "docs" not in index:
        return [f"{prefix}_idx.npz: needs arrays 'lens' and 'docs', has {sorted(index.files)}"]
    lens, docs = index["lens"].astype(np.int64), index["docs"].astype(np.int64)
    problems = []
    if ids.ndim != 1 or ids.size != lens.sum():
        problems.append(
            f"{prefix}_ids.npy: {ids.size} ids in shape {ids.shape}, the index needs {int(lens.sum())} in 1-D"
        )
    problems += _check_doc_idx(prefix + "_idx.npz", docs, lens.size)
    return problems + _check_stats(prefix, documents=docs.size - 1, tokens=int(lens.sum()))


def _check_doc_idx(path: str, doc_idx: np.ndarray, items: int) -> list:
    if doc_idx.size == 0 or doc_idx[0] != 0 or doc_idx[-1] != items or np.any(np.diff(doc_idx) < 0):
        return [f"{path}: the document index must rise from 0 to the item count {items}"]
    return []


def _check_stats(prefix: str, documents: int, tokens: int) -> list:
    stats = read_stats(prefix)
    if stats is None:
        return []
    found = {"documents": documents, "tokens": tokens}
    return [
        f"{prefix}.stats.json: {key} {stats[key]} but the index holds {value}"
        for key, value in found.items()
        if key in stats and stats[key] != value
    ]


def merge_stats(all_stats: list, extra: dict) -> dict:
    """Stats of a concatenation: counts summed, the largest max_token_id and vocab_size, tokenizers joined."""
    tokenizers = sorted({str(s["tokenizer"]) for s in all_stats})
    merged = {
        "documents": sum(s["documents"] for s in all_stats),
        "tokens": sum(s["tokens"] for s in all_stats),
        "max_token_id": max(s["max_token_id"] for s in all_stats),
        "dtype": all_stats[0]["dtype"],
        "vocab_size": max(s["vocab_size"] for s in all_stats),
        "tokenizer": tokenizers[0] if len(tokenizers) == 1 else tokenizers,
    }
    return {**merged, **extra}


def _same_prefix(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def merge(prefixes: list, output_prefix: str) -> dict:
    """Concatenate the documents of ``prefixes`` (in order) into ``output_prefix``.bin/.idx.

    Writes a merged ``.stats.json`` when every input has one.

    Returns:
        ``{"documents", "items", "tokens", "dtype", "bytes"}`` of the output.

    Raises:
        UserError: an input is missing, unsound (the first problem ``verify`` finds: header, sizes,
            pointers, document index, stats sidecar) or is ``output_prefix`` itself, or the inputs'
            dtypes differ (the message names both).
    """
    if not prefixes:
        raise UserError("merge: no input prefix given")
    indexes = []
    for prefix in prefixes:
        if not _has_pair(prefix):
            raise UserError(
                f"merge: {prefix}.bin/.idx does not exist (convert legacy pairs first with convert_legacy.py)"
            )
        if _same_prefix(prefix, output_prefix):
            raise UserError(
                f"merge: input {prefix} is also --output_prefix; merging a prefix into itself would read back "
                "its own output: write to another prefix"
            )
        problems = verify(prefix)  # the tokens are copied as they are: a short .bin would shift every later item
        if problems:
            raise UserError(
                f"merge: {problems[0]}; the pair is corrupt or truncated: recreate it "
                "(inspect_data.py --verify lists every problem)"
            )
        indexes.append(read_index(prefix + ".idx"))
    dtype = indexes[0].dtype
    for prefix, index in zip(prefixes, indexes):
        if index.dtype != dtype:
            raise UserError(
                f"merge: {prefix} holds {np.dtype(index.dtype).name} tokens "
                f"but {prefixes[0]} holds {np.dtype(dtype).name}; "
                "re-run create_pretraining_data.py with the same --dtype for all inputs"
            )
    all_stats = [read_stats(prefix) for prefix in prefixes]
    with_stats = all(s is not None for s in all_stats)
    with indexed_outputs(output_prefix, with_stats) as (tmp_bin, tmp_idx, tmp_stats):
        writer = IndexedWriter(tmp_bin, dtype)
        for prefix, index in zip(prefixes, indexes):
            writer.append_file(prefix + ".bin", dtype, index.sizes, index.doc_idx)
        writer.finalize(tmp_idx)
        if with_stats:
            write_stats(tmp_stats, merge_stats(all_stats, {"merged_from": list(prefixes)}))
    return _summary(output_prefix, writer)


def convert_legacy(prefix: str, output_prefix: str, dtype) -> dict:
    """Convert ``<prefix>_ids.npy`` + ``<prefix>_idx.npz`` to ``<output_prefix>``.bin/.idx.

    Args:
        dtype: output token dtype; None picks uint16 when the largest id fits, else int32.

    Returns:
        ``{"documents", "items", "tokens", "dtype", "bytes", "max_token_id"}`` of the output.

    Raises:
        UserError: the pair is missing or inconsistent (see ``verify``), an id is negative, or an
            id does not fit ``dtype``.
    """
    if not _has_legacy_pair(prefix):
        raise UserError(f"convert_legacy: {prefix}_ids.npy and {prefix}_idx.npz do not both exist")
    problems = _verify_legacy(prefix)
    if problems:
        raise UserError(f"convert_legacy: {problems[0]}")
    ids = np.load(prefix + "_ids.npy", mmap_mode="r")
    index = np.load(prefix + "_idx.npz")
    smallest, largest = id_range(ids)
    if smallest < 0:
        raise UserError(
            f"convert_legacy: {prefix}_ids.npy holds a negative token id ({smallest}); it is not a token file"
        )
    out_dtype = dtype or (np.uint16 if largest <= np.iinfo(np.uint16).max else np.int32)
    check_token_range(largest, out_dtype, f"{prefix}_ids.npy")
    with indexed_outputs(output_prefix, with_stats=False) as (tmp_bin, tmp_idx, _):
        writer = IndexedWriter(tmp_bin, out_dtype)
        writer.append_file(prefix + "_ids.npy", ids.dtype, index["lens"], index["docs"])
        writer.finalize(tmp_idx)
    return {**_summary(output_prefix, writer), "max_token_id": largest}


def _summary(output_prefix: str, writer: IndexedWriter) -> dict:
    written = sum(os.path.getsize(output_prefix + suffix) for suffix in (".bin", ".idx"))
    summary = {
        "documents": writer.documents,
        "items": len(writer.sizes),
        "tokens": writer.tokens,
        "dtype": writer.dtype.name,
        "bytes": written,
    }
    logger.info(f"wrote {output_prefix}.bin/.idx: {summary}")
    return summary


@dataclass
class DataSummary:
    """One tokenized file pair as read from its index (token counts in tokens).

    ``max_token_id`` comes from the ``<prefix>.stats.json`` sidecar written by preprocessing when
    the sidecar still describes the token file, else from a scan of the token file bounded to
    ``SCAN_BYTES`` per end.
    """

    prefix: str
    documents: int
    tokens: int
    dtype: str  # numpy's name of the token dtype
    split_documents: list  # [train, valid, test] documents
    max_token_id: Optional[int] = None  # None: not read (the pair holds no tokens)
    max_token_id_source: str = "not checked"  # "sidecar", "full scan" or "bounded scan ..."


def _token_file(prefix: str) -> tuple:
    """(path, every token id as a 1-D array read lazily) of a prefix's token file (.bin or _ids.npy)."""
    if prefix_format(prefix) == (".bin", ".idx"):
        path = prefix + ".bin"
        dtype = read_index(prefix + ".idx").dtype
        count = os.path.getsize(path) // np.dtype(dtype).itemsize
        return path, np.memmap(path, dtype=dtype, mode="r", shape=(count,)) if count else np.zeros(0, dtype)
    path = prefix + "_ids.npy"
    return path, np.load(path, mmap_mode="r")


def _stale_sidecar(stats: dict, sidecar: str, token_path: str, ids: np.ndarray) -> Optional[str]:
    """Why the sidecar no longer describes the token file (its token count, or a token file written
    after it), or None when it still does. Sidecars without a token count are judged by time alone."""
    if "tokens" in stats and stats["tokens"] != ids.size:
        return f"it counts {stats['tokens']} tokens, {os.path.basename(token_path)} holds {ids.size}"
    if os.path.getmtime(token_path) > os.path.getmtime(sidecar):
        return f"{os.path.basename(token_path)} was written after it"
    return None


def current_stats(prefix: str) -> Optional[dict]:
    """The ``<prefix>.stats.json`` dict while it still describes the token file, else None (none, or stale).

    Raises:
        UserError: the sidecar is not a JSON object (see ``read_stats``).
    """
    stats = read_stats(prefix)
    if stats is None:
        return None
    token_path, ids = _token_file(prefix)
    return None if _stale_sidecar(stats, prefix + ".stats.json", token_path, ids) else stats


def _max_token_id(prefix: str) -> tuple:
    """(largest token id, how it was found): the stats sidecar when it still describes the token file,
    else a scan bounded to SCAN_BYTES per end (a stale sidecar is named in how).

    Raises:
        UserError: a current sidecar disagrees with the token file's dtype or has no usable max_token_id.
    """
    sidecar = prefix + ".stats.json"
    token_path, ids = _token_file(prefix)
    stats = read_stats(prefix)
    stale = _stale_sidecar(stats, sidecar, token_path, ids) if stats is not None else None
    if stats is not None and stale is None:
        if stats.get("dtype", ids.dtype.name) != ids.dtype.name:
            raise UserError(
                f"input_dir: {sidecar} says dtype {stats['dtype']} but {token_path} holds {ids.dtype.name}; "
                "the sidecar is stale: re-run create_pretraining_data.py"
            )
        try:
            return int(stats["max_token_id"]), "sidecar"
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(
                f"input_dir: {sidecar} has no usable max_token_id ({e}); delete it or re-run create_pretraining_data.py"
            ) from e
    ignored = f" ({os.path.basename(sidecar)} ignored: {stale})" if stale else ""
    per_end = SCAN_BYTES // ids.dtype.itemsize
    if ids.size <= 2 * per_end:
        return int(ids.max()), f"full scan{ignored}"
    largest = max(int(ids[:per_end].max()), int(ids[-per_end:].max()))
    why = ignored or f" (no {os.path.basename(sidecar)})"
    return largest, f"bounded scan of the first and last {SCAN_BYTES // 2**20} MiB{why}"


def index_counts(prefix: str) -> tuple:
    """(documents, tokens, dtype name) from a prefix's index (.idx, or _idx.npz with its _ids.npy)."""
    if prefix_format(prefix) == (".bin", ".idx"):
        index = read_index(prefix + ".idx")
        return len(index.doc_idx) - 1, int(index.sizes.sum(dtype=np.int64)), np.dtype(index.dtype).name
    with np.load(prefix + "_idx.npz") as index:
        documents, tokens = len(index["docs"]) - 1, int(index["lens"].sum(dtype=np.int64))
    return documents, tokens, np.load(prefix + "_ids.npy", mmap_mode="r").dtype.name


def summarize_prefix(prefix: str, split: str) -> DataSummary:
    """Counts, dtype, split and largest token id of a sound ``.bin/.idx`` or ``_ids.npy/_idx.npz`` pair
    (check it with ``pretrain.corpus.verify`` first).

    Raises:
        UserError: ``split`` is not three comma-separated non-negative numbers, or the stats
            sidecar is unusable (see ``_max_token_id``).
        OSError: a file cannot be read.
    """
    documents, tokens, dtype = index_counts(prefix)
    try:
        bounds = _causal_dataset().get_train_valid_test_split_(split, documents)
    except (ValueError, AssertionError) as e:
        raise UserError(f"split: '{split}' is not three comma-separated non-negative numbers ({e})") from e
    summary = DataSummary(prefix, documents, tokens, dtype, [int(b - a) for a, b in zip(bounds[:-1], bounds[1:])])
    if summary.tokens:
        summary.max_token_id, summary.max_token_id_source = _max_token_id(prefix)
    return summary
