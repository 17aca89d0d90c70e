"""Supervised fine-tuning data: src/tgt pairs -> tokenized, masked, truncated (and packed) sequences.

Format (PaddleNLP's fine-tuning format): ``train.json`` and ``dev.json`` (or ``.jsonl``) in one folder,
one JSON object per line::

    {"src": "Verse: In the beginning God created the heaven and the earth.\\nBook:", "tgt": "Genesis"}
    {"src": ["first prompt", "second prompt"], "tgt": ["first answer", "second answer"]}

A list is a conversation: turn i is ``src[i]`` then ``tgt[i]``. An example's tokens are, turn by turn,
the prompt's and the response's followed by ``eos``; the tokenizer's special tokens (LLaMA's ``bos``
when its config asks for it) are added once, before the first prompt. The loss is taken on the
response tokens (and their ``eos``) only: every prompt token's label is -100, which paddlenlp's
causal-LM criteria ignore.

Sequences: an example of more than ``max_seq_length + 1`` tokens is cut at the end (counted as
truncated; dropped and counted if no response token is left), then shifted into ``input_ids`` and
``labels`` of at most ``max_seq_length`` tokens each (``labels[t]`` is the token after
``input_ids[t]``, or -100). The collator pads every batch to ``max_seq_length``, so a step always
processes micro batch x max_seq_length tokens (the count FlagPerf's LoRA case reports).
With ``zero_padding`` paddlenlp's ``ZeroPaddingMapDataset`` packs consecutive examples into one
sequence of at most ``max_seq_length`` tokens, with a block-diagonal causal attention mask (no
attention between examples) and ``position_ids`` restarting at 0 for each example, so a packed
example sees exactly what it would alone. (paddlenlp's other packing mask,
``attn_mask_startend_row_indices`` (FlashMask), needs flash attention on a GPU; it is not used here.)
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
from paddlenlp.data import DataCollatorForSeq2Seq
from paddlenlp.datasets import MapDataset, ZeroPaddingMapDataset

from pretrain.errors import UserError

IGNORE_INDEX = -100  # label of a token the loss skips (paddlenlp's criteria default)
SPLIT_FILES = {"train": ("train.json", "train.jsonl"), "dev": ("dev.json", "dev.jsonl")}


@dataclass(frozen=True)
class Example:
    """One supervised example: prompts and responses, turn by turn (equal lengths, at least one turn)."""

    sources: tuple
    targets: tuple


def split_file(folder: str, split: str) -> Optional[str]:
    """The path of ``split`` ("train" or "dev") in ``folder`` (``<split>.json`` or ``.jsonl``), or None."""
    for name in SPLIT_FILES[split]:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    return None


def _turns(value, path: str, line: int, key: str) -> tuple:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value and all(isinstance(turn, str) for turn in value):
        return tuple(value)
    raise UserError(f"{path}:{line}: '{key}' must be a string or a non-empty list of strings, got {value!r:.60}")


def read_examples(path: str) -> list:
    """The ``Example`` of every non-blank line of a jsonl file.

    Raises:
        UserError: naming the file and line: not UTF-8, not JSON, not an object, ``src`` or ``tgt`` missing or
            not a string / list of strings, lists of different lengths; or the file holds no example,
            does not exist or is a folder.
    """
    if os.path.isdir(path):
        inside = split_file(path, "dev") or split_file(path, "train")
        example = f", e.g. {inside}" if inside else ""
        raise UserError(f"{path} is a folder; give one of its jsonl files of src/tgt pairs{example}")
    if not os.path.isfile(path):
        raise UserError(f"{path} does not exist; give a jsonl file of src/tgt pairs")
    examples = []
    with open(path, "rb") as f:
        for line_number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(
                    f"{path}:{line_number}: not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1}); "
                    "save the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(
                    f"{path}:{line_number}: not valid JSON ({e.msg}); write one JSON object per line"
                ) from None
            if not isinstance(record, dict) or "src" not in record or "tgt" not in record:
                raise UserError(
                    f'{path}:{line_number}: each line must be an object with "src" and "tgt", got {str(record)[:60]!r}'
                )
            sources = _turns(record["src"], path, line_number, "src")
            targets = _turns(record["tgt"], path, line_number, "tgt")
            if len(sources) != len(targets):
                raise UserError(
                    f"{path}:{line_number}: 'src' has {len(sources)} turns but 'tgt' has {len(targets)}; "
                    "give one response per prompt"
                )
            examples.append(Example(sources, targets))
    if not examples:
        raise UserError(f"{path}: holds no example; write one {{'src': ..., 'tgt': ...}} object per line")
    return examples


def tokenize_example(tokenizer, example: Example, max_seq_length: int) -> tuple:
    """Tokenize, mask the prompts and truncate one example (see the module docstring).

    Returns:
        ``(features, truncated)``: ``features`` is ``{"input_ids", "labels", "position_ids"}``,
        int lists of one length <= ``max_seq_length`` (labels shifted: ``labels[t]`` is the token
        after ``input_ids[t]`` or -100), or None when truncation left no response token;
        ``truncated`` says whether tokens were cut.
    """
    token_ids, labels = [], []  # labels here are unshifted: the token itself, or -100 for prompt tokens
    for turn, (source, target) in enumerate(zip(example.sources, example.targets)):
        prompt = tokenizer(source, add_special_tokens=turn == 0)["input_ids"]
        response = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        token_ids += prompt + response
        labels += [IGNORE_INDEX] * len(prompt) + response
    truncated = len(token_ids) > max_seq_length + 1
    token_ids, labels = token_ids[: max_seq_length + 1], labels[: max_seq_length + 1]
    input_ids, shifted = token_ids[:-1], labels[1:]
    if all(label == IGNORE_INDEX for label in shifted):
        return None, truncated
    return {"input_ids": input_ids, "labels": shifted, "position_ids": list(range(len(input_ids)))}, truncated


@dataclass
class TokenizedSplit:
    """One split's sequences and what tokenizing it did (counts in examples or tokens)."""

    dataset: object  # a paddle map-style dataset of feature dicts
    examples: int  # examples read
    truncated: int  # examples cut to max_seq_length + 1 tokens
    dropped: int  # truncated examples with no response token left (not trained on)
    sequences: int  # training sequences (fewer than the examples kept when packed)
    tokens: int  # input tokens of the kept examples, padding excluded
    label_tokens: int  # tokens the loss is taken on

    def describe(self, max_seq_length: int) -> str:
        """The counts in words, for the log."""
        return (
            f"{self.examples} examples ({self.truncated} truncated to {max_seq_length} tokens, {self.dropped} "
            f"left without a response token and dropped) in {self.sequences} sequences, "
            f"{self.label_tokens} tokens in the loss"
        )

    def summary(self, prefix: str, max_seq_length: int) -> dict:
        """The counts as run-summary keys ``<prefix>_examples``, ... and the fraction of the padded
        sequences' tokens that are real (not padding)."""
        return {
            f"{prefix}_examples": self.examples,
            f"{prefix}_truncated_examples": self.truncated,
            f"{prefix}_dropped_examples": self.dropped,
            f"{prefix}_sequences": self.sequences,
            f"{prefix}_label_tokens": self.label_tokens,
            f"{prefix}_real_token_fraction": self.tokens / (self.sequences * max_seq_length)
            if self.sequences
            else None,
        }


