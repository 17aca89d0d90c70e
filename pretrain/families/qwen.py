"""Qwen (v1)'s paddlenlp model type, ``qwen``: fused QKV with bias, RMSNorm, RoPE; exported as transformers' Qwen2."""

from __future__ import annotations

from typing import Optional

from paddlenlp.transformers import PretrainedConfig, QWenConfig, QWenForCausalLM, QWenForCausalLMPipe, QWenTokenizer

from pretrain.families.common import plain_rope, unsupported
from pretrain.families.records import (
    ROPE_ROWS_TWICE_SEQUENCE,
    DecoderShape,
    Family,
    HFFormat,
    Implementation,
    PublishedTokenizer,
    WeightInit,
)


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
        norms_first=True,  # QWenBlock: ln_1, attn, ln_2, mlp
    )


# What QWen v1 recomputes (``common.LLAMA_UNITS``' units): it has no full_attn path.
_QWEN_UNITS = {"full": ("layer",), "full_attn": (), "core_attn": ("core",)}


def _qwen_unimportable(hf_config: dict) -> Optional[str]:
    return unsupported(hf_config, {"rotary_pct": (1.0, 1), "no_bias": (True,)})


def _qwen_hf_config(config) -> dict:
    """Qwen v1 as Qwen2: the same decoder (RMSNorm, RoPE, q/k/v bias, SwiGLU). QWen's intermediate_size
    is twice the MLP width (w1 and w2); dynamic NTK and log-n attention, which paddlenlp's QWen applies
    only past ``seq_length`` tokens, are not carried over."""
    return {
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size // 2,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_attention_heads,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.layer_norm_epsilon,
        "rope_parameters": plain_rope(config.rotary_emb_base),
        "tie_word_embeddings": False,
        "hidden_act": "silu",
    }


def _qwen_unexportable(config) -> Optional[str]:
    if config.rotary_pct != 1.0 or config.kv_channels * config.num_attention_heads != config.hidden_size:
        return "rotary_pct != 1 or kv_channels x heads != hidden_size: no Qwen2ForCausalLM equivalent"
    if not config.no_bias:
        return "no_bias: false (biases on every linear layer): Qwen2ForCausalLM has biases on q/k/v only"
    return None


# paddlenlp QWen (Hugging Face remote-code names, after paddlenlp's mappings) -> transformers Qwen2.
_QWEN_TO_QWEN2 = (
    ("transformer.wte.", "model.embed_tokens."),
    ("transformer.ln_f.", "model.norm."),
    (".ln_1.", ".input_layernorm."),
    (".ln_2.", ".post_attention_layernorm."),
    (".attn.c_proj.", ".self_attn.o_proj."),
    (".mlp.w1.", ".mlp.up_proj."),  # paddlenlp's QWenMLP: swiglu(w2(x), w1(x)) = silu(w2 x) * w1 x
    (".mlp.w2.", ".mlp.gate_proj."),
    (".mlp.c_proj.", ".mlp.down_proj."),
    ("transformer.h.", "model.layers."),
)


def _qwen_to_qwen2(name: str, array, config) -> list:
    """One Qwen v1 tensor (transformers layout) as Qwen2 tensors: renamed; c_attn split into q, k, v."""
    for old, new in _QWEN_TO_QWEN2:
        name = name.replace(old, new)
    if ".attn.c_attn." not in name:
        return [(name, array)]
    prefix, kind = name.split(".attn.c_attn.")  # kind: weight [3 x hidden, hidden] or bias [3 x hidden]
    parts = array.reshape(3, -1, *array.shape[1:])
    return [(f"{prefix}.self_attn.{proj}_proj.{kind}", part) for proj, part in zip("qkv", parts)]


# QWenModel builds its mask from a 2-D padding mask (get_masks): no per-document mask.
IMPLEMENTATION = Implementation(
    "qwen",
    QWenConfig,
    QWenForCausalLM,
    QWenForCausalLMPipe,
    QWenTokenizer,
    read_shape=_qwen_shape,
    norm="rms_qwen",
    recomputed_units={False: _QWEN_UNITS, True: _QWEN_UNITS},
    fused_qkv_always=True,
    rope_table_per_sample=False,
    rope_cache_rows=ROPE_ROWS_TWICE_SEQUENCE,
    init_weights=WeightInit(depth_scaled=("c_proj.weight",)),  # QWenPretrainedModel draws only TP slices
    hf=HFFormat(
        "Qwen2ForCausalLM",
        "qwen2",
        ("QWenLMHeadModel",),
        _qwen_hf_config,
        _qwen_unexportable,
        _qwen_to_qwen2,
        _qwen_unimportable,
    ),
)


QWEN = Family("qwen", IMPLEMENTATION)
FAMILIES = (QWEN,)


def _qwen(layers, hidden, heads, mlp_width, *, vocab, max_positions, seq_length) -> dict:
    # QWen's intermediate_size is twice the MLP width: the model splits it into w1 and w2.
    return {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "kv_channels": hidden // heads,
        "intermediate_size": 2 * mlp_width,
        "vocab_size": vocab,
        "max_position_embeddings": max_positions,
        "seq_length": seq_length,
        "layer_norm_epsilon": 1e-6,
        "rotary_emb_base": 10000,
        "no_bias": True,
        "tie_word_embeddings": False,
    }


_QWEN = "Bai et al. 2023, Qwen Technical Report, Table 3, and the Qwen/Qwen-{} config.json"


MODEL_SIZES = (
    # Qwen (v1): QKV bias, untied embeddings, RoPE base 10000.
    QWEN.size(
        "qwen-7b",
        _qwen(32, 4096, 32, 11008, vocab=151936, max_positions=32768, seq_length=8192),
        7.72e9,
        _QWEN.format("7B"),
        ("qwen/qwen-7b",),
    ),
    QWEN.size(
        "qwen-14b",
        _qwen(40, 5120, 40, 13696, vocab=152064, max_positions=8192, seq_length=2048),
        14.2e9,
        _QWEN.format("14B"),
        ("qwen/qwen-14b",),
    ),
    QWEN.size(
        "qwen-debug",
        _qwen(4, 256, 4, 704, vocab=8064, max_positions=1024, seq_length=1024),
        None,
        "ours: Qwen at debug scale",
    ),
)


PUBLISHED = (
    PublishedTokenizer(
        "Qwen",
        ("qwen-",),
        "tiktoken BPE, 151,643 ranks + 208 special ids",
        "QWenTokenizer",
        "data/tokenizers/qwen: qwen.tiktoken from PyPI dashscope 2.0.2",
        "qwen",
    ),
)
