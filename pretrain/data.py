"""A run's data: its sources, what each holds, the causal-LM datasets, and the collator.

- ``resolve_data_sources``: ``input_dir`` as ``DataSource(weight, prefix)`` pairs (flattened for
  paddlenlp only by ``paddlenlp_data_prefix``);
- ``summarize_prefix``: documents, tokens, dtype, split and largest token id of a ``.bin/.idx`` pair;
- ``build_datasets``: samples from ``paddlenlp.data.causal_dataset.build_train_valid_test_datasets``,
  each ``max_seq_length + 1`` consecutive tokens of the shuffled, concatenated documents;
- ``collate_causal_lm``: the shift into (input_ids, labels).

Formats read (through paddlenlp's ``indexed_dataset``): ``<prefix>.bin`` + ``<prefix>.idx`` (mmap,
magic ``MMIDIDX``) and the older ``<prefix>_ids.npy`` + ``<prefix>_idx.npz`` pairs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np
from paddle.io import Subset
from paddlenlp.data.causal_dataset import build_train_valid_test_datasets, get_train_valid_test_split_

from pretrain.errors import UserError
from pretrain.preprocess.indexed import read_index, read_stats

# (data file suffix, index file suffix) of each format; a prefix + suffix names the file.
FORMATS = ((".bin", ".idx"), ("_ids.npy", "_idx.npz"))
SCAN_BYTES = 64 * 2**20  # bytes read from each end of a .bin without a stats sidecar


def prefix_format(prefix: str):
    """The (data, index) suffix pair whose files exist for ``prefix``, or None."""
    for data_suffix, index_suffix in FORMATS:
        if os.path.isfile(prefix + data_suffix) and os.path.isfile(prefix + index_suffix):
            return data_suffix, index_suffix
    return None


def _prefixes_in_folder(folder: str) -> list:
    prefixes = []
    for name in sorted(os.listdir(folder)):
        for data_suffix, index_suffix in FORMATS:
            if name.endswith(index_suffix):
                prefix = os.path.join(folder, name[: -len(index_suffix)])
                if not os.path.isfile(prefix + data_suffix):
                    raise UserError(
                        f"input_dir: {prefix + index_suffix} has no matching {prefix + data_suffix}; "
                        "re-run tools/preprocess/create_pretraining_data.py for it or remove it"
                    )
                prefixes.append(prefix)
    return prefixes


class DataSource(NamedTuple):
    """One tokenized corpus of a run and its sampling weight (relative; paddlenlp normalises them)."""

    weight: float
    prefix: str  # path without the .bin/.idx (or _ids.npy/_idx.npz) suffix


def resolve_data_sources(input_dir: str) -> list:
    """The ``DataSource`` list ``input_dir`` names: a folder (every pair in it, equal weights), one
    prefix, or a weighted list ``"w1 prefix1 w2 prefix2 ..."``.

    Raises:
        UserError: a path does not exist, a folder holds no tokenized pair, a weight is not a
            positive number, or a prefix has no .bin/.idx (or _ids.npy/_idx.npz) pair.
    """
    tokens = input_dir.split()
    if len(tokens) > 1:
        if len(tokens) % 2:
            raise UserError(f'input_dir: "{input_dir}" must be "weight prefix" pairs, got an odd number of items')
        sources = []
        for weight_text, prefix in zip(tokens[::2], tokens[1::2]):
            try:
                weight = float(weight_text)
            except ValueError:
                raise UserError(f"input_dir: weight '{weight_text}' before {prefix} is not a number") from None
            if weight <= 0:
                raise UserError(f"input_dir: weight {weight_text} before {prefix} must be positive")
            if prefix_format(prefix) is None:
                raise UserError(f"input_dir: no {prefix}.bin/.idx (or _ids.npy/_idx.npz) pair exists")
            sources.append(DataSource(weight, prefix))
        return sources

    path = tokens[0] if tokens else ""
    if os.path.isdir(path):
        prefixes = _prefixes_in_folder(path)
        if not prefixes:
            raise UserError(
                f"input_dir: folder {path} holds no .bin/.idx or _ids.npy/_idx.npz pair; create one with "
                "tools/preprocess/create_pretraining_data.py (or `make data` for the demo corpus)"
            )
        return [DataSource(1.0, prefix) for prefix in prefixes]
    if prefix_format(path) is not None:
        return [DataSource(1.0, path)]
    raise UserError(
        f"input_dir: {path!r} is neither a folder nor a data prefix with .bin/.idx files; "
        "point it at the folder create_pretraining_data.py wrote to"
    )


def paddlenlp_data_prefix(sources: list) -> list:
    """``data_prefix`` as paddlenlp's dataset builder takes it: ``[prefix]`` for one source, else
    ``[w1, prefix1, w2, prefix2, ...]``."""
    if len(sources) == 1:
        return [sources[0].prefix]
    return [item for source in sources for item in source]


@dataclass
class DataSummary:
    """One tokenized file pair as read from its index (token counts in tokens).

    ``max_token_id`` comes from the ``<prefix>.stats.json`` sidecar written by preprocessing, else
    from a scan of the ``.bin`` bounded to ``SCAN_BYTES`` per end.
    """

    prefix: str
    documents: Optional[int] = None
    tokens: Optional[int] = None
    dtype: Optional[str] = None
    max_token_id: Optional[int] = None
    max_token_id_source: str = "not checked"  # "sidecar", "full scan" or "bounded scan ..."
    split_documents: Optional[list] = None  # [train, valid, test] documents


def _max_token_id(prefix: str, dtype) -> tuple:
    """(largest token id, how it was found): the stats sidecar, or a scan bounded to SCAN_BYTES per end.

    Raises:
        UserError: the sidecar disagrees with the index's dtype or has no usable max_token_id.
    """
    sidecar = prefix + ".stats.json"
    stats = read_stats(prefix)
    if stats is not None:
        if stats.get("dtype", np.dtype(dtype).name) != np.dtype(dtype).name:
            raise UserError(
                f"input_dir: {sidecar} says dtype {stats['dtype']} but {prefix}.idx says {np.dtype(dtype).name}; "
                "the sidecar is stale: re-run create_pretraining_data.py"
            )
        try:
            return int(stats["max_token_id"]), "sidecar"
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(
                f"input_dir: {sidecar} has no usable max_token_id ({e}); delete it or re-run create_pretraining_data.py"
            ) from e
    count = os.path.getsize(prefix + ".bin") // np.dtype(dtype).itemsize
    per_end = SCAN_BYTES // np.dtype(dtype).itemsize
    tokens = np.memmap(prefix + ".bin", dtype=dtype, mode="r", shape=(count,))
    if count <= 2 * per_end:
        return int(tokens.max()), "full scan"
    largest = max(int(tokens[:per_end].max()), int(tokens[-per_end:].max()))
    return largest, f"bounded scan of the first and last {SCAN_BYTES // 2**20} MiB (no {os.path.basename(sidecar)})"


def summarize_prefix(prefix: str, split: str) -> DataSummary:
    """Counts, dtype, split and largest token id of a sound ``.bin/.idx`` pair (check it with
    ``pretrain.preprocess.indexed.verify`` first); an older ``_ids.npy/_idx.npz`` pair is not read.

    Raises:
        UserError: ``split`` is not three comma-separated non-negative numbers, or the stats
            sidecar is stale or unusable (see ``_max_token_id``).
    """
    summary = DataSummary(prefix)
    if prefix_format(prefix) != (".bin", ".idx"):
        summary.max_token_id_source = "not checked (older _ids.npy/_idx.npz format)"
        return summary
    index = read_index(prefix + ".idx")
    summary.dtype = np.dtype(index.dtype).name
    summary.documents = len(index.doc_idx) - 1
    summary.tokens = int(index.sizes.sum(dtype=np.int64))
    try:
        bounds = get_train_valid_test_split_(split, summary.documents)
    except (ValueError, AssertionError) as e:
        raise UserError(f"split: '{split}' is not three comma-separated non-negative numbers ({e})") from e
    summary.split_documents = [int(b - a) for a, b in zip(bounds[:-1], bounds[1:])]
    if summary.tokens:
        summary.max_token_id, summary.max_token_id_source = _max_token_id(prefix, index.dtype)
    return summary


def num_samples_per_split(training_args, layout) -> list:
    """Samples the [train, valid, test] datasets must provide for this run.

    train = max_steps x global batch (micro batch x gradient accumulation x the layout's
    dataset_world_size); valid and test = eval_iters x eval micro batch x dataset_world_size
    (evaluation reads the same eval_iters batches each time, so curves are comparable across evaluations).
    """
    train = training_args.max_steps * layout.global_batch_samples(
        training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps
    )
    evaluation = training_args.eval_iters * training_args.per_device_eval_batch_size * layout.dataset_world_size
    return [train, evaluation, evaluation]


def build_datasets(plan) -> tuple:
    """(train, valid, test) GPT-style datasets of a ``RunPlan``; valid/test are None when their split is empty.

    Run the preflight first (``pretrain.preflight.check_run``): it checks max_steps, that every
    prefix's .bin/.idx pair is sound and non-empty, and that the train (and, with do_eval,
    validation) split holds documents, so nothing here indexes data that cannot be trained on.
    """
    data_args, training_args = plan.data_args, plan.training_args
    num_samples = num_samples_per_split(training_args, plan.layout)
    train, valid, test = build_train_valid_test_datasets(
        data_prefix=paddlenlp_data_prefix(plan.data),
        data_impl=data_args.data_impl,
        splits_string=data_args.split,
        train_val_test_num_samples=num_samples,
        seq_length=data_args.max_seq_length,
        seed=training_args.seed,
        skip_warmup=data_args.skip_warmup,
        share_folder=data_args.share_folder,
        data_cache_path=data_args.data_cache,
    )
    return train, _first(valid, num_samples[1]), _first(test, num_samples[2])


def _first(dataset, num_samples: int):
    """The first ``num_samples`` samples: GPTDataset holds whole epochs, evaluation reads only these."""
    if dataset is None:
        return None
    return Subset(dataset, range(min(len(dataset), num_samples)))


def collate_causal_lm(samples: list) -> dict:
    """Stack samples and shift by one token for next-token prediction.

    Args:
        samples: dicts with ``"text"``: int64 array of ``seq_len + 1`` token ids.

    Returns:
        ``{"input_ids": [batch, seq_len] int64, "labels": [batch, seq_len] int64}`` with
        ``labels[:, t] == input_ids[:, t + 1]`` (the model does not shift).
    """
    tokens = np.stack([sample["text"] for sample in samples]).astype(np.int64)  # [batch, seq_len + 1]
    return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}
