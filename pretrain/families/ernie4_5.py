"""ERNIE-4.5's model type, ``ernie4_5`` (dense): LLaMA's decoder with an explicit head_dim, no biases, tied
embeddings and RoPE on interleaved pairs, on this application's ``pretrain.models.ernie4_5`` classes (paddlenlp
3.0.0b4 has none)."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from paddlenlp.transformers import LlamaTokenizer, PretrainedConfig

from pretrain.families.common import (
    LLAMA_UNITS,
    ROPE_DECODER_FIELDS,
    plain_rope,
    rope_decoder_shape,
    rope_unsupported,
    unsupported,
)
from pretrain.families.qwen2 import qwen2_config, qwen2_config_from_hf
from pretrain.families.records import DecoderShape, Family, HFFormat, Implementation, PublishedTokenizer
from pretrain.models.ernie4_5 import Ernie4_5Config, Ernie4_5ForCausalLM


def ernie4_5_shape(config: PretrainedConfig) -> DecoderShape:
    """The LLaMA-style shape at ``head_dim`` (q: heads x head_dim, k/v: kv_heads x head_dim), no bias."""
    return replace(
        rope_decoder_shape(config, qkv_bias=False),
        query_size=config.num_attention_heads * config.head_dim,
        key_value_size=config.num_key_value_heads * config.head_dim,
    )


def ernie4_5_unimportable(hf_config: dict) -> Optional[str]:
    # use_bias: transformers' Ernie4_5 then has biases on q/k/v/o and the MLP, which the classes leave out
    return rope_unsupported(hf_config, {"default": ()}) or unsupported(
        hf_config, {"use_bias": (False,), "hidden_act": ("silu",)}
    )


def ernie4_5_hf_config(config) -> dict:
    fields = {name: getattr(config, name) for name in ROPE_DECODER_FIELDS}
    return {
        **fields,
        "head_dim": config.head_dim,
        "use_bias": False,
        "rope_parameters": plain_rope(config.rope_theta),
        "hidden_act": config.hidden_act,
    }


IMPLEMENTATION = Implementation(
    "ernie4_5",
    Ernie4_5Config,
    Ernie4_5ForCausalLM,
    None,  # paddlenlp's Qwen2ForCausalLMPipe builds Qwen2 layers by name (pretrain.models.ernie4_5)
    LlamaTokenizer,  # a SentencePiece model, as ERNIE-4.5's tokenizer.model
    read_shape=ernie4_5_shape,
    norm="rms",
    recomputed_units={False: LLAMA_UNITS, True: LLAMA_UNITS},  # Qwen2Model's and Qwen2DecoderLayer's forward
    vocab_replicated_when_indivisible=True,  # Qwen2Model's embedding and Qwen2LMHead
    lora_layers="qwen2.layers",  # the base model keeps Qwen2's prefix
    document_mask_forms=("dense", "flashmask"),  # Qwen2Model's forward
    hf=HFFormat(
        "Ernie4_5ForCausalLM",
        "ernie4_5",
        ("Ernie4_5ForCausalLM",),
        ernie4_5_hf_config,
        unimportable=ernie4_5_unimportable,
        config_from_hf=qwen2_config_from_hf,
    ),
)


ERNIE4_5 = Family("ernie4_5", IMPLEMENTATION)
FAMILIES = (ERNIE4_5,)


def ernie4_5_config(layers, hidden, heads, kv_heads, intermediate, *, vocab=103424, max_positions=131072) -> dict:
    """An ERNIE-4.5 dense config.json's values: head_dim 128, rope_theta 500,000, rms_norm_eps 1e-5, SiLU, tied
    embeddings, no bias (baidu/ERNIE-4.5-0.3B-PT config.json)."""
    config = qwen2_config(
        layers, hidden, heads, kv_heads, intermediate, vocab=vocab, max_positions=max_positions, tied=True, eps=1e-5
    )
    return {**config, "head_dim": 128, "rope_theta": 500000.0}


MODEL_SIZES = (
    # Layers, heads, context and the count: the baidu/ERNIE-4.5-0.3B-PT model card, "Model Configuration"
    # (Params 0.36B, 18 layers, 16 query / 2 key-value heads, context 131,072); widths and vocabulary: its
    # config.json (hidden 1024, intermediate 3072, head_dim 128, vocab_size 103,424).
    ERNIE4_5.size(
        "ernie-4.5-0.3b",
        ernie4_5_config(18, 1024, 16, 2, 3072),
        0.36e9,
        "Baidu, ERNIE 4.5 Technical Report (2025); baidu/ERNIE-4.5-0.3B-PT model card (0.36B params) and config.json",
        ("baidu/ERNIE-4.5-0.3B-PT", "baidu/ERNIE-4.5-0.3B-Base-PT"),
    ),
    # head_dim 128 with 4 heads of a 256-wide hidden state: q is wider than hidden, as in ERNIE-4.5-0.3B;
    # positions 4,096: paddlenlp's rotary tables are [positions, head_dim] per layer
    ERNIE4_5.size(
        "ernie-4.5-debug",
        ernie4_5_config(4, 256, 4, 2, 704, vocab=8064, max_positions=4096),
        None,
        "ours: ERNIE-4.5 (interleaved-pair RoPE, head_dim 128 independent of hidden / heads, GQA, tied) at debug scale",
    ),
)


PUBLISHED = (
    PublishedTokenizer(
        "ERNIE-4.5",
        ("ernie-4.5-",),
        "SentencePiece (tokenizer.model; vocab_size 103,424 in config.json)",
        "LlamaTokenizer",
        "on the model hub only (baidu/ERNIE-4.5-0.3B-PT tokenizer.model), no package registry ships it (PyPI "
        "erniekit 1.3.0 holds code only): not obtainable offline; the debug size runs on the demo tokenizer",
    ),
)
