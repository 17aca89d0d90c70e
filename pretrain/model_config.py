"""The model config of a run, resolved offline: architecture, overrides, runtime flags, vocabulary.

``model_name_or_path`` is either
- a local directory holding ``config.json`` (hand-written, or saved by paddlenlp's
  ``save_pretrained`` together with the weights that ``continue_training`` loads; or a Hugging Face
  transformers folder, read by ``pretrain.hf_import``), or
- a registry name or hub-style alias (``llama-7b``, ``meta-llama/Llama-2-7b``, ...; see
  ``pretrain.registry`` and docs/models.md): the published architecture, trained from scratch.

A local directory wins over a registry name of the same spelling. Nothing here touches a model hub.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Optional

from paddlenlp.transformers import PretrainedConfig
from paddlenlp.transformers.configuration_utils import LlmMetaConfig
from paddlenlp.utils.env import CONFIG_NAME

from pretrain.errors import UserError
from pretrain.hf_import import hf_implementation, load_hf_config
from pretrain.mtp import sample_tokens
from pretrain.registry import closest_names, find_model_size, implementation_for

# Those of ARCHITECTURE_OVERRIDES that only some families have (mixtures of experts, DeepSeek's latent attention):
# refused for a model without the key.
FAMILY_OVERRIDES = (
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "n_routed_experts",
    "q_lora_rank",
    "kv_lora_rank",
    "num_nextn_predict_layers",
)
# ModelArguments fields copied onto the model config when set (None keeps the config's value).
ARCHITECTURE_OVERRIDES = (
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    *FAMILY_OVERRIDES,
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
)
# ModelArguments fields copied onto the model config when set, refused for a model without the key, that leave its
# weights as they are (a continued run may change them).
LOSS_OVERRIDES = ("num_nextn_predict_lambda",)
# ModelArguments fields copied onto the model config when set (None keeps the config's value).
FUSION_OVERRIDES = ("fuse_attention_qkv", "fuse_attention_ffn")
VOCAB_MULTIPLE = 128
# The special ids a model config names that generation stops and starts on (pretrain.tokenizers.special_token_ids).
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id")


def token_id_differences(config, token_ids: dict) -> dict:
    """``{key: (config's id, tokenizer's id)}`` for each of ``TOKEN_ID_KEYS`` where the tokenizer names an id
    (``token_ids``: ``pretrain.tokenizers.special_token_ids``) that ``config`` does not: another id, None, or a
    list of ids without it (a list holding it agrees: Llama 3 Instruct's eos_token_id [128001, 128008, 128009]).
    A key the tokenizer has no token for is no difference."""
    differences = {}
    for key in TOKEN_ID_KEYS:
        ours, theirs = getattr(config, key, None), token_ids.get(key)
        if theirs is not None and theirs not in (ours if isinstance(ours, (list, tuple)) else [ours]):
            differences[key] = (ours, theirs)
    return differences


def describe_token_id_differences(differences: dict) -> str:
    """``token_id_differences`` as text: "eos_token_id 151643 (the tokenizer's: 2), bos_token_id ..."."""
    return ", ".join(f"{key} {ours} (the tokenizer's: {theirs})" for key, (ours, theirs) in differences.items())


def set_token_ids(config, token_ids: dict, from_scratch: bool) -> None:
    """Give ``config`` (in place) the tokenizer's begin- and end-of-text ids (``token_ids``:
    ``pretrain.tokenizers.special_token_ids``): ``save_pretrained`` writes them to config.json and
    generation_config.json, ``pretrain.hf_export`` to the transformers folder, and paddlenlp's ``generate``,
    transformers and vLLM stop on the eos id. The model was trained to emit the tokenizer's (the data ends every
    document with it).

    From scratch every key of ``TOKEN_ID_KEYS`` becomes the tokenizer's (None where it has no such token): the
    registry's are paddlenlp's defaults for the published tokenizer (Qwen2's 151643, past a demo vocabulary of
    8,064 rows). Continuing from saved weights, the keys of ``token_id_differences`` do (a key the tokenizer has
    no token for keeps the saved id; ``pretrain.preflight.warn_run`` names what changed).
    """
    keys = TOKEN_ID_KEYS if from_scratch else token_id_differences(config, token_ids)
    for key in keys:
        setattr(config, key, token_ids.get(key))


def padded_vocab_size(tokenizer_vocab_size: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """Smallest multiple of ``multiple`` >= the tokenizer's vocabulary (rows of the embedding).

    A multiple of 128 keeps the embedding and output matmuls on tensor-core friendly shapes and
    divisible by any tensor_parallel_degree up to 128.
    """
    return -(-tokenizer_vocab_size // multiple) * multiple


def load_local_config(path: str) -> PretrainedConfig:
    """The config.json in directory ``path``, as the paddlenlp config class of its ``model_type``.

    Raises:
        UserError: no config.json, invalid JSON, or a model_type we do not support.
    """
    config_file = os.path.join(path, CONFIG_NAME)
    if not os.path.isfile(config_file):
        raise UserError(
            f"model_name_or_path: {path} has no {CONFIG_NAME}; give a directory saved by save_pretrained "
            "or a registry name such as llama-2-7b (docs/models.md)"
        )
    try:
        with open(config_file, encoding="utf-8") as f:
            model_type = json.load(f).get("model_type")
    except (json.JSONDecodeError, AttributeError) as e:
        raise UserError(f"{config_file}: not a JSON object with a model_type ({e})") from e
    hf_impl = hf_implementation(path)
    if hf_impl is not None:  # a Hugging Face transformers folder (pretrain.hf_import)
        return load_hf_config(path, hf_impl)
    return implementation_for(model_type, config_file).config_class.from_pretrained(path)


def resolve_model_config(model_name_or_path: str, continue_training: bool) -> PretrainedConfig:
    """The architecture ``model_name_or_path`` names: a local directory's config.json, else a registry entry.

    Raises:
        UserError: neither a directory nor a registry name (with the closest names); or
            continue_training with a registry name, which has no weights.
    """
    if os.path.isdir(model_name_or_path):
        return load_local_config(model_name_or_path)
    arch = find_model_size(model_name_or_path)
    if arch is None:
        close = closest_names(model_name_or_path)
        hint = f"; did you mean {' or '.join(repr(name) for name in close)}?" if close else ""
        raise UserError(
            f"model_name_or_path: {model_name_or_path!r} is neither a local directory nor a registry name{hint} "
            "(the names are listed in docs/models.md)"
        )
    if continue_training:
        raise UserError(
            f"continue_training needs saved weights, but model_name_or_path {model_name_or_path!r} names the "
            f"{arch.name} architecture and no hub is reachable; point it at a directory written by "
            "save_pretrained, or set continue_training false to train from scratch"
        )
    return arch.model_config()


def architecture_difference(saved: PretrainedConfig, config: PretrainedConfig) -> Optional[tuple]:
    """The first field of ``model_type``, ``vocab_size`` and ``ARCHITECTURE_OVERRIDES`` in which ``config``
    differs from ``saved``, as ``(name, saved value, value)``; None when the shapes are the same."""
    for name in ("model_type", "vocab_size", *ARCHITECTURE_OVERRIDES):
        saved_value, value = getattr(saved, name, None), getattr(config, name, None)
        if saved_value != value:
            return name, saved_value, value
    return None


def check_same_architecture(saved: PretrainedConfig, config: PretrainedConfig, path: str) -> None:
    """Continue-training check: the run's architecture is the one saved in ``path``.

    Raises:
        UserError: an override (or vocab_size) differs from the saved config.json.
    """
    difference = architecture_difference(saved, config)
    if difference:
        name, saved_value, value = difference
        raise UserError(
            f"continue_training: {path} holds a model with {name} {saved_value}, but this run asks for "
            f"{value}; drop the {name} override to continue it, or set continue_training false"
        )


def model_label(model_args, config: PretrainedConfig) -> str:
    """How a run names its model: ``model_name_or_path`` and the family, e.g. ``llama-debug (llama)``;
    once an architecture key overrides the shape, the family first and the overrides over the named
    model, e.g. ``llama (llama-debug with num_hidden_layers 8, hidden_size 512)``."""
    name = model_args.model_name_or_path
    overrides = [f"{key} {getattr(model_args, key)}" for key in ARCHITECTURE_OVERRIDES if getattr(model_args, key)]
    if not overrides:
        return f"{name} ({config.model_type})"
    return f"{config.model_type} ({name} with {', '.join(overrides)})"


def build_model_config(model_args, data_args, training_args, tokenizer_vocab_size: int) -> PretrainedConfig:
    """Resolve the model config: registry entry or config.json, overrides, runtime flags, vocabulary.

    The runtime flags are set the way upstream PaddleNLP's run_pretrain.py sets them: every field of
    ``LlmMetaConfig`` (fused ops, tensor/pipeline/sep/context degrees and ranks, sequence parallel,
    recompute and its granularity, refined recompute, ...) from ``training_args`` through
    ``LlmMetaConfig.set_llm_config``; ``fuse_attention_qkv/ffn`` from ``model_args`` when set.

    Args:
        tokenizer_vocab_size: ``len(tokenizer)``, tokens the tokenizer can emit.

    Returns:
        A paddlenlp config whose ``vocab_size`` is ``model_args.vocab_size`` if given, else (from
        scratch) the tokenizer's vocabulary padded to a multiple of 128, else (continue_training)
        the checkpoint's; the implementation's ``config_fixes`` applied (pretrain.registry).

    Raises:
        UserError: see ``resolve_model_config`` and ``check_same_architecture``; the vocabulary is
            smaller than the tokenizer's; or a ``FAMILY_OVERRIDES`` key the model does not have.
    """
    saved = resolve_model_config(model_args.model_name_or_path, model_args.continue_training)
    config = copy.deepcopy(saved)
    for name in (*ARCHITECTURE_OVERRIDES, *LOSS_OVERRIDES):
        value = getattr(model_args, name)
        if value is not None and name in (*FAMILY_OVERRIDES, *LOSS_OVERRIDES) and not hasattr(saved, name):
            raise UserError(f"{name}: {model_args.model_name_or_path} ({saved.model_type}) has no {name}; drop the key")
        if value is not None:
            setattr(config, name, value)
    # Every LlmMetaConfig field (fused ops, parallel degrees, recompute), as upstream run_pretrain.py does.
    LlmMetaConfig.set_llm_config(config, training_args)
    for name in FUSION_OVERRIDES:
        if getattr(model_args, name) is not None:
            setattr(config, name, getattr(model_args, name))
    for name, value in implementation_for(config.model_type, "model config").config_fixes.items():
        setattr(config, name, value)

    if model_args.vocab_size is not None:
        config.vocab_size = model_args.vocab_size
    elif not model_args.continue_training:
        config.vocab_size = padded_vocab_size(tokenizer_vocab_size)
    if model_args.continue_training:
        check_same_architecture(saved, config, model_args.model_name_or_path)
    if config.vocab_size < tokenizer_vocab_size:
        raise UserError(
            f"vocab_size {config.vocab_size} is smaller than the tokenizer's {tokenizer_vocab_size} tokens; "
            "raise vocab_size or use the tokenizer the model was trained with"
        )

    config.seq_length = sample_tokens(data_args.max_seq_length, config) - 1  # the model's inputs (pretrain.mtp)
    return config
