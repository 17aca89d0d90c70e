"""DeepSeek-V2's paddlenlp model type, ``deepseek_v2``: multi-head latent attention, dense layers first, then
routed and shared experts (``DeepseekV2MoE``); DeepSeek-V3 (deepseek_v3.py) reuses its facts."""

from __future__ import annotations

from typing import Optional

from paddlenlp.transformers import LlamaTokenizer, PretrainedConfig
from paddlenlp.transformers.deepseek_v2 import DeepseekV2Config, DeepseekV2ForCausalLM

from pretrain.families.common import LLAMA_UNITS, ROPE_DECODER_FIELDS, rope_unsupported, unsupported
from pretrain.families.records import (
    ROPE_ROWS_SEQUENCE,
    DecoderShape,
    Family,
    HFFormat,
    Implementation,
    LatentAttention,
    PublishedTokenizer,
    Routing,
    WeightInit,
)
from pretrain.mtp import install_tensor_parallel_mapping, prediction_depth


def deepseek_shape(config: PretrainedConfig) -> DecoderShape:
    """DeepSeek-V2/V3: multi-head latent attention (``LatentAttention``), RMSNorm, no biases; layer i has experts
    when i >= first_k_dense_replace and i % moe_layer_freq == 0 (``DeepseekV2DecoderLayer``), else a dense SwiGLU
    MLP of intermediate_size; ``n_shared_experts`` shared experts of moe_intermediate_size (one MLP of their
    summed width, ``DeepseekV2MoE``); V3's noaux_tc routing adds a bias per expert beside each router;
    ``num_nextn_predict_layers`` multi-token-prediction layers follow the main model's (``pretrain.mtp``)."""
    dense = tuple(
        i
        for i in range(config.num_hidden_layers)
        if not (i >= config.first_k_dense_replace and i % config.moe_layer_freq == 0)
    )
    mla = LatentAttention(
        heads=config.num_attention_heads,
        q_lora_rank=config.q_lora_rank or 0,
        kv_lora_rank=config.kv_lora_rank,
        qk_nope_head_dim=config.qk_nope_head_dim,
        qk_rope_head_dim=config.qk_rope_head_dim,
        v_head_dim=config.v_head_dim,
        bias=bool(config.attention_bias),
    )
    shared = (config.n_shared_experts or 0) * config.moe_intermediate_size
    return DecoderShape(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        query_size=mla.query_size,
        key_value_size=mla.query_size,  # keys as wide as queries (nope + rope per head) after kv_b_proj
        mlp_width=config.num_experts_per_tok * config.moe_intermediate_size + shared,
        gated_mlp=True,
        qkv_bias=False,
        output_bias=False,
        norm_has_bias=False,
        position_rows=0,
        tie_word_embeddings=config.tie_word_embeddings,
        experts=config.n_routed_experts,
        experts_per_token=config.num_experts_per_tok,
        expert_width=config.moe_intermediate_size,
        shared_expert_width=shared,
        router_bias=config.topk_method == "noaux_tc",
        dense_layer_ids=dense,
        dense_mlp_width=config.intermediate_size,
        latent_attention=mla,
        experts_split_by_tensor_parallel=False,
        prediction_layers=config.num_nextn_predict_layers,
    )


# DeepSeek-V2: the keys transformers' DeepseekV2Config shares with paddlenlp's (the same names).
DEEPSEEK_FIELDS = (
    *ROPE_DECODER_FIELDS,
    "attention_bias",
    "moe_intermediate_size",
    "n_shared_experts",
    "n_routed_experts",
    "routed_scaling_factor",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "topk_method",
    "n_group",
    "topk_group",
    "num_experts_per_tok",
    "first_k_dense_replace",
    "norm_topk_prob",
    "aux_loss_alpha",
    "seq_aux",
)


# YaRN's keys (DeepseekV2YarnRotaryEmbedding, transformers' _compute_yarn_parameters), besides the factor.
_YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")


def deepseek_rope(config) -> dict:
    """The YaRN RoPE of a DeepSeek-V2 config, as transformers' ``rope_parameters``."""
    scaling = config.rope_scaling or {}
    keys = {key: scaling[key] for key in _YARN_KEYS if key in scaling}
    return {"rope_type": "yarn", **keys, "rope_theta": float(config.rope_theta)}


def _deepseek_hf_config(config) -> dict:
    """DeepseekV2ForCausalLM (transformers >= 4.55, no custom code)."""
    fields = {name: getattr(config, name) for name in DEEPSEEK_FIELDS}
    return {**fields, "rope_parameters": deepseek_rope(config), "hidden_act": config.hidden_act}


