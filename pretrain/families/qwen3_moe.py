"""Qwen3-MoE's model type, ``qwen3_moe``: Qwen3's attention (per-head q/k RMSNorm, explicit head_dim, no q/k/v
bias) and routed experts without a shared expert, top-k weights renormalised, on this application's
``pretrain.models.qwen3_moe`` classes (paddlenlp 3.0.0b4 has none)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from paddlenlp.transformers import PretrainedConfig, QWenTokenizer

from pretrain.families.common import LLAMA_UNITS, unsupported
from pretrain.families.qwen2 import qwen2_config, qwen2_config_from_hf
from pretrain.families.qwen3 import qwen3_hf_config, qwen3_shape, qwen3_unimportable
from pretrain.families.records import DecoderShape, Family, HFFormat, Implementation, PublishedTokenizer, Routing
from pretrain.models.qwen3_moe import Qwen3MoeConfig, Qwen3MoeForCausalLM, has_experts


def _qwen3_moe_shape(config: PretrainedConfig) -> DecoderShape:
    """Qwen3's attention; each layer ``has_experts`` says holds ``num_experts`` routed experts of
    ``moe_intermediate_size`` (no shared expert), the others a dense MLP of ``intermediate_size``."""
    dense = tuple(layer for layer in range(config.num_hidden_layers) if not has_experts(config, layer))
    return dataclasses.replace(
        qwen3_shape(config),
        mlp_width=config.num_experts_per_tok * config.moe_intermediate_size,
        experts=config.num_experts,
        experts_per_token=config.num_experts_per_tok,
        expert_width=config.moe_intermediate_size,
        dense_layer_ids=dense,
        dense_mlp_width=config.intermediate_size if dense else 0,
    )


# The routing keys transformers' Qwen3MoeConfig shares with the paddlenlp config (Qwen3MoeConfig, on
# Qwen2MoeConfig): every one is computed by pretrain.models.qwen3_moe.
_QWEN3_MOE_FIELDS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "decoder_sparse_step",
    "mlp_only_layers",
    "router_aux_loss_coef",
)


def _qwen3_moe_hf_config(config) -> dict:
    return {**qwen3_hf_config(config), **{name: getattr(config, name) for name in _QWEN3_MOE_FIELDS}}


def _qwen3_moe_unimportable(hf_config: dict) -> Optional[str]:
    # tie_word_embeddings: Qwen2MoeForCausalLM (whose forward the classes keep) has no tied LM head
    return qwen3_unimportable(hf_config) or unsupported(hf_config, {"tie_word_embeddings": (False,)})


# Mixture of experts as Qwen2-MoE (qwen2_moe.py): paddlenlp's MoE code needs pretrain.compat.moe (applied by
# pretrain.model.build_model); output_router_logits stays False, pretrain.routing adds the load-balancing loss.
IMPLEMENTATION = Implementation(
    "qwen3_moe",
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    None,  # paddlenlp's Qwen2MoeForCausalLMPipe builds Qwen2-MoE layers by name (pretrain.models.qwen3_moe)
    QWenTokenizer,
    read_shape=_qwen3_moe_shape,
    norm="rms",
    recomputed_units={False: LLAMA_UNITS, True: LLAMA_UNITS},  # Qwen2MoeModel's and Qwen2MoeDecoderLayer's forward
    config_fixes={"output_router_logits": False},
    vocab_replicated_when_indivisible=True,  # Qwen2MoeModel's embedding and Qwen2MoeLMHead
    document_mask_forms=("dense", "flashmask"),  # Qwen2MoeModel's forward
    routing=Routing(
        ".mlp.gate",
        "Qwen3MoeSparseMoeBlock (MoELayer, Qwen2MoeGate): drop_tokens=False, capacity = the busiest expert's "
        "token count",
        "num_experts",
        init_routers=True,  # Qwen2MoeGate: Constant(1.0)
    ),
    hf=HFFormat(
        "Qwen3MoeForCausalLM",
        "qwen3_moe",
        ("Qwen3MoeForCausalLM",),
        _qwen3_moe_hf_config,
        unimportable=_qwen3_moe_unimportable,
        config_from_hf=qwen2_config_from_hf,
    ),
)


QWEN3_MOE = Family("qwen3_moe", IMPLEMENTATION)
FAMILIES = (QWEN3_MOE,)


def _qwen3_moe(layers, hidden, heads, intermediate, expert_width, *, kv_heads=4, experts=128, top_k=8, vocab=151936):
    """A Qwen3-MoE config.json's values: both published sizes have 4 key/value heads, head_dim 128, 128 experts
    of which 8 per token, every layer sparse (decoder_sparse_step 1, mlp_only_layers []), norm_topk_prob true,
    router_aux_loss_coef 0.001, vocabulary 151,936, max_position_embeddings 40,960, rope_theta 1e6, rms_norm_eps
    1e-6, untied embeddings."""
    config = qwen2_config(layers, hidden, heads, kv_heads, intermediate, vocab=vocab, max_positions=40960, tied=False)
    return {
        **config,
        "head_dim": 128,
        "num_experts": experts,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": expert_width,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "router_aux_loss_coef": 0.001,
    }


# Layers, heads, experts: Yang et al. 2025, Qwen3 Technical Report, Table 2; widths and vocabulary: each
# Qwen/Qwen3-<size> config.json; the counts: its model card, "Number of Parameters: <total> in total and
# <activated> activated" (and "(Non-Embedding)", which tests/test_param_count.py checks).
_QWEN3_MOE = (
    "Yang et al. 2025, Qwen3 Technical Report, Table 2; Qwen/Qwen3-{0} config.json and model card ({1} in total, "
    "{2} activated)"
)


MODEL_SIZES = (
    QWEN3_MOE.size(
        "qwen3-30b-a3b",
        _qwen3_moe(48, 2048, 32, 6144, 768),
        30.5e9,
        _QWEN3_MOE.format("30B-A3B", "30.5B", "3.3B"),
        ("Qwen/Qwen3-30B-A3B",),
        published_active_params=3.3e9,
    ),
    QWEN3_MOE.size(
        "qwen3-235b-a22b",
        _qwen3_moe(94, 4096, 64, 12288, 1536),
        235e9,
        _QWEN3_MOE.format("235B-A22B", "235B", "22B"),
        ("Qwen/Qwen3-235B-A22B",),
        published_active_params=22e9,
    ),
    # 8 experts of which 2 per token; layer 1 dense (mlp_only_layers: the 2-layer test runs hold both kinds);
    # head_dim 64 over a 256-wide hidden state with 4 heads (q as wide as hidden; 2 key/value heads)
    QWEN3_MOE.size(
        "qwen3_moe-debug",
        {
            **_qwen3_moe(4, 256, 4, 512, 128, kv_heads=2, experts=8, top_k=2, vocab=8064),
            "head_dim": 64,
            "mlp_only_layers": [1],
        },
        None,
        "ours: Qwen3-MoE (per-head q/k norms, 8 routed experts, top-2 renormalised, no shared expert, one dense "
        "layer) at debug scale",
    ),
)


PUBLISHED = (
    PublishedTokenizer(
        "Qwen3-MoE",
        ("qwen3-30b-a3b", "qwen3-235b-a22b", "qwen3_moe-"),
        "Qwen's byte-level BPE, 151,643 regular tokens (as Qwen3)",
        "QWenTokenizer",
        "data/tokenizers/qwen: qwen.tiktoken from PyPI dashscope 2.0.2, the same 151,643 tokens",
        "qwen",
    ),
)
