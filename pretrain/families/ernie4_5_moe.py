"""ERNIE-4.5's mixture-of-experts model type, ``ernie4_5_moe``: the dense ERNIE-4.5 decoder (ernie4_5.py) with
routed experts chosen by softmax scores plus a per-expert bias, renormalised, and shared experts, on this
application's ``pretrain.models.ernie4_5_moe`` classes (paddlenlp 3.0.0b4 has none; the MoE block is paddlenlp's
DeepSeek-V2 one)."""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
from paddlenlp.transformers import LlamaTokenizer, PretrainedConfig

from pretrain.families.common import LLAMA_UNITS
from pretrain.families.deepseek_v2 import deepseek_routing
from pretrain.families.ernie4_5 import ernie4_5_config, ernie4_5_hf_config, ernie4_5_shape, ernie4_5_unimportable
from pretrain.families.qwen2 import qwen2_config_from_hf
from pretrain.families.records import DecoderShape, Family, HFFormat, Implementation
from pretrain.models.ernie4_5_moe import Ernie4_5MoeConfig, Ernie4_5MoeForCausalLM, has_experts


def _ernie4_5_moe_shape(config: PretrainedConfig) -> DecoderShape:
    """ERNIE-4.5's attention; each layer ``has_experts`` says holds a router with its routing bias,
    ``moe_num_experts`` experts of ``moe_intermediate_size`` (whole on every tensor-parallel rank) and one shared
    MLP of ``moe_num_shared_experts`` x that width; the others a dense MLP of ``intermediate_size``."""
    dense = tuple(layer for layer in range(config.num_hidden_layers) if not has_experts(config, layer))
    shared = config.moe_num_shared_experts * config.moe_intermediate_size
    return dataclasses.replace(
        ernie4_5_shape(config),
        mlp_width=config.moe_k * config.moe_intermediate_size + shared,
        experts=config.moe_num_experts,
        experts_per_token=config.moe_k,
        expert_width=config.moe_intermediate_size,
        shared_expert_width=shared,
        router_bias=True,
        dense_layer_ids=dense,
        dense_mlp_width=config.intermediate_size if dense else 0,
        experts_split_by_tensor_parallel=False,
    )


# transformers' Ernie4_5_MoeConfig routing keys, the paddlenlp config's names too (Ernie4_5MoeConfig)
_ERNIE4_5_MOE_FIELDS = (
    "moe_num_experts",
    "moe_k",
    "moe_intermediate_size",
    "moe_num_shared_experts",
    "moe_layer_start_index",
    "moe_layer_end_index",
    "moe_layer_interval",
    "moe_norm_min",
    "router_aux_loss_coef",
)
# transformers' routing bias per MoE layer, [1, experts] (Ernie4_5_MoeStatics); paddlenlp's gate holds [experts]
_BIAS = ".mlp.moe_statics.e_score_correction_bias"


def _ernie4_5_moe_hf_config(config) -> dict:
    return {**ernie4_5_hf_config(config), **{name: getattr(config, name) for name in _ERNIE4_5_MOE_FIELDS}}


def _bias_to_hf(name: str, array: np.ndarray, config) -> list:
    """Export: the routing bias as transformers holds it, [1, experts]."""
    return [(name, array.reshape(1, -1) if name.endswith(_BIAS) else array)]


def _ernie4_5_moe_from_hf(tensors: dict, config, read) -> dict:
    """Import: the routing biases as paddlenlp's gate holds them, [experts]; the released folders'
    multi-token-prediction tensors (names holding "mtp") left out, as transformers' ``Ernie4_5_MoePreTrainedModel``
    ignores them (``_keys_to_ignore_on_load_unexpected``: neither builds that module)."""
    kept = {name: array for name, array in tensors.items() if "mtp" not in name}
    return {name: array.reshape(-1) if name.endswith(_BIAS) else array for name, array in kept.items()}


def _hf_bias_shape(name: str, shape: tuple) -> tuple:
    return (1, *shape) if name.endswith(_BIAS) else shape


def _ernie4_5_moe_unimportable(hf_config: dict) -> Optional[str]:
    # the routing is fixed in transformers' block (Ernie4_5_MoeSparseMoeBlock): nothing in config.json changes it
    return ernie4_5_unimportable(hf_config)