def deepseek_unexportable(config) -> Optional[str]:
    if prediction_depth(config):
        return (
            f"num_nextn_predict_layers {prediction_depth(config)}: DeepSeek-V2's Hugging Face layout has no "
            "multi-token-prediction module (DeepSeek-V3's has)"
        )
    scaling = config.rope_scaling or {}
    if scaling.get("type", scaling.get("rope_type")) != "yarn":
        return f"rope_scaling {config.rope_scaling}: paddlenlp's DeepseekV2Attention runs YaRN RoPE only"
    if config.moe_layer_freq != 1 or config.scoring_func != "softmax":
        return (
            f"moe_layer_freq {config.moe_layer_freq}, scoring_func {config.scoring_func!r}: transformers' "
            "DeepseekV2ForCausalLM puts experts in every layer from first_k_dense_replace on and scores by softmax"
        )
    return None


def deepseek_unimportable(hf_config: dict) -> Optional[str]:
    """paddlenlp's DeepseekV2Attention computes YaRN only (its plain RoPE path fails: docs/models.md); transformers
    4.x takes the YaRN factor as max_position_embeddings / original_max_position_embeddings where paddlenlp reads
    ``factor``, so the two must agree."""
    why = rope_unsupported(hf_config, {"yarn": ("factor",)}) or unsupported(
        hf_config, {"hidden_act": ("silu",), "topk_method": ("greedy", "group_limited_greedy")}
    )
    rope = hf_config["rope_parameters"]
    original = rope.get("original_max_position_embeddings")
    positions = hf_config.get("max_position_embeddings", 2048)
    if not why and original and positions / original != rope["factor"]:
        return (
            f"rope factor {rope['factor']} is not max_position_embeddings / original_max_position_embeddings "
            f"({positions} / {original}), which transformers 4.x uses in its place"
        )
    return why


def deepseek_config_from_hf(hf_config: dict) -> dict:
    rope = hf_config["rope_parameters"]
    return {
        "rope_theta": float(rope["rope_theta"]),
        "rope_scaling": {"type": "yarn", **{key: rope[key] for key in _YARN_KEYS if key in rope}},
    }


def deepseek_routing(topk_methods: tuple) -> Routing:
    """DeepSeek-V2/V3's routers: ``DeepseekV2MoE`` (a dropless ``MoELayer``) adds its gates' loss itself."""
    return Routing(
        ".mlp.gate",
        "DeepseekV2MoE: drop_tokens=False, capacity = the busiest expert's token count",
        "n_routed_experts",
        aux_loss_coef_key="aux_loss_alpha",
        topk_methods=topk_methods,
        aux_loss_in_model=(
            "DeepseekV2MoE.forward (deepseek_v2/modeling.py:769) adds aux_loss_alpha x each MoE layer's "
            "gate loss to the gradient through AddAuxiliaryLoss; the loss value it returns excludes it"
        ),
    )


# DeepSeek-V2: multi-head latent attention, DeepseekV2MoE (a MoELayer: expert parallel) after
# first_k_dense_replace dense layers. paddlenlp initialises none of its weights; DeepseekV2MoE
# adds its gates' load-balancing loss itself. topk_method must be set (the class default "gready" matches
# no branch of moe_gate.topkgating) and rope_scaling YaRN (the plain RoPE path fails): docs/models.md.
IMPLEMENTATION = Implementation(
    "deepseek_v2",
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    None,  # layout_rules refuses pipelines for a mixture of experts
    LlamaTokenizer,
    read_shape=deepseek_shape,
    norm="rms",
    recomputed_units={False: LLAMA_UNITS, True: LLAMA_UNITS},
    rope_cache_rows=ROPE_ROWS_SEQUENCE,
    vocab_replicated_when_indivisible=True,
    init_weights=WeightInit(),  # DeepseekV2PretrainedModel._init_weights returns at once; MoEGate: Constant(1.0)
    routing=deepseek_routing(("greedy", "group_limited_greedy")),  # noaux_tc: V3's bias, not in V2's gate
    compat=(install_tensor_parallel_mapping,),  # the MTP layers' eh_proj (num_nextn_predict_layers) is whole
    hf=HFFormat(
        "DeepseekV2ForCausalLM",
        "deepseek_v2",
        ("DeepseekV2ForCausalLM",),
        _deepseek_hf_config,
        deepseek_unexportable,
        unimportable=deepseek_unimportable,
        config_from_hf=deepseek_config_from_hf,
    ),
)


