"""Loading a tokenizer folder for training: through paddlenlp, or, for a Hugging Face ``tokenizer.json`` folder of a
class paddlenlp lacks, through the Rust ``tokenizers`` library (``pretrain.tokenizer_json``); what a folder holds is
``pretrain.tokenizer_folder``'s.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

from pretrain.errors import UserError
from pretrain.tokenizer_folder import TOKENIZER_CLASSES, TOKENIZER_CONFIG, read_tokenizer_folder
from pretrain.tokenizer_json import TokenizerJson


def load_tokenizer_from(path: str, key: str = "tokenizer_name_or_path"):
    """Load a paddlenlp tokenizer from a local directory (the class's fast twin where one is proven equal), or a
    ``tokenizer.json`` folder's ``TokenizerJson``; messages start with ``key``, the argument ``path`` came from.

    Returns:
        A paddlenlp ``PretrainedTokenizer`` (or ``PretrainedTokenizerFast``), or a
        ``pretrain.tokenizer_json.TokenizerJson`` for a folder ``read_tokenizer_folder`` finds a ``tokenizer.json`` in.

    Raises:
        UserError: see ``read_tokenizer_folder``; or paddlenlp (or ``tokenizers``) cannot load what is there.
    """
    folder = read_tokenizer_folder(path, key)
    if folder.is_tokenizer_json:
        return TokenizerJson(folder)
    import paddlenlp.transformers  # about 3 s: only the training side pays it

    known = TOKENIZER_CLASSES.get(folder.tokenizer_class)
    try:
        if known is not None and known.fast_class is not None:
            return getattr(paddlenlp.transformers, known.fast_class).from_pretrained(path, **folder.files)
        return paddlenlp.transformers.AutoTokenizer.from_pretrained(path, **folder.files)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(
            f"{key}: cannot load a tokenizer from {path} ({e}); it needs "
            f"{TOKENIZER_CONFIG} naming tokenizer_class plus that tokenizer's vocabulary files"
        ) from e


def load_tokenizer(model_args):
    """The run's tokenizer: ``tokenizer_name_or_path``, else ``model_name_or_path``.

    Raises:
        UserError: see ``load_tokenizer_from``; the message names the argument the folder came from.
    """
    if model_args.tokenizer_name_or_path:
        return load_tokenizer_from(model_args.tokenizer_name_or_path)
    return load_tokenizer_from(model_args.model_name_or_path, key="model_name_or_path")


def special_token_ids(tokenizer) -> dict:
    """``{"bos_token_id": id, "eos_token_id": id}`` of a paddlenlp tokenizer, None where it names no such token
    (Qwen's tiktoken tokenizer has no BOS). Read from ``special_tokens_map``: the ``bos_token_id`` property logs
    "Using bos_token, but it is not set yet." as an error when there is none.

    The end-of-text id is the one the data ends every document with (``pretrain.preprocess``) and fine-tuning
    every response (``pretrain.finetune.pairs``): the id a trained model emits to stop.
    """
    special = tokenizer.special_tokens_map
    return {
        f"{kind}_id": tokenizer.convert_tokens_to_ids(special[kind]) if special.get(kind) else None
        for kind in ("bos_token", "eos_token")
    }


@contextmanager
def tiktoken_uncached():
    """Stop tiktoken's file loaders (``load_tiktoken_bpe``, ``data_gym_to_mergeable_bpe_ranks``) from
    caching: they key the cache on the path, not the content, and would serve a stale copy after a
    folder's files change."""
    saved = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = saved
