"""Loading a tokenizer from a local directory, offline: LLaMA (SentencePiece), GPT-3 (GPT-2 BPE), Qwen (tiktoken).

A directory is read through paddlenlp's ``AutoTokenizer``: it holds ``tokenizer_config.json`` naming
``tokenizer_class`` and that class's vocabulary files. For the families in ``FAMILY_FILES`` the
files are checked first, so a missing one is reported by name (instead of as paddlenlp's attempt
to download it), and a LLaMA folder may hold ``tokenizer.model`` as Hugging Face folders do.
"""

from __future__ import annotations

import json
import os

from paddlenlp.transformers import AutoTokenizer

from pretrain.errors import UserError
from pretrain.registry import FAMILIES, find_architecture

TOKENIZER_CONFIG = "tokenizer_config.json"
# tokenizer class -> {constructor argument: file names accepted for it, in order of preference}.
# LLaMA: paddlenlp saves ``sentencepiece.bpe.model``; Hugging Face folders ship ``tokenizer.model``.
FAMILY_FILES = {
    "LlamaTokenizer": {"vocab_file": ("sentencepiece.bpe.model", "tokenizer.model")},
    "GPTTokenizer": {"vocab_file": ("vocab.json",), "merges_file": ("merges.txt",)},
    "QWenTokenizer": {"vocab_file": ("qwen.tiktoken",)},
}


def _config_class(path: str) -> str:
    config_path = os.path.join(path, TOKENIZER_CONFIG)
    if not os.path.isfile(config_path):
        examples = "; ".join(f"{name}: {_describe(name)}" for name in FAMILY_FILES)
        raise UserError(
            f"tokenizer_name_or_path: {path} has no {TOKENIZER_CONFIG}; write one naming the class, "
            f'e.g. {{"tokenizer_class": "LlamaTokenizer", "eos_token": "</s>"}}, next to its files ({examples})'
        )
    try:
        with open(config_path, encoding="utf-8") as f:
            return json.load(f).get("tokenizer_class")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise UserError(f"{config_path}: not a JSON object ({e}); fix it or write it anew") from e


def _describe(family: str) -> str:
    return " + ".join(" or ".join(names) for names in FAMILY_FILES[family].values())


def _family_files(path: str, family: str) -> dict:
    """{constructor argument: path of the first accepted file present} for ``family``.

    Raises:
        UserError: a file the family needs is missing (the message names the accepted names).
    """
    found = {}
    for argument, names in FAMILY_FILES.get(family, {}).items():
        present = [name for name in names if os.path.isfile(os.path.join(path, name))]
        if not present:
            raise UserError(
                f"tokenizer_name_or_path: {path} holds a {family} ({TOKENIZER_CONFIG}) but not its vocabulary; "
                f"put {_describe(family)} in it"
            )
        found[argument] = os.path.join(path, present[0])
    return found


def load_tokenizer_from(path: str):
    """Load a paddlenlp tokenizer from a local directory through ``AutoTokenizer``.

    Returns:
        A paddlenlp ``PretrainedTokenizer``.

    Raises:
        UserError: the directory does not exist (a registry name gets the list of files its family's
            tokenizer needs and where they come from offline) or has no ``tokenizer_config.json``; it lacks a
            vocabulary file its tokenizer class needs (the message names the files); or paddlenlp
            cannot load what is there.
    """
    if not os.path.isdir(path):
        arch = find_architecture(path)
        if arch is not None:
            impl = arch.implementation
            raise UserError(
                f"no tokenizer folder: {path!r} names the {arch.name} architecture and no model hub is reachable; "
                f"set tokenizer_name_or_path to a local folder with {', '.join(impl.tokenizer_files())} "
                f"({impl.tokenizer_class.__name__}; offline source: {FAMILIES[arch.family].tokenizer_source})"
            )
        raise UserError(
            f"tokenizer_name_or_path: {path} is not a directory; point it at a local folder with the tokenizer files "
            "(e.g. data/demo/tokenizer from `make data`, or tools/preprocess/fetch_tokenizers.py for LLaMA/GPT-3/Qwen)"
        )
    files = _family_files(path, _config_class(path))
    try:
        return AutoTokenizer.from_pretrained(path, **files)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(
            f"tokenizer_name_or_path: cannot load a tokenizer from {path} ({e}); it needs "
            f"{TOKENIZER_CONFIG} naming tokenizer_class plus that tokenizer's vocabulary files"
        ) from e


def load_tokenizer(model_args):
    """The run's tokenizer: ``tokenizer_name_or_path``, else ``model_name_or_path`` (see load_tokenizer_from)."""
    return load_tokenizer_from(model_args.tokenizer_name_or_path or model_args.model_name_or_path)
