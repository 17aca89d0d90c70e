"""Causal-LM datasets over tokenized corpora, and the collator that makes (input_ids, labels).

Formats read (through paddlenlp's ``indexed_dataset``): ``<prefix>.bin`` + ``<prefix>.idx`` (mmap,
magic ``MMIDIDX``) and the older ``<prefix>_ids.npy`` + ``<prefix>_idx.npz`` pairs.
Samples come from ``paddlenlp.data.causal_dataset.build_train_valid_test_datasets``: each is
``max_seq_length + 1`` consecutive tokens of the shuffled, concatenated documents.
"""

from __future__ import annotations

import os

import numpy as np
from paddle.io import Subset
from paddlenlp.data.causal_dataset import build_train_valid_test_datasets

from pretrain.errors import UserError

# (data file suffix, index file suffix) of each format; a prefix + suffix names the file.
FORMATS = ((".bin", ".idx"), ("_ids.npy", "_idx.npz"))


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


def resolve_data_prefixes(input_dir: str) -> list:
    """Turn ``input_dir`` into the ``data_prefix`` list paddlenlp's dataset builder takes.

    Accepts a folder (every pair in it, equal weights), one prefix, or a weighted list
    ``"w1 prefix1 w2 prefix2 ..."``.

    Returns:
        ``[prefix]`` for one dataset, else ``[w1, prefix1, w2, prefix2, ...]`` (weights as float).

    Raises:
        UserError: a path does not exist, a folder holds no tokenized pair, a weight is not a
            positive number, or a prefix has no .bin/.idx (or _ids.npy/_idx.npz) pair.
    """
    tokens = input_dir.split()
    if len(tokens) > 1:
        if len(tokens) % 2:
            raise UserError(f'input_dir: "{input_dir}" must be "weight prefix" pairs, got an odd number of items')
        blended = []
        for weight_text, prefix in zip(tokens[::2], tokens[1::2]):
            try:
                weight = float(weight_text)
            except ValueError:
                raise UserError(f"input_dir: weight '{weight_text}' before {prefix} is not a number") from None
            if weight <= 0:
                raise UserError(f"input_dir: weight {weight_text} before {prefix} must be positive")
            if prefix_format(prefix) is None:
                raise UserError(f"input_dir: no {prefix}.bin/.idx (or _ids.npy/_idx.npz) pair exists")
            blended += [weight, prefix]
        return blended

    path = tokens[0] if tokens else ""
    if os.path.isdir(path):
        prefixes = _prefixes_in_folder(path)
        if not prefixes:
            raise UserError(
                f"input_dir: folder {path} holds no .bin/.idx or _ids.npy/_idx.npz pair; create one with "
                "tools/preprocess/create_pretraining_data.py (or `make data` for the demo corpus)"
            )
        if len(prefixes) == 1:
            return prefixes
        return [x for prefix in prefixes for x in (1.0, prefix)]
    if prefix_format(path) is not None:
        return [path]
    raise UserError(
        f"input_dir: {path!r} is neither a folder nor a data prefix with .bin/.idx files; "
        "point it at the folder create_pretraining_data.py wrote to"
    )


def num_samples_per_split(training_args) -> list:
    """Samples the [train, valid, test] datasets must provide for this run.

    train = max_steps x micro batch x gradient accumulation x data-parallel degree;
    valid and test = eval_iters x eval micro batch x data-parallel degree (evaluation reads the
    same eval_iters batches each time, so curves are comparable across evaluations).
    """
    dp = training_args.dataset_world_size
    train = (
        training_args.max_steps
        * training_args.per_device_train_batch_size
        * training_args.gradient_accumulation_steps
        * dp
    )
    evaluation = training_args.eval_iters * training_args.per_device_eval_batch_size * dp
    return [train, evaluation, evaluation]


def build_datasets(data_args, training_args) -> tuple:
    """(train, valid, test) GPT-style datasets; valid/test are None when their split is empty.

    Call ``pretrain.preflight.run_preflight`` first: it checks max_steps, that every prefix's
    .bin/.idx pair is sound and non-empty, and that the train (and, with do_eval, validation)
    split holds documents, so nothing here indexes data that cannot be trained on.

    Raises:
        UserError: see ``resolve_data_prefixes``.
    """
    prefixes = resolve_data_prefixes(data_args.input_dir)
    num_samples = num_samples_per_split(training_args)
    train, valid, test = build_train_valid_test_datasets(
        data_prefix=prefixes,
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
