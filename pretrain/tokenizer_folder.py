"""Tokenizer folders, offline: what a folder holds, read without paddlenlp (``import paddlenlp`` takes about 3 s).

A folder holds ``tokenizer_config.json`` naming ``tokenizer_class`` plus that class's vocabulary
files. For the classes in ``TOKENIZER_CLASSES`` (LLaMA SentencePiece, GPT-3/GPT-2 BPE, Qwen and Llama 3 tiktoken)
the files are checked first, so a missing one is reported by name (instead of as paddlenlp's
attempt to download it), and a LLaMA folder may hold ``tokenizer.model`` as Hugging Face folders do.
A folder of any other class that holds a Hugging Face ``tokenizer.json`` (``PreTrainedTokenizerFast``,
``Qwen2Tokenizer``, ... as 2025-26 releases ship them) is read from that file (``pretrain.tokenizer_json``).
The preprocessing tools read folders with ``read_tokenizer_folder`` and encode with the native libraries
(``pretrain.preprocess.native``); ``pretrain.tokenizers`` loads them for training.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from typing import Optional

from pretrain.errors import UserError

TOKENIZER_CONFIG = "tokenizer_config.json"
TOKENIZER_JSON = "tokenizer.json"  # Hugging Face's fast-tokenizer file: read for classes not in TOKENIZER_CLASSES
# The whole tokenizer_config.json beside one's own SentencePiece tokenizer.model (docs/dataset.md).
SENTENCEPIECE_CONFIG = '{"tokenizer_class": "LlamaTokenizer", "eos_token": "</s>"}'


@dataclass(frozen=True)
class TokenizerClass:
    """A paddlenlp tokenizer class this project knows."""

    files: dict  # constructor argument -> file names accepted for it, in order of preference
    # paddlenlp class that gives identical ids and text, faster (proven by tests/test_tokenizers.py); None: none
    fast_class: Optional[str] = None


# paddlenlp saves ``sentencepiece.bpe.model`` for LLaMA; Hugging Face folders ship ``tokenizer.model``.
# LlamaTokenizerFast is not used: paddlenlp 3.0.0b4 cannot convert a SentencePiece model with the
# installed protobuf. QWenTokenizer and Llama3Tokenizer are tiktoken already.
TOKENIZER_CLASSES = {
    "LlamaTokenizer": TokenizerClass({"vocab_file": ("sentencepiece.bpe.model", "tokenizer.model")}),
    "GPTTokenizer": TokenizerClass({"vocab_file": ("vocab.json",), "merges_file": ("merges.txt",)}, "GPTTokenizerFast"),
    "QWenTokenizer": TokenizerClass({"vocab_file": ("qwen.tiktoken",)}),
    # Meta's tiktoken rank file; a tokenizer.json beside it (the Hugging Face form) is not read.
    "Llama3Tokenizer": TokenizerClass({"vocab_file": ("tokenizer.model",)}),
}


@dataclass(frozen=True)
class TokenizerFolder:
    """A checked tokenizer folder."""

    path: str
    tokenizer_class: str  # as named in tokenizer_config.json
    # constructor argument -> path of the file found: for TOKENIZER_CLASSES their files; for another class with a
    # tokenizer.json, {"tokenizer_file": its path} (is_tokenizer_json); else empty
    files: dict
    config: dict  # tokenizer_config.json

    @property
    def is_tokenizer_json(self) -> bool:
        """Read from ``tokenizer.json`` by the Rust ``tokenizers`` library (``pretrain.tokenizer_json``)."""
        return "tokenizer_file" in self.files

    def token(self, key: str) -> Optional[str]:
        """A special token's text from the config (``eos_token``, ...), also when saved as an AddedToken dict."""
        value = self.config.get(key)
        return value.get("content") if isinstance(value, dict) else value


def _describe(tokenizer_class: str) -> str:
    return " + ".join(" or ".join(names) for names in TOKENIZER_CLASSES[tokenizer_class].files.values())


