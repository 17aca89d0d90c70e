"""Parameter counts from a model config, without building the model.

Every supported decoder is described by one ``DecoderShape`` (read from its paddlenlp config by
the reader registered for its ``model_type``), and one formula counts it:

    embedding      V*d                         token embedding table [vocab, hidden]
  + positions      P*d                         learned absolute positions (GPT), else 0
  + L * (
      attention    d*(q + 2*kv) + q*d          Q, K, V and output projections
                   + bias: (q + 2*kv) + d      when the layer has them
      mlp          m*d*f                       m = 3 (gated SwiGLU: gate, up, down) or 2 (up, down)
                   + bias: (m-1)*f + d         when the layer has them
      norms        2 * n                       n = d (RMSNorm) or 2d (LayerNorm weight + bias)
    )
  + final norm     n
  + output head    V*d unless tied to the embedding

with d = hidden size, q = query heads x head size, kv = key/value heads x head size, f = MLP
width, V = vocabulary, L = layers. tests/test_param_count.py pins the formula to the
numel of built paddlenlp models and to the published counts of every registry entry.
"""

from __future__ import annotations

from dataclasses import dataclass

from paddlenlp.transformers import PretrainedConfig

from pretrain.errors import UserError


@dataclass(frozen=True)
class DecoderShape:
    """Everything about a decoder-only transformer that decides its parameter count (elements)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    query_size: int  # query heads x head size
    key_value_size: int  # key/value heads x head size
    mlp_width: int  # hidden units of the MLP
    gated_mlp: bool  # SwiGLU (gate, up, down matrices) instead of up, down
    qkv_bias: bool
    output_bias: bool  # attention output and MLP biases
    norm_has_bias: bool  # LayerNorm instead of RMSNorm
    position_rows: int  # learned absolute position embeddings; 0 for RoPE / ALiBi
    tie_word_embeddings: bool


def _rope_decoder_shape(config: PretrainedConfig, qkv_bias: bool) -> DecoderShape:
    """LLaMA-style (LLaMA, Baichuan, Qwen2): RMSNorm, SwiGLU, no output biases."""
    head_size = config.hidden_size // config.num_attention_heads
    return DecoderShape(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        query_size=config.num_attention_heads * head_size,
        key_value_size=config.num_key_value_heads * head_size,
        mlp_width=config.intermediate_size,
        gated_mlp=True,
        qkv_bias=qkv_bias,
        output_bias=False,
        norm_has_bias=False,
        position_rows=0,
        tie_word_embeddings=config.tie_word_embeddings,
    )


def _llama_shape(config: PretrainedConfig) -> DecoderShape:
    return _rope_decoder_shape(config, qkv_bias=False)


def _qwen2_shape(config: PretrainedConfig) -> DecoderShape:
    return _rope_decoder_shape(config, qkv_bias=True)


def _qwen_shape(config: PretrainedConfig) -> DecoderShape:
    """QWen v1: fused QKV with bias over kv_channels per head; intermediate_size = 2 x MLP width."""
    projection = config.kv_channels * config.num_attention_heads
    return DecoderShape(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        query_size=projection,
        key_value_size=projection,
        mlp_width=config.intermediate_size // 2,
        gated_mlp=True,
        qkv_bias=True,
        output_bias=not config.no_bias,
        norm_has_bias=False,
        position_rows=0,
        tie_word_embeddings=config.tie_word_embeddings,
    )


def _gpt_shape(config: PretrainedConfig) -> DecoderShape:
    """GPT: LayerNorm, GELU MLP, biases everywhere, learned positions, head tied to the embedding."""
    return DecoderShape(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        query_size=config.hidden_size,
        key_value_size=config.hidden_size,
        mlp_width=config.intermediate_size,
        gated_mlp=False,
        qkv_bias=True,
        output_bias=True,
        norm_has_bias=True,
        position_rows=config.max_position_embeddings,
        tie_word_embeddings=True,  # GPTForCausalLM always shares the embedding with its LM head
    )


SHAPE_READERS = {"llama": _llama_shape, "qwen": _qwen_shape, "qwen2": _qwen2_shape, "gpt": _gpt_shape}


def decoder_shape(config: PretrainedConfig) -> DecoderShape:
    """The DecoderShape of a paddlenlp config.

    Raises:
        UserError: the config's model_type has no reader in SHAPE_READERS.
    """
    if config.model_type not in SHAPE_READERS:
        raise UserError(f"model_type {config.model_type!r} is not supported; use one of {sorted(SHAPE_READERS)}")
    return SHAPE_READERS[config.model_type](config)


def count_shape_parameters(shape: DecoderShape) -> tuple:
    """(total, input-embedding) parameters of a decoder; the formula is in the module docstring."""
    d, f = shape.hidden_size, shape.mlp_width
    q, kv = shape.query_size, shape.key_value_size
    norm = 2 * d if shape.norm_has_bias else d
    mlp_matrices = 3 if shape.gated_mlp else 2

    attention = d * (q + 2 * kv) + q * d
    attention += (q + 2 * kv) if shape.qkv_bias else 0
    mlp = mlp_matrices * d * f
    if shape.output_bias:
        attention += d
        mlp += (mlp_matrices - 1) * f + d
    layer = attention + mlp + 2 * norm

    embedding = shape.vocab_size * d
    total = embedding + shape.position_rows * d + shape.num_hidden_layers * layer + norm
    if not shape.tie_word_embeddings:
        total += shape.vocab_size * d
    return total, embedding


def count_config_parameters(config: PretrainedConfig) -> tuple:
    """(total, input-embedding) parameters of the full (unsharded) model ``config`` describes.

    Equals the sum of parameter sizes of the model built on one card, without
    building it (so it works for 175B on a laptop).
    """
    return count_shape_parameters(decoder_shape(config))
