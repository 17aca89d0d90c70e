"""Tokenizer, model config and model construction, offline.

``model_name_or_path`` is either
- a local directory holding ``config.json`` (hand-written, or saved by paddlenlp's
  ``save_pretrained`` together with the weights that ``continue_training`` loads), or
- a registry name or hub-style alias (``llama-7b``, ``meta-llama/Llama-2-7b``, ...; see
  ``pretrain.registry`` and docs/models.md): the published architecture, trained from scratch.

A local directory wins over a registry name of the same spelling. Nothing here touches a model hub.
"""

from __future__ import annotations

import copy
import json
import os

import paddle
from paddlenlp.transformers import PretrainedConfig
from paddlenlp.utils.env import (
    CONFIG_NAME,
    PADDLE_WEIGHTS_INDEX_NAME,
    PADDLE_WEIGHTS_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
)

from pretrain.errors import UserError
from pretrain.registry import closest_names, find_architecture, implementation_for

# Files save_pretrained writes the weights to (one of them, single-file or sharded with an index).
WEIGHT_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, PADDLE_WEIGHTS_NAME, PADDLE_WEIGHTS_INDEX_NAME)
# ModelArguments fields copied onto the model config when set (None keeps the config's value).
ARCHITECTURE_OVERRIDES = (
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
)
# ModelArguments fields always copied onto the model config (same name on both sides).
RUNTIME_FLAGS = (
    "use_flash_attention",
    "use_fused_rms_norm",
    "use_fast_layer_norm",
    "use_fused_rope",
    "fuse_attention_qkv",
    "fuse_attention_ffn",
    "recompute_granularity",
    "virtual_pp_degree",
)
VOCAB_MULTIPLE = 128


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
    return implementation_for(model_type, config_file).config_class.from_pretrained(path)


def resolve_model_config(model_name_or_path: str, continue_training: bool) -> PretrainedConfig:
    """The architecture ``model_name_or_path`` names: a local directory's config.json, else a registry entry.

    Raises:
        UserError: neither a directory nor a registry name (with the closest names); or
            continue_training with a registry name, which has no weights.
    """
    if os.path.isdir(model_name_or_path):
        return load_local_config(model_name_or_path)
    arch = find_architecture(model_name_or_path)
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


def check_same_architecture(saved: PretrainedConfig, config: PretrainedConfig, path: str) -> None:
    """Continue-training check: the run's architecture is the one saved in ``path``.

    Raises:
        UserError: an override (or vocab_size) differs from the saved config.json.
    """
    for name in ("vocab_size", *ARCHITECTURE_OVERRIDES):
        saved_value, value = getattr(saved, name, None), getattr(config, name, None)
        if saved_value != value:
            raise UserError(
                f"continue_training: {path} holds a model with {name} {saved_value}, but this run asks for "
                f"{value}; drop the {name} override to continue it, or set continue_training false"
            )


def build_model_config(model_args, data_args, training_args, tokenizer_vocab_size: int) -> PretrainedConfig:
    """Resolve the model config: registry entry or config.json, overrides, runtime flags, vocabulary.

    Args:
        tokenizer_vocab_size: ``len(tokenizer)``, tokens the tokenizer can emit.

    Returns:
        A paddlenlp config whose ``vocab_size`` is ``model_args.vocab_size`` if given, else (from
        scratch) the tokenizer's vocabulary padded to a multiple of 128, else (continue_training)
        the checkpoint's; the implementation's ``config_fixes`` applied (pretrain.registry).

    Raises:
        UserError: see ``resolve_model_config`` and ``check_same_architecture``; or the vocabulary
            is smaller than the tokenizer's.
    """
    saved = resolve_model_config(model_args.model_name_or_path, model_args.continue_training)
    config = copy.deepcopy(saved)
    for name in ARCHITECTURE_OVERRIDES:
        value = getattr(model_args, name)
        if value is not None:
            setattr(config, name, value)
    for name in RUNTIME_FLAGS:
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

    config.seq_length = data_args.max_seq_length
    config.recompute = training_args.recompute
    config.sequence_parallel = training_args.sequence_parallel
    config.tensor_parallel_degree = training_args.tensor_parallel_degree
    config.tensor_parallel_rank = training_args.tensor_parallel_rank
    if training_args.pipeline_parallel_degree > 1:
        config.pipeline_parallel_degree = training_args.pipeline_parallel_degree
    return config


def model_dtype(training_args) -> str:
    """Parameter dtype: float16/bfloat16 under AMP level O2 (pure low precision), else float32."""
    if training_args.fp16_opt_level == "O2":
        if training_args.bf16:
            return "bfloat16"
        if training_args.fp16:
            return "float16"
    return "float32"


def model_class_for(config: PretrainedConfig, pipeline_parallel_degree: int) -> type:
    """The paddlenlp causal-LM class for ``config.model_type``: its Pipe class when pipeline_parallel_degree > 1."""
    impl = implementation_for(config.model_type, "model config")
    return impl.pipe_class if pipeline_parallel_degree > 1 else impl.model_class


def build_model(model_args, training_args, config: PretrainedConfig) -> paddle.nn.Layer:
    """Build the causal LM: from ``config`` (random init) or, when continue_training, from saved weights.

    The class is ``model_class_for(config, pipeline_parallel_degree)``.

    Raises:
        UserError: continue_training and the directory holds no weights, or weights whose shapes
            do not fit its config.json.
    """
    model_class = model_class_for(config, training_args.pipeline_parallel_degree)
    dtype = model_dtype(training_args)
    if not model_args.continue_training:
        return model_class.from_config(config, dtype=dtype)

    path = model_args.model_name_or_path
    if not any(os.path.isfile(os.path.join(path, name)) for name in WEIGHT_FILES):
        raise UserError(
            f"continue_training: {path} holds no weights (none of {', '.join(WEIGHT_FILES)}); point "
            "model_name_or_path at a directory written by save_pretrained (e.g. a run's output_dir)"
        )
    try:
        return model_class.from_pretrained(path, config=config, dtype=dtype)
    except RuntimeError as e:
        if "Error(s) in loading state_dict" not in str(e):
            raise
        detail = next((line.strip() for line in str(e).splitlines()[1:] if line.strip()), "")
        raise UserError(f"continue_training: the weights in {path} do not fit its {CONFIG_NAME} ({detail})") from e