IMPLEMENTATION = Implementation(
    "ernie4_5_moe",
    Ernie4_5MoeConfig,
    Ernie4_5MoeForCausalLM,
    None,  # paddlenlp has no pipeline class for these layers (and preflight refuses MoE pipelines)
    LlamaTokenizer,  # a SentencePiece model, as ERNIE-4.5's tokenizer.model
    read_shape=_ernie4_5_moe_shape,
    norm="rms",
    recomputed_units={False: LLAMA_UNITS, True: LLAMA_UNITS},  # Qwen2Model's and Qwen2DecoderLayer's forward
    vocab_replicated_when_indivisible=True,  # Qwen2Model's embedding and Qwen2LMHead
    document_mask_forms=("dense", "flashmask"),  # Qwen2Model's forward
    # DeepseekV2MoE's gates (Constant(1.0) routers, drawn at init) add their loss themselves; noaux_tc is fixed
    routing=dataclasses.replace(
        deepseek_routing(()),
        experts_key="moe_num_experts",
        top_k_key="moe_k",
        aux_loss_coef_key="router_aux_loss_coef",
        init_routers=True,
    ),
    hf=HFFormat(
        "Ernie4_5_MoeForCausalLM",
        "ernie4_5_moe",
        ("Ernie4_5_MoeForCausalLM",),
        _ernie4_5_moe_hf_config,
        rename=_bias_to_hf,
        unimportable=_ernie4_5_moe_unimportable,
        config_from_hf=qwen2_config_from_hf,
        from_hf=_ernie4_5_moe_from_hf,
        hf_shape=_hf_bias_shape,
    ),
)


ERNIE4_5_MOE = Family("ernie4_5_moe", IMPLEMENTATION)
FAMILIES = (ERNIE4_5_MOE,)


def _ernie4_5_moe(layers, hidden, heads, kv_heads, intermediate, experts, top_k, expert_width, shared, first, **kw):
    """An ERNIE-4.5 MoE config.json's values: the dense ERNIE-4.5's (ernie4_5.py: head_dim 128, rope_theta
    500,000, rms_norm_eps 1e-5, tied embeddings, no bias, vocabulary 103,424), ``experts`` routed experts of
    ``expert_width`` of which ``top_k`` per token and ``shared`` shared ones in every layer from ``first`` to the
    last (moe_layer_interval 1), moe_norm_min 1e-12 and router_aux_loss_coef 0.001 (transformers' defaults; the
    releases' config.json has neither)."""
    return {
        **ernie4_5_config(layers, hidden, heads, kv_heads, intermediate, **kw),
        "moe_num_experts": experts,
        "moe_k": top_k,
        "moe_intermediate_size": expert_width,
        "moe_num_shared_experts": shared,
        "moe_layer_start_index": first,
        "moe_layer_end_index": layers - 1,
        "moe_layer_interval": 1,
        "moe_norm_min": 1e-12,
        "router_aux_loss_coef": 0.001,
    }


# The counts: each model card ("21B total parameters, 3B activated for each token"; "300B total, 47B activated"),
# as transformers' docs (model_doc/ernie4_5_moe) give them. The shapes: baidu/ERNIE-4.5-21B-A3B-PT's config.json
# (transformers' Ernie4_5_MoeConfig defaults are that model's) and baidu/ERNIE-4.5-300B-A47B-PT's, whose values
# public inference engines' test fixtures repeat (e.g. MindIE's ernie_moe tests: hidden 8192, 54 layers, 64 / 8
# heads, 64 experts of 3584 of which 8, no shared expert, experts from layer 3 to 53, tied embeddings).
_ERNIE4_5_MOE = (
    "Baidu, ERNIE 4.5 Technical Report (2025); baidu/ERNIE-4.5-{0}-PT model card ({1} total, {2} activated per "
    "token) and config.json"
)


MODEL_SIZES = (
    ERNIE4_5_MOE.size(
        "ernie-4.5-21b-a3b",
        _ernie4_5_moe(28, 2560, 20, 4, 12288, 64, 6, 1536, 2, 1),
        21e9,
        _ERNIE4_5_MOE.format("21B-A3B", "21B", "3B"),
        ("baidu/ERNIE-4.5-21B-A3B-PT", "baidu/ERNIE-4.5-21B-A3B-Base-PT"),
        published_active_params=3e9,
    ),
    ERNIE4_5_MOE.size(
        "ernie-4.5-300b-a47b",
        _ernie4_5_moe(54, 8192, 64, 8, 28672, 64, 8, 3584, 0, 3),
        300e9,
        _ERNIE4_5_MOE.format("300B-A47B", "300B", "47B"),
        ("baidu/ERNIE-4.5-300B-A47B-PT", "baidu/ERNIE-4.5-300B-A47B-Base-PT"),
        published_active_params=47e9,
    ),
    # 8 experts of which 2 per token and a shared one; layer 0 dense (moe_layer_start_index 1, as the 21B), so
    # the 2-layer test runs hold both kinds; head_dim 128 over a 256-wide hidden state with 4 heads (as
    # ernie-4.5-debug)
    ERNIE4_5_MOE.size(
        "ernie-4.5-moe-debug",
        {
            **_ernie4_5_moe(3, 256, 4, 2, 704, 8, 2, 128, 1, 1, vocab=8064, max_positions=4096),
            "moe_layer_end_index": -1,  # the last layer, whatever num_hidden_layers a test or demo gives
        },
        None,
        "ours: ERNIE-4.5 MoE (softmax routing with a per-expert bias, 8 experts, top-2 renormalised, a shared "
        "expert, a dense first layer) at debug scale",
    ),
)


# ERNIE-4.5's tokenizer: the "ERNIE-4.5" row of ernie4_5.py (prefix "ernie-4.5-") covers these sizes too
PUBLISHED = ()
