"""What several family modules share: the LLaMA-style decoder's shape, recompute units and transformers
config fields, and the checks of a transformers config.json (``HFFormat.unimportable``)."""

from __future__ import annotations

from typing import Optional

from paddlenlp.transformers import PretrainedConfig

from pretrain.families.records import DecoderShape

# What each paddlenlp model recomputes for each recompute_granularity (``Implementation.recomputed_units``).
# "layer": the decoder layer (saves its input); "attention": the attention block after its norm (saves the
# norm output); "core": the core attention (saves q, k, v). Read from the models' forward methods:
# llama/qwen2 ``LlamaModel``/``Qwen2Model`` (full), ``...DecoderLayer`` (full_attn), ``...Attention``
# (core_attn); the other types' units are in their modules (QWen v1: qwen.py, GPT: gpt.py).
LLAMA_UNITS = {"full": ("layer",), "full_attn": ("attention",), "core_attn": ("core",)}

# Transformers config.json fields, from a paddlenlp config of each type. LLaMA and Qwen2 name them alike.
ROPE_DECODER_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
)


def rope_decoder_shape(config: PretrainedConfig, qkv_bias: bool) -> DecoderShape:
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


def plain_rope(theta) -> dict:
    """transformers' ``rope_parameters`` of plain RoPE with base ``theta``."""
    return {"rope_type": "default", "rope_theta": float(theta)}


def rope_unsupported(hf_config: dict, supported: dict) -> Optional[str]:
    """Why the RoPE of a transformers config (``rope_parameters``) is not one paddlenlp's model computes:
    ``supported`` maps each rope_type it computes to the keys it needs."""
    rope = hf_config["rope_parameters"]
    if rope["rope_type"] not in supported:
        return (
            f"rope_type {rope['rope_type']!r} ({rope}); paddlenlp's model computes rope_type "
            f"{' or '.join(map(repr, supported))}"
        )
    missing = [key for key in supported[rope["rope_type"]] if key not in rope]
    return f"rope_type {rope['rope_type']!r} without {', '.join(missing)} ({rope})" if missing else None


def unsupported(hf_config: dict, required: dict) -> Optional[str]:
    """The first key of a Hugging Face config.json whose value is not the one paddlenlp's class computes."""
    for key, allowed in required.items():
        value = hf_config.get(key, allowed[0])
        if value not in allowed:
            return f"{key} {value!r} (paddlenlp's model computes {' or '.join(repr(a) for a in allowed)})"
    return None