def tokenize_split(
    tokenizer, examples: list, max_seq_length: int, zero_padding: bool, seed: Optional[int] = None
) -> TokenizedSplit:
    """Tokenize ``examples`` (shuffled with ``seed`` first unless it is None) into a dataset, packed
    when ``zero_padding``."""
    order = np.random.RandomState(seed).permutation(len(examples)) if seed is not None else range(len(examples))
    features, truncated, dropped = [], 0, 0
    for index in order:
        feature, was_truncated = tokenize_example(tokenizer, examples[index], max_seq_length)
        truncated += was_truncated
        if feature is None:
            dropped += 1
        else:
            features.append(feature)
    tokens = sum(len(feature["input_ids"]) for feature in features)
    label_tokens = sum(label != IGNORE_INDEX for feature in features for label in feature["labels"])
    if zero_padding:
        dataset = ZeroPaddingMapDataset(features, tokenizer, max_seq_length)
    else:
        dataset = MapDataset(features)
    return TokenizedSplit(dataset, len(examples), truncated, dropped, len(dataset), tokens, label_tokens)


def check_split(split: TokenizedSplit, path: str, max_seq_length: int) -> None:
    """Raise when tokenizing left no sequence to train or evaluate on.

    Raises:
        UserError: every example of ``path`` lost its response to truncation (naming the fix).
    """
    if split.examples and not split.sequences:
        raise UserError(
            f"{path}: all {split.examples} examples lose every response token when cut to max_seq_length "
            f"{max_seq_length}; raise max_seq_length or shorten the prompts"
        )


def padding_collator(tokenizer, max_seq_length: int) -> DataCollatorForSeq2Seq:
    """paddlenlp's ``DataCollatorForSeq2Seq`` padding every batch on the right to ``max_seq_length``.

    Returns numpy batches: ``input_ids``, ``labels`` (padding -100), ``position_ids``: [batch, seq]
    int64; ``attention_mask``: [batch, seq] (padding 0; the model adds the causal mask) or, packed,
    [batch, 1, seq, seq] bool (block-diagonal causal). The tokenizer is copied: right padding, and
    ``unk`` as the padding id where it has none (pads are masked and never in the loss).
    """
    padder = copy.copy(tokenizer)
    padder.padding_side = "right"
    if padder.pad_token_id is None:
        padder.pad_token = padder.unk_token if padder.unk_token is not None else padder.eos_token
    return DataCollatorForSeq2Seq(
        padder,
        padding="max_length",
        max_length=max_seq_length,
        label_pad_token_id=IGNORE_INDEX,
        return_tensors="np",
        max_label_length=max_seq_length,
    )
