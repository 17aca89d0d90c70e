"""Qwen2-MoE's paddlenlp model type, ``qwen2_moe`` (Qwen1.5-MoE, Qwen2-MoE): Qwen2's attention, every layer's
MLP routed experts plus a gated shared expert."""

from __future__ import annotations

import dataclasses
from typing import Optional

from paddlenlp.transformers import PretrainedConfig, QWenTokenizer
from paddlenlp.transformers.qwen2_moe import Qwen2MoeConfig, Qwen2MoeForCausalLM
from paddlenlp.transformers.qwen2_moe.modeling_pp import Qwen2MoeForCausalLMPipe

from pretrain.families.common import LLAMA_UNITS, rope_decoder_shape, unsupported
from pretrain.families.qwen2 import qwen2_config, qwen2_config_from_hf, qwen2_hf_config, qwen2_unimportable
from pretrain.families.records import DecoderShape, Family, HFFormat, Implementation, PublishedTokenizer, Routing


def _qwen2_moe_shape(config: PretrainedConfig) -> DecoderShape:
    """Qwen2-MoE: Qwen2's attention; every layer's MLP is a Qwen2MoeSparseMoEBlock (paddlenlp builds it
    whenever num_experts > 0) of ``moe_intermediate_size`` experts plus a gated shared expert."""
    return dataclasses.replace(
        rope_decoder_shape(config, qkv_bias=True),
        mlp_width=config.num_experts_per_tok * config.moe_intermediate_size + config.shared_expert_intermediate_size,
        experts=config.num_experts,
        experts_per_token=config.num_experts_per_tok,
        expert_width=config.moe_intermediate_size,
        shared_expert_width=config.shared_expert_intermediate_size,
        shared_expert_gate=True,
    )


# The routing keys transformers' Qwen2MoeConfig shares with paddlenlp's (router_aux_loss_coef: the
# load-balancing loss's coefficient, which pretrain.routing adds).
_QWEN2_MOE_FIELDS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "router_aux_loss_coef",
)


def _qwen2_moe_hf_config(config) -> dict:
    """Qwen2MoeForCausalLM: every layer sparse (paddlenlp builds experts in every layer whatever
    ``decoder_sparse_step`` says), top-k weights not renormalised (Qwen2MoeSparseMoEBlock does not pass
    ``norm_topk_prob`` to its gate)."""
    moe = {name: getattr(config, name) for name in _QWEN2_MOE_FIELDS}
    return {**qwen2_hf_config(config), **moe, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": False}


def _qwen2_moe_unimportable(hf_config: dict) -> Optional[str]:
    return qwen2_unimportable(hf_config) or unsupported(
        hf_config, {"decoder_sparse_step": (1,), "mlp_only_layers": ([],), "norm_topk_prob": (False,)}
    )


# Mixture of experts. paddlenlp 3.0.0b4's MoE code needs pretrain.compat.moe on paddle 3.3 (applied
# by pretrain.model.build_model). output_router_logits stays False: the load-balancing loss is added
# by pretrain.routing for every MoE type alike (Qwen2MoeForCausalLM's own path passes its per-layer
# gate losses, not router logits, to load_balancing_loss_func). Recompute as LLaMA's (the models'
# forward methods read full, full_attn, core_attn alike). Qwen2MoeSparseMoEBlock dispatches with
# drop_tokens=False; MixtralSparseMoeBlock gathers each expert's tokens with no capacity.
IMPLEMENTATION = Implementation(
    "qwen2_moe",
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen2MoeForCausalLMPipe,  # paddlenlp's; unused: layout_rules refuses pipelines for a mixture of experts
    QWenTokenizer,
    read_shape=_qwen2_moe_shape,
    norm="rms",
    recomputed_units={False: LLAMA_UNITS, True: LLAMA_UNITS},
    config_fixes={"output_router_logits": False},
    vocab_replicated_when_indivisible=True,
    # Qwen2MoeModel.forward takes position_ids, a 4-D attention_mask and, under flash attention,
    # attn_mask_startend_row_indices for fusion_ops (Qwen2's code); its dispatch is per token (dropless)
    document_mask_forms=("dense", "flashmask"),
    routing=Routing(
        ".mlp.gate",
        "Qwen2MoeSparseMoEBlock: drop_tokens=False, capacity = the busiest expert's token count",
        "num_experts",
        init_routers=True,  # Qwen2MoeGate: Constant(1.0)
    ),
    hf=HFFormat(
        "Qwen2MoeForCausalLM",
        "qwen2_moe",
        ("Qwen2MoeForCausalLM",),
        _qwen2_moe_hf_config,
        unimportable=_qwen2_moe_unimportable,
        config_from_hf=qwen2_config_from_hf,
    ),
)


QWEN2_MOE = Family("qwen2_moe", IMPLEMENTATION)
FAMILIES = (QWEN2_MOE,)


def _qwen2_moe(
    layers, hidden, heads, kv_heads, experts, top_k, expert_width, shared_width, *, intermediate, vocab, max_positions
) -> dict:
    # intermediate_size (the dense MLP width) is unused when every layer has experts, as in every Qwen
    # MoE release; router_aux_loss_coef and norm_topk_prob as the Qwen config.json files give them.
    return {
        **qwen2_config(
            layers, hidden, heads, kv_heads, intermediate, vocab=vocab, max_positions=max_positions, tied=False
        ),
        "num_experts": experts,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": expert_width,
        "shared_expert_intermediate_size": shared_width,
        "norm_topk_prob": False,
        "router_aux_loss_coef": 0.001,
    }


_QWEN_MOE = (
    "the Qwen/{} model card ({} parameters in total, {} activated) and config.json; Qwen2 Technical "
    "Report, Table 1 (57B-A14B)"
)


MODEL_SIZES = (
    # Mixture of experts: total parameters and those a token uses (activated), as published.
    QWEN2_MOE.size(
        "qwen1.5-moe-a2.7b",
        _qwen2_moe(24, 2048, 16, 16, 60, 4, 1408, 5632, intermediate=5632, vocab=151936, max_positions=8192),
        14.3e9,
        _QWEN_MOE.format("Qwen1.5-MoE-A2.7B", "14.3B", "2.7B"),
        ("Qwen/Qwen1.5-MoE-A2.7B",),
        published_active_params=2.7e9,
    ),
    QWEN2_MOE.size(
        "qwen2-57b-a14b",
        # context 65,536 tokens (the Qwen2 model card); RoPE: no positions counted
        _qwen2_moe(28, 3584, 28, 4, 64, 8, 2560, 20480, intermediate=18944, vocab=151936, max_positions=65536),
        57.4e9,
        _QWEN_MOE.format("Qwen2-57B-A14B", "57.4B", "14B"),
        ("Qwen/Qwen2-57B-A14B",),
        published_active_params=14e9,
    ),
    QWEN2_MOE.size(
        "qwen2_moe-debug",
        _qwen2_moe(4, 256, 4, 2, 4, 2, 256, 256, intermediate=704, vocab=8064, max_positions=1024),
        None,
        "ours: Qwen2-MoE (4 routed experts, top-2, a gated shared expert) at debug scale",
    ),
)


PUBLISHED = (
    PublishedTokenizer(
        "Qwen1.5-MoE, Qwen2-MoE",
        ("qwen1.5-moe-", "qwen2-57b-a14b", "qwen2_moe-"),
        "Qwen's byte-level BPE, 151,643 regular tokens (as Qwen2)",
        "QWenTokenizer",
        "data/tokenizers/qwen: qwen.tiktoken from PyPI dashscope 2.0.2, the same 151,643 tokens",
        "qwen",
    ),
)