def _read_config(path: str, key: str) -> dict:
    config_path = os.path.join(path, TOKENIZER_CONFIG)
    if not os.path.isfile(config_path):
        examples = "; ".join(f"{name}: {_describe(name)}" for name in TOKENIZER_CLASSES)
        raise UserError(
            f"{key}: {path} has no {TOKENIZER_CONFIG}; write one naming the class, "
            f"e.g. {SENTENCEPIECE_CONFIG}, next to its files ({examples})"
        )
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{config_path}: not a JSON object ({e}); fix it or write it anew") from e
    if not isinstance(config, dict) or not isinstance(config.get("tokenizer_class"), str):
        raise UserError(f'{config_path}: needs a JSON object with "tokenizer_class", e.g. "LlamaTokenizer"')
    return config


def _missing_folder(path: str, key: str) -> UserError:
    """The error for a tokenizer path that is no folder; a registry name gets its tokenizer's offline source.
    ``key`` is the argument the path came from (``model_name_or_path`` when no ``tokenizer_name_or_path`` is set)."""
    with warnings.catch_warnings():  # paddle's import-time warnings would bury the one-line error
        warnings.simplefilter("ignore")
        from pretrain.registry import find_model_size, published_tokenizer  # imports paddlenlp: only here

    arch = find_model_size(path)
    if os.path.isfile(path):
        return UserError(
            f"{key}: {path} is a file; give the folder holding it, with a {TOKENIZER_CONFIG} beside it naming the "
            f"class (for a SentencePiece tokenizer.model: {SENTENCEPIECE_CONFIG})"
        )
    if arch is None and key == "model_name_or_path":
        return UserError(
            f"model_name_or_path: {path} is neither a folder nor an architecture name; point it at the saved "
            "model's folder (its tokenizer is read from there too unless tokenizer_name_or_path is set)"
        )
    if arch is None:
        return UserError(
            f"tokenizer_name_or_path: {path} is not a directory; point it at a local folder with the tokenizer files "
            "(e.g. data/demo/tokenizer from `make data`, or data/tokenizers/* from `make tokenizers`)"
        )
    impl = arch.implementation
    return UserError(
        f"no tokenizer folder: {path!r} names the {arch.name} architecture and no model hub is reachable; "
        f"set tokenizer_name_or_path to a local folder with {', '.join(impl.tokenizer_files())} "
        f"({impl.tokenizer_class.__name__}; offline source: {published_tokenizer(arch.name).offline})"
    )


def read_tokenizer_folder(path: str, key: str = "tokenizer_name_or_path") -> TokenizerFolder:
    """Check a tokenizer folder and say what it holds, without loading a tokenizer. Messages start with
    ``key``, the argument ``path`` came from.

    Raises:
        UserError: the folder does not exist (a registry name gets the files its family's tokenizer
            needs and where they come from offline; a file gets the folder and config to give), has no
            valid ``tokenizer_config.json``, or lacks a vocabulary file its class needs (the message
            names the accepted names).
    """
    if not os.path.isdir(path):
        raise _missing_folder(path, key)
    config = _read_config(path, key)
    tokenizer_class = config["tokenizer_class"]
    found = {}
    known = TOKENIZER_CLASSES.get(tokenizer_class)
    for argument, names in (known.files if known else {}).items():
        present = [name for name in names if os.path.isfile(os.path.join(path, name))]
        if not present:
            raise UserError(
                f"{key}: {path} holds a {tokenizer_class} ({TOKENIZER_CONFIG}) but not its "
                f"vocabulary; put {_describe(tokenizer_class)} in it"
            )
        found[argument] = os.path.join(path, present[0])
    if known is None and os.path.isfile(os.path.join(path, TOKENIZER_JSON)):
        found["tokenizer_file"] = os.path.join(path, TOKENIZER_JSON)
    return TokenizerFolder(path, tokenizer_class, found, config)