DEEPSEEK_V2 = Family("deepseek_v2", IMPLEMENTATION)
FAMILIES = (DEEPSEEK_V2,)


# DeepSeek-V2's YaRN RoPE (both config.json files): 4,096 trained positions stretched 40 times.
DEEPSEEK_YARN = {
    "type": "yarn",
    "factor": 40,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
}


def deepseek_v2_config(
    layers, hidden, heads, q_lora_rank, experts, top_k, expert_width, intermediate, *, aux_alpha, grouped
) -> dict:
    """DeepSeek-V2's config.json values: MLA with kv_lora_rank 512, 128 + 64 query/key head dims and 128 value dims,
    2 shared experts, 1 dense layer first, YaRN RoPE, the sequence-wise load-balancing loss; ``grouped``: DeepSeek-V2
    (236B) routes within 3 of 8 expert groups and scales the routed output by 16 (DeepSeek-V2-Lite: plain top-k)."""
    return {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "q_lora_rank": q_lora_rank,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "intermediate_size": intermediate,
        "moe_intermediate_size": expert_width,
        "n_routed_experts": experts,
        "n_shared_experts": 2,
        "num_experts_per_tok": top_k,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "topk_method": "group_limited_greedy" if grouped else "greedy",
        "n_group": 8 if grouped else 1,
        "topk_group": 3 if grouped else 1,
        "routed_scaling_factor": 16.0 if grouped else 1.0,
        "norm_topk_prob": False,
        "scoring_func": "softmax",
        "aux_loss_alpha": aux_alpha,
        "seq_aux": True,
        "vocab_size": 102400,
        "max_position_embeddings": 163840,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": dict(DEEPSEEK_YARN),
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "bos_token_id": 100000,
        "eos_token_id": 100001,
    }


_DEEPSEEK_V2 = (
    "DeepSeek-AI 2024, DeepSeek-V2 technical report (arXiv 2405.04434), and the deepseek-ai/{} config.json (the same "
    "shapes as deepseek-ai/DeepSeek-V3's inference/configs/config_{}.json); {} parameters in total, {} activated "
    "(the model card){}"
)


MODEL_SIZES = (
    DEEPSEEK_V2.size(
        "deepseek-v2-lite",
        deepseek_v2_config(27, 2048, 16, None, 64, 6, 1408, 10944, aux_alpha=0.001, grouped=False),
        15.7e9,
        _DEEPSEEK_V2.format(
            "DeepSeek-V2-Lite",
            "16B",
            "15.7B",
            "2.4B",
            "; its four safetensors files hold 31.41 GB (3 x 8.59 + 5.64), 15.7e9 bfloat16 values",
        ),
        ("deepseek-ai/DeepSeek-V2-Lite",),
        published_active_params=2.4e9,
    ),
    DEEPSEEK_V2.size(
        "deepseek-v2",
        # aux_loss_alpha: the technical report's expert-level balance factor for the 236B model (alpha_1 = 0.003)
        deepseek_v2_config(60, 5120, 128, 1536, 160, 6, 1536, 12288, aux_alpha=0.003, grouped=True),
        236e9,
        _DEEPSEEK_V2.format("DeepSeek-V2", "236B", "236B", "21B", ""),
        ("deepseek-ai/DeepSeek-V2",),
        published_active_params=21e9,
    ),
    DEEPSEEK_V2.size(
        "deepseek_v2-debug",
        {
            **deepseek_v2_config(4, 256, 4, None, 4, 2, 256, 704, aux_alpha=0.001, grouped=False),
            **{"kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32},
            **{"n_shared_experts": 1, "vocab_size": 8064, "max_position_embeddings": 1024},
            # YaRN as published, over 64 trained positions x 16 = the 1,024 positions
            "rope_scaling": {**DEEPSEEK_YARN, "factor": 16, "original_max_position_embeddings": 64},
        },
        None,
        "ours: DeepSeek-V2-Lite's layout (MLA without query compression, 1 dense layer then experts, a shared "
        "expert, YaRN RoPE) at debug scale: 4 routed experts, top-2",
    ),
)


PUBLISHED = (
    PublishedTokenizer(
        "DeepSeek-V2",
        ("deepseek-v2", "deepseek_v2-"),
        "byte-level BPE, 100,000 tokens + 15 special (vocab_size 102,400)",
        "LlamaTokenizer",
        "on the model hub only (deepseek-ai/DeepSeek-V2-Lite tokenizer.json), no package registry ships it: not "
        "obtainable offline; the debug size runs on the demo tokenizer",
    ),
)
