"""Qwen2's paddlenlp model type, ``qwen2``: LLaMA's decoder with q/k/v biases, grouped-query attention."""

from __future__ import annotations

from typing import Optional

from paddlenlp.transformers import PretrainedConfig, Qwen2Config, Qwen2ForCausalLM, Qwen2ForCausalLMPipe, QWenTokenizer

from pretrain.families.common import (
    LLAMA_UNITS,
    ROPE_DECODER_FIELDS,
    plain_rope,
    rope_decoder_shape,
    rope_unsupported,
    unsupported,
)
from pretrain.families.records import DecoderShape, Family, HFFormat, Implementation, PublishedTokenizer


def _qwen2_shape(config: PretrainedConfig) -> DecoderShape:
    return rope_decoder_shape(config, qkv_bias=True)


def qwen2_unimportable(hf_config: dict) -> Optional[str]:
    return rope_unsupported(hf_config, {"default": ()}) or unsupported(
        hf_config, {"use_sliding_window": (False,), "hidden_act": ("silu",)}
    )


def qwen2_config_from_hf(hf_config: dict) -> dict:
    return {"rope_theta": float(hf_config["rope_parameters"]["rope_theta"])}


def qwen2_hf_config(config) -> dict:
    fields = {name: getattr(config, name) for name in ROPE_DECODER_FIELDS}
    return {**fields, "rope_parameters": plain_rope(config.rope_theta), "hidden_act": config.hidden_act}


IMPLEMENTATION = Implementation(
    "qwen2",
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForCausalLMPipe,
    QWenTokenizer,
    read_shape=_qwen2_shape,
    norm="rms",
    recomputed_units={False: LLAMA_UNITS, True: LLAMA_UNITS},
    vocab_replicated_when_indivisible=True,
    lora_layers="qwen2.layers",
    document_mask_forms=("dense", "flashmask"),
    hf=HFFormat(
        "Qwen2ForCausalLM",
        "qwen2",
        ("Qwen2ForCausalLM",),
        qwen2_hf_config,
        unimportable=qwen2_unimportable,
        config_from_hf=qwen2_config_from_hf,
    ),
)


QWEN2 = Family("qwen2", IMPLEMENTATION)
FAMILIES = (QWEN2,)


def qwen2_config(layers, hidden, heads, kv_heads, intermediate, *, vocab, max_positions, tied, eps=1e-6) -> dict:
    return {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "max_position_embeddings": max_positions,
        "rms_norm_eps": eps,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
    }


_QWEN2 = "Yang et al. 2024, Qwen2 Technical Report, Table 1, and the Qwen/Qwen2-{} config.json"
# Qwen2.5: Qwen2's architecture (Qwen2ForCausalLM, model_type qwen2, rope_theta 1e6, no RoPE scaling in the base
# config.json); shapes, vocab, rms_norm_eps, max_position_embeddings and tying from each Qwen/Qwen2.5-{size}
# config.json, the count from its model card ("Number of Parameters"; Qwen Team 2024, Qwen2.5 Technical
# Report, Table 1 gives the same shapes).
_QWEN25 = "the Qwen/Qwen2.5-{} model card (Number of Parameters: {}) and config.json"


MODEL_SIZES = (
    # Qwen2: QKV bias, GQA, RoPE theta 1e6; the two small models tie input and output embeddings.
    QWEN2.size(
        "qwen2-0.5b",
        qwen2_config(24, 896, 14, 2, 4864, vocab=151936, max_positions=32768, tied=True),
        0.49e9,
        _QWEN2.format("0.5B"),
        ("Qwen/Qwen2-0.5B",),
    ),
    QWEN2.size(
        "qwen2-1.5b",
        qwen2_config(28, 1536, 12, 2, 8960, vocab=151936, max_positions=32768, tied=True),
        1.54e9,
        _QWEN2.format("1.5B"),
        ("Qwen/Qwen2-1.5B",),
    ),
    QWEN2.size(
        "qwen2-7b",
        qwen2_config(28, 3584, 28, 4, 18944, vocab=152064, max_positions=131072, tied=False),
        7.62e9,
        _QWEN2.format("7B"),
        ("Qwen/Qwen2-7B",),
    ),
    # Qwen2.5: tied embeddings up to 3B; vocabulary 151936 (0.5B-3B) or 152064 (7B up); eps 1e-5 from 14B.
    QWEN2.size(
        "qwen2.5-0.5b",
        qwen2_config(24, 896, 14, 2, 4864, vocab=151936, max_positions=32768, tied=True),
        0.49e9,
        _QWEN25.format("0.5B", "0.49B"),
        ("Qwen/Qwen2.5-0.5B",),
    ),
    QWEN2.size(
        "qwen2.5-1.5b",
        qwen2_config(28, 1536, 12, 2, 8960, vocab=151936, max_positions=131072, tied=True),
        1.54e9,
        _QWEN25.format("1.5B", "1.54B"),
        ("Qwen/Qwen2.5-1.5B",),
    ),
    QWEN2.size(
        "qwen2.5-3b",
        qwen2_config(36, 2048, 16, 2, 11008, vocab=151936, max_positions=32768, tied=True),
        3.09e9,
        _QWEN25.format("3B", "3.09B"),
        ("Qwen/Qwen2.5-3B",),
    ),
    QWEN2.size(
        "qwen2.5-7b",
        qwen2_config(28, 3584, 28, 4, 18944, vocab=152064, max_positions=131072, tied=False),
        7.61e9,
        _QWEN25.format("7B", "7.61B"),
        ("Qwen/Qwen2.5-7B",),
    ),
    QWEN2.size(
        "qwen2.5-14b",
        qwen2_config(48, 5120, 40, 8, 13824, vocab=152064, max_positions=131072, tied=False, eps=1e-5),
        14.7e9,
        _QWEN25.format("14B", "14.7B"),
        ("Qwen/Qwen2.5-14B",),
    ),
    QWEN2.size(
        "qwen2.5-32b",
        qwen2_config(64, 5120, 40, 8, 27648, vocab=152064, max_positions=131072, tied=False, eps=1e-5),
        32.5e9,
        _QWEN25.format("32B", "32.5B"),
        ("Qwen/Qwen2.5-32B",),
    ),
    QWEN2.size(
        "qwen2.5-72b",
        qwen2_config(80, 8192, 64, 8, 29568, vocab=152064, max_positions=131072, tied=False, eps=1e-5),
        72.7e9,
        _QWEN25.format("72B", "72.7B"),
        ("Qwen/Qwen2.5-72B",),
    ),
    QWEN2.size(
        "qwen2-debug",
        qwen2_config(4, 256, 4, 2, 704, vocab=8064, max_positions=1024, tied=True),
        None,
        "ours: Qwen2 (GQA, tied embeddings) at debug scale",
    ),
)


PUBLISHED = (
    PublishedTokenizer(
        "Qwen2",
        ("qwen2-", "qwen2.5-"),
        "Qwen's byte-level BPE, 151,643 regular tokens (Qwen2 technical report, sec. 3.1)",
        "QWenTokenizer",
        "data/tokenizers/qwen: qwen.tiktoken from PyPI dashscope 2.0.2, the same 151,643 tokens",
        "qwen",
    ),
)
