"""Mixtral's paddlenlp model type, ``mixtral``: LLaMA's attention, every layer's MLP routed SwiGLU experts."""

from __future__ import annotations

import dataclasses
from typing import Optional

from paddlenlp.transformers import LlamaTokenizer, MixtralConfig, MixtralForCausalLM, PretrainedConfig

from pretrain.families.common import LLAMA_UNITS, rope_decoder_shape, rope_unsupported, unsupported
from pretrain.families.qwen2 import qwen2_config_from_hf, qwen2_hf_config
from pretrain.families.records import DecoderShape, Family, HFFormat, Implementation, PublishedTokenizer, Routing


def _mixtral_shape(config: PretrainedConfig) -> DecoderShape:
    """Mixtral: LLaMA's attention (GQA, no biases); every layer's MLP is ``num_local_experts`` SwiGLU
    experts of ``intermediate_size``, no shared expert."""
    return dataclasses.replace(
        rope_decoder_shape(config, qkv_bias=False),
        mlp_width=config.num_experts_per_tok * config.intermediate_size,
        experts=config.num_local_experts,
        experts_per_token=config.num_experts_per_tok,
        expert_width=config.intermediate_size,
        router_first=True,  # MixtralSparseMoeBlock: gate, then experts
    )


# The routing keys transformers' MixtralConfig shares with paddlenlp's (router_aux_loss_coef: the load-balancing
# loss's coefficient, which pretrain.routing adds).
_MIXTRAL_FIELDS = ("num_local_experts", "num_experts_per_tok", "router_aux_loss_coef")


def _mixtral_hf_config(config) -> dict:
    """MixtralForCausalLM: full attention (paddlenlp's MixtralAttention has no sliding window)."""
    moe = {name: getattr(config, name) for name in _MIXTRAL_FIELDS}
    return {**qwen2_hf_config(config), **moe, "sliding_window": None}


def _mixtral_unimportable(hf_config: dict) -> Optional[str]:
    return rope_unsupported(hf_config, {"default": ()}) or unsupported(
        hf_config, {"sliding_window": (None,), "hidden_act": ("silu",)}
    )


# As Qwen2-MoE (qwen2_moe.py): paddlenlp 3.0.0b4's MoE code needs pretrain.compat.moe (applied by
# pretrain.model.build_model), output_router_logits stays False (pretrain.routing adds the load-balancing
# loss), recompute as LLaMA's. MixtralSparseMoeBlock gathers each expert's tokens with no capacity.
IMPLEMENTATION = Implementation(
    "mixtral",
    MixtralConfig,
    MixtralForCausalLM,
    None,
    LlamaTokenizer,
    read_shape=_mixtral_shape,
    norm="rms",
    recomputed_units={False: LLAMA_UNITS, True: LLAMA_UNITS},
    config_fixes={"output_router_logits": False},
    vocab_replicated_when_indivisible=True,
    # MixtralModel.forward takes position_ids and a 4-D attention_mask, but no attn_mask_startend_row_indices
    # (mixtral/modeling.py: no FlashMask input; its flash path hands the dense mask to
    # scaled_dot_product_attention): the dense form only
    document_mask_forms=("dense",),
    routing=Routing(
        ".block_sparse_moe.gate",
        "MixtralSparseMoeBlock: each expert takes all its tokens (no capacity)",
        "num_local_experts",
        no_expert_parallel=(
            "paddlenlp 3.0.0b4's MixtralSparseMoeBlock (transformers/mixtral/modeling.py:490) is not its "
            "MoELayer: it builds every expert on every rank (line 498) and has no all-to-all"
        ),
        skips_idle_experts="MixtralSparseMoeBlock skips the experts no token chose (mixtral/modeling.py:528)",
    ),
    hf=HFFormat(
        "MixtralForCausalLM",
        "mixtral",
        ("MixtralForCausalLM",),
        _mixtral_hf_config,
        unimportable=_mixtral_unimportable,
        config_from_hf=qwen2_config_from_hf,
    ),
)


MIXTRAL = Family("mixtral", IMPLEMENTATION)
FAMILIES = (MIXTRAL,)


def _mixtral(layers, hidden, heads, kv_heads, experts, top_k, expert_width, *, vocab=32000) -> dict:
    # router_aux_loss_coef 0.02: the mistralai/Mixtral-8x7B-v0.1 config.json (paddlenlp's default is 0.001).
    return {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": expert_width,
        "num_local_experts": experts,
        "num_experts_per_tok": top_k,
        "vocab_size": vocab,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "router_aux_loss_coef": 0.02,
        "hidden_act": "silu",
    }


_MIXTRAL = (
    "Jiang et al. 2024, Mixtral of Experts, sec. 2 and Table 1, and the mistralai/Mixtral-8x7B-v0.1 config.json; "
    "the counts are Mistral AI's announcement (46.7B total, 12.9B per token); the total is the checkpoint's "
    "model.safetensors.index.json total_size, 93,405,585,408 bytes of bfloat16"
)


MODEL_SIZES = (
    MIXTRAL.size(
        "mixtral-8x7b",
        _mixtral(32, 4096, 32, 8, 8, 2, 14336),
        46.7e9,
        _MIXTRAL,
        ("mistralai/Mixtral-8x7B-v0.1",),
        published_active_params=12.9e9,
    ),
    MIXTRAL.size(
        "mixtral-debug",
        {**_mixtral(4, 256, 4, 2, 4, 2, 352, vocab=8064), "max_position_embeddings": 1024},
        None,
        "ours: Mixtral (4 experts, top-2) at debug scale",
    ),
)


PUBLISHED = (
    PublishedTokenizer(
        "Mixtral",
        ("mixtral-",),
        "SentencePiece BPE, 32,000 pieces, byte fallback (Mistral-7B's)",
        "LlamaTokenizer",
        "data/tokenizers/mistral: tokenizer.model from PyPI mistral-common 1.13.1 (its v1 tokenizer, Mistral-7B's "
        "and Mixtral-8x7B's)",
        "mistral",
    ),
)
