"""Qwen3's model type, ``qwen3`` (dense): Qwen2's decoder with per-head q/k RMSNorm, an explicit head_dim and no
q/k/v bias, on this application's ``pretrain.models.qwen3`` classes (paddlenlp 3.0.0b4 has none)."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from paddlenlp.transformers import PretrainedConfig, QWenTokenizer

from pretrain.families.common import LLAMA_UNITS, ROPE_DECODER_FIELDS, plain_rope, rope_decoder_shape, unsupported
from pretrain.families.qwen2 import qwen2_config, qwen2_config_from_hf, qwen2_unimportable
from pretrain.families.records import DecoderShape, Family, HFFormat, Implementation, PublishedTokenizer
from pretrain.models.qwen3 import Qwen3Config, Qwen3ForCausalLM


def qwen3_shape(config: PretrainedConfig) -> DecoderShape:
    """Qwen2's shape at ``head_dim`` (q: heads x head_dim, k/v: kv_heads x head_dim), no q/k/v bias, and the
    two per-head norms of [head_dim] per layer."""
    return replace(
        rope_decoder_shape(config, qkv_bias=False),
        query_size=config.num_attention_heads * config.head_dim,
        key_value_size=config.num_key_value_heads * config.head_dim,
        head_norms=2 * config.head_dim,
    )


def qwen3_unimportable(hf_config: dict) -> Optional[str]:
    # attention_bias: transformers' Qwen3Attention then has q/k/v and o_proj biases, which the classes leave out
    return qwen2_unimportable(hf_config) or unsupported(hf_config, {"attention_bias": (False,)})


def qwen3_hf_config(config) -> dict:
    fields = {name: getattr(config, name) for name in ROPE_DECODER_FIELDS}
    return {
        **fields,
        "head_dim": config.head_dim,
        "attention_bias": False,
        "rope_parameters": plain_rope(config.rope_theta),
        "hidden_act": config.hidden_act,
    }


IMPLEMENTATION = Implementation(
    "qwen3",
    Qwen3Config,
    Qwen3ForCausalLM,
    None,  # paddlenlp's Qwen2ForCausalLMPipe builds Qwen2 layers by name (pretrain.models.qwen3)
    QWenTokenizer,
    read_shape=qwen3_shape,
    norm="rms",
    recomputed_units={False: LLAMA_UNITS, True: LLAMA_UNITS},  # Qwen2Model's and Qwen2DecoderLayer's forward
    vocab_replicated_when_indivisible=True,  # Qwen2Model's embedding and Qwen2LMHead
    lora_layers="qwen2.layers",  # the base model keeps Qwen2's prefix
    document_mask_forms=("dense", "flashmask"),  # Qwen2Model's forward
    hf=HFFormat(
        "Qwen3ForCausalLM",
        "qwen3",
        ("Qwen3ForCausalLM",),
        qwen3_hf_config,
        unimportable=qwen3_unimportable,
        config_from_hf=qwen2_config_from_hf,
    ),
)


QWEN3 = Family("qwen3", IMPLEMENTATION)
FAMILIES = (QWEN3,)


def _qwen3(layers, hidden, heads, intermediate, *, tied, kv_heads=8, head_dim=128, vocab=151936) -> dict:
    """A Qwen3 config.json's values: every published dense size has 8 key/value heads of 128, vocabulary
    151,936, max_position_embeddings 40,960, rope_theta 1e6, rms_norm_eps 1e-6, SiLU, no attention bias."""
    config = qwen2_config(layers, hidden, heads, kv_heads, intermediate, vocab=vocab, max_positions=40960, tied=tied)
    return {**config, "head_dim": head_dim}


# Layers, heads, tying and context: Yang et al. 2025, Qwen3 Technical Report, Table 1; widths and vocabulary:
# each Qwen/Qwen3-<size> config.json; the totals (and the non-embedding counts tests/test_param_count.py
# checks): each Qwen/Qwen3-<size> model card, "Number of Parameters" (and "(Non-Embedding)").
_QWEN3 = "Yang et al. 2025, Qwen3 Technical Report, Table 1; Qwen/Qwen3-{0} config.json and model card ({1} total)"


MODEL_SIZES = (
    QWEN3.size(
        "qwen3-0.6b", _qwen3(28, 1024, 16, 3072, tied=True), 0.6e9, _QWEN3.format("0.6B", "0.6B"), ("Qwen/Qwen3-0.6B",)
    ),
    QWEN3.size(
        "qwen3-1.7b", _qwen3(28, 2048, 16, 6144, tied=True), 1.7e9, _QWEN3.format("1.7B", "1.7B"), ("Qwen/Qwen3-1.7B",)
    ),
    QWEN3.size(
        "qwen3-4b", _qwen3(36, 2560, 32, 9728, tied=True), 4.0e9, _QWEN3.format("4B", "4.0B"), ("Qwen/Qwen3-4B",)
    ),
    QWEN3.size(
        "qwen3-8b", _qwen3(36, 4096, 32, 12288, tied=False), 8.2e9, _QWEN3.format("8B", "8.2B"), ("Qwen/Qwen3-8B",)
    ),
    QWEN3.size(
        "qwen3-14b", _qwen3(40, 5120, 40, 17408, tied=False), 14.8e9, _QWEN3.format("14B", "14.8B"), ("Qwen/Qwen3-14B",)
    ),
    QWEN3.size(
        "qwen3-32b", _qwen3(64, 5120, 64, 25600, tied=False), 32.8e9, _QWEN3.format("32B", "32.8B"), ("Qwen/Qwen3-32B",)
    ),
    # head_dim 128 with 4 heads of a 256-wide hidden state: q is wider than hidden, as in Qwen3-0.6B
    QWEN3.size(
        "qwen3-debug",
        _qwen3(4, 256, 4, 704, tied=True, kv_heads=2, vocab=8064),
        None,
        "ours: Qwen3 (per-head q/k norms, head_dim 128 independent of hidden / heads, GQA, tied) at debug scale",
    ),
)


PUBLISHED = (
    PublishedTokenizer(
        "Qwen3",
        ("qwen3-",),
        "Qwen's byte-level BPE, 151,643 regular tokens "
        "(Qwen3 technical report, sec. 2: Qwen's tokenizer, 151,669 with its specials)",
        "QWenTokenizer",
        "data/tokenizers/qwen: qwen.tiktoken from PyPI dashscope 2.0.2, the same 151,643 tokens",
        "qwen",
    ),
)
