"""Tokenizer, model config and model construction, offline.

``model_name_or_path`` is a local directory holding ``config.json`` (and the weights saved by
paddlenlp's ``save_pretrained`` when ``continue_training``). Nothing here touches a model hub.
"""

from __future__ import annotations

import os

import paddle
from paddlenlp.transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForCausalLMPipe,
    PretrainedConfig,
)

from pretrain.errors import UserError
from pretrain.tokenizers import load_tokenizer_from

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


def load_tokenizer(model_args):
    """The run's tokenizer: ``tokenizer_name_or_path``, else ``model_name_or_path`` (see load_tokenizer_from)."""
    return load_tokenizer_from(model_args.tokenizer_name_or_path or model_args.model_name_or_path)


def build_model_config(model_args, data_args, training_args, tokenizer_vocab_size: int) -> PretrainedConfig:
    """Resolve the model config: load, apply overrides and runtime flags, derive the vocabulary.

    Args:
        tokenizer_vocab_size: ``len(tokenizer)``, tokens the tokenizer can emit.

    Returns:
        A paddlenlp config whose ``vocab_size`` is ``model_args.vocab_size`` if given, else (from
        scratch) the tokenizer's vocabulary padded to a multiple of 128, else (continue_training)
        the checkpoint's.

    Raises:
        UserError: no config.json in ``model_name_or_path``, or the vocabulary is smaller than
            the tokenizer's.
    """
    path = model_args.model_name_or_path
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise UserError(
            f"model_name_or_path: {path} has no config.json; give a local directory with the model's "
            "config.json (see config/llama/demo-model)"
        )
    config = AutoConfig.from_pretrained(path)
    for name in ARCHITECTURE_OVERRIDES:
        value = getattr(model_args, name)
        if value is not None:
            setattr(config, name, value)
    for name in RUNTIME_FLAGS:
        setattr(config, name, getattr(model_args, name))

    if model_args.vocab_size is not None:
        config.vocab_size = model_args.vocab_size
    elif not model_args.continue_training:
        config.vocab_size = padded_vocab_size(tokenizer_vocab_size)
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


def build_model(model_args, training_args, config: PretrainedConfig) -> paddle.nn.Layer:
    """Build the causal LM: from ``config`` (random init) or, when continue_training, from saved weights.

    Uses the Pipe class of the family when pipeline_parallel_degree > 1.
    """
    model_class = AutoModelForCausalLMPipe if training_args.pipeline_parallel_degree > 1 else AutoModelForCausalLM
    dtype = model_dtype(training_args)
    if model_args.continue_training:
        return model_class.from_pretrained(model_args.model_name_or_path, config=config, dtype=dtype)
    return model_class.from_config(config, dtype=dtype)


def count_parameters(model: paddle.nn.Layer) -> tuple:
    """(total, input-embedding) parameter counts of this rank's shard of ``model``."""
    total = sum(int(p.numel()) for p in model.parameters())
    embedding = int(model.get_input_embeddings().weight.numel())
    return total, embedding
