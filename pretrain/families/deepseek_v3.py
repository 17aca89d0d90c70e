"""DeepSeek-V3's paddlenlp model type, ``deepseek_v3``: DeepSeek-V2's layout (deepseek_v2.py) routed by noaux_tc."""

from __future__ import annotations

import copy
from typing import Optional

import numpy as np
from paddlenlp.transformers import LlamaTokenizer
from paddlenlp.transformers.deepseek_v3 import DeepseekV3Config, DeepseekV3ForCausalLM

from pretrain.errors import UserError
from pretrain.families.common import LLAMA_UNITS, unsupported
from pretrain.families.deepseek_v2 import (
    DEEPSEEK_FIELDS,
    DEEPSEEK_YARN,
    deepseek_config_from_hf,
    deepseek_rope,
    deepseek_routing,
    deepseek_shape,
    deepseek_unexportable,
    deepseek_unimportable,
    deepseek_v2_config,
)
from pretrain.families.records import (
    ROPE_ROWS_SEQUENCE,
    Family,
    HFFormat,
    Implementation,
    PublishedTokenizer,
    WeightInit,
)
from pretrain.mtp import install_tensor_parallel_mapping, prediction_depth

# DeepSeek-V3: transformers' DeepseekV3Config routes by noaux_tc on sigmoid scores always (no topk_method or
# scoring_func keys). It has no aux_loss_alpha or seq_aux either, but the release's config.json holds them (0.001,
# true), transformers keeps them as attributes and paddlenlp's config reads them back: an export writes them, so
# that an import trains with the exported model's coefficient (a transformers-saved folder without them: the
# release's, paddlenlp's defaults).
_DEEPSEEK_V3_FIELDS = tuple(key for key in DEEPSEEK_FIELDS if key != "topk_method")


def _deepseek_v3_hf_config(config) -> dict:
    """DeepseekV3ForCausalLM (transformers >= 4.51, no custom code); the rotary dims interleaved as paddlenlp's;
    the multi-token-prediction modules as the release's config.json counts them (transformers builds none)."""
    fields = {name: getattr(config, name) for name in _DEEPSEEK_V3_FIELDS}
    return {
        **fields,
        "rope_parameters": deepseek_rope(config),
        "hidden_act": config.hidden_act,
        "rope_interleave": True,
        "num_nextn_predict_layers": prediction_depth(config),
    }


# The release's multi-token-prediction module (model.layers.61 of DeepSeek-V3, pretrain.mtp) holds its own copies of
# tensors that paddlenlp's DeepseekV2MTPLayer shares with the main model: {its name: the main model's}.
_MTP_COPIES = {
    "embed_tokens.weight": "model.embed_tokens.weight",
    "shared_head.head.weight": "lm_head.weight",
    "shared_head.norm.weight": "model.norm.weight",
}


def _mtp_layers(config) -> range:
    return range(config.num_hidden_layers, config.num_hidden_layers + prediction_depth(config))


def _swapped_halves(weight: np.ndarray) -> np.ndarray:
    """eh_proj [hidden, 2 x hidden] (torch layout) with its two input halves exchanged: paddlenlp concatenates
    [hnorm(h); enorm(e)] (deepseek_v2/modeling.py:1201), the release [enorm(e); hnorm(h)] (vLLM's
    deepseek_mtp.py, ``DeepSeekMultiTokenPredictorLayer``). Its own inverse."""
    half = weight.shape[1] // 2
    return np.ascontiguousarray(np.concatenate([weight[:, half:], weight[:, :half]], axis=1))


def _deepseek_v3_to_hf(name: str, array: np.ndarray, config) -> list:
    """Export: each MTP module's eh_proj in the release's input order, and its copies of the embedding, output
    head and final norm (``_MTP_COPIES``) beside the main model's."""
    out = [(name, array)]
    for layer in _mtp_layers(config):
        if name == f"model.layers.{layer}.eh_proj.weight":
            out = [(name, _swapped_halves(array))]
        out += [(f"model.layers.{layer}.{copy_name}", array) for copy_name, main in _MTP_COPIES.items() if main == name]
    return out


def _deepseek_v3_from_hf(tensors: dict, config, read) -> dict:
    """Import: the inverse of ``_deepseek_v3_to_hf``; each MTP copy must equal the main model's tensor, which
    paddlenlp's module reads in its place.

    Raises:
        UserError: a copy differs (the module was trained with its own), naming the fix.
    """
    tensors = dict(tensors)
    for layer in _mtp_layers(config):
        projection = f"model.layers.{layer}.eh_proj.weight"
        if projection in tensors:
            tensors[projection] = _swapped_halves(tensors[projection])
        for duplicate, main in _MTP_COPIES.items():
            name = f"model.layers.{layer}.{duplicate}"
            if name not in tensors:
                continue
            if not np.array_equal(tensors.pop(name), tensors[main] if main in tensors else read(main)):
                raise UserError(
                    f"continue_training: {name} differs from {main}, which paddlenlp's multi-token-prediction "
                    "module reads in its place; to start without the module, set num_nextn_predict_layers 0 in the "
                    f"folder's config.json and drop its model.layers.{layer}.* tensors"
                )
    return tensors


def _deepseek_v3_unexportable(config) -> Optional[str]:
    if config.topk_method != "noaux_tc" or config.scoring_func != "sigmoid":
        return (
            f"topk_method {config.topk_method!r}, scoring_func {config.scoring_func!r}: transformers' "
            "DeepseekV3ForCausalLM routes by noaux_tc on sigmoid scores"
        )
    return deepseek_unexportable(_softmax_view(config))


def _softmax_view(config):
    """``config`` as ``deepseek_unexportable`` checks it (its RoPE and layer pattern), scoring and the
    multi-token-prediction modules (V3's layout carries them) aside."""
    view = copy.copy(config)
    view.scoring_func, view.num_nextn_predict_layers = "softmax", 0
    return view


def _deepseek_v3_unimportable(hf_config: dict) -> Optional[str]:
    why = deepseek_unimportable({**hf_config, "topk_method": "greedy"})
    return why or unsupported(hf_config, {"rope_interleave": (True,)})


def _deepseek_v3_config_from_hf(hf_config: dict) -> dict:
    # paddlenlp's DeepseekV2Config defaults (greedy, softmax) are not V3's; its aux_loss_alpha 0.001 with seq_aux,
    # what a folder without them gets, is the release's config.json value. The multi-token-prediction modules of
    # the config.json (transformers' own config leaves the key out: none), weighed by the report's first lambda
    # (pretrain.mtp).
    return {
        **deepseek_config_from_hf(hf_config),
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "num_nextn_predict_layers": hf_config.get("num_nextn_predict_layers", 0),
        "num_nextn_predict_lambda": 0.3,
    }


# DeepSeek-V3: DeepSeek-V2's classes under another prefix (deepseek_v3/modeling.py subclasses them), routed
# by noaux_tc: sigmoid scores plus a per-expert bias (e_score_correction_bias) choose the experts. paddlenlp
# 3.0.0b4 never updates that bias; pretrain.bias_balancing does (the release's bias-based balancing).
IMPLEMENTATION = Implementation(
    "deepseek_v3",
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    None,
    LlamaTokenizer,
    read_shape=deepseek_shape,
    norm="rms",
    recomputed_units={False: LLAMA_UNITS, True: LLAMA_UNITS},
    rope_cache_rows=ROPE_ROWS_SEQUENCE,
    vocab_replicated_when_indivisible=True,
    init_weights=WeightInit(),
    routing=deepseek_routing(("noaux_tc",)),
    compat=(install_tensor_parallel_mapping,),  # the MTP layers' eh_proj is whole on every tensor-parallel rank
    hf=HFFormat(
        "DeepseekV3ForCausalLM",
        "deepseek_v3",
        ("DeepseekV3ForCausalLM",),
        _deepseek_v3_hf_config,
        _deepseek_v3_unexportable,
        unimportable=_deepseek_v3_unimportable,
        config_from_hf=_deepseek_v3_config_from_hf,
        rename=_deepseek_v3_to_hf,
        from_hf=_deepseek_v3_from_hf,
    ),
)


DEEPSEEK_V3 = Family("deepseek_v3", IMPLEMENTATION)
FAMILIES = (DEEPSEEK_V3,)


def _deepseek_v3(layers, hidden, heads, experts, top_k, expert_width, intermediate, dense, vocab) -> dict:
    """DeepSeek-V3's config.json values on DeepSeek-V2's layout: 1 shared expert, ``dense`` dense layers first,
    sigmoid scores routed by noaux_tc within 4 of 8 groups, renormalised and scaled by 2.5; YaRN with
    mscale 1.0; one multi-token-prediction module (``pretrain.mtp``; config.json's num_nextn_predict_layers 1)
    whose loss weighs 0.3, the report's lambda for the first 10T of its 14.8T tokens (arXiv 2412.19437 section
    4.2: 0.1 for the rest; a run that continues past them sets num_nextn_predict_lambda 0.1)."""
    return {
        **deepseek_v2_config(
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
        "num_nextn_predict_layers": 1,
        "num_nextn_predict_lambda": 0.3,
        "vocab_size": vocab,
        "rope_scaling": {**DEEPSEEK_YARN, "mscale": 1.0, "mscale_all_dim": 1.0},
        "bos_token_id": 0,
        "eos_token_id": 1,
    }


MODEL_SIZES = (
    DEEPSEEK_V3.size(
        "deepseek-v3",
        _deepseek_v3(61, 7168, 128, 256, 8, 2048, 18432, 3, 129280),
        671e9,
        "DeepSeek-AI 2024, DeepSeek-V3 technical report (arXiv 2412.19437) and deepseek-ai/DeepSeek-V3's "
        "inference/configs/config_671B.json; 671B parameters in total, 37B activated (the report; the Hugging Face "
        "checkpoint's 685B add the 14B multi-token-prediction module, not built here)",
        ("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3-Base"),
        published_active_params=37e9,
    ),
    DEEPSEEK_V3.size(
        "deepseek_v3-debug",
        {
            **_deepseek_v3(4, 256, 4, 8, 2, 256, 704, 1, 8064),
            **{"q_lora_rank": 64, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16},
            **{"v_head_dim": 32, "n_group": 4, "topk_group": 2, "max_position_embeddings": 1024},
            "rope_scaling": {
                **DEEPSEEK_YARN,
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


PUBLISHED = (
    PublishedTokenizer(
        "DeepSeek-V3",
        ("deepseek-v3", "deepseek_v3-"),
        "byte-level BPE, 128K tokens (vocab_size 129,280)",
        "LlamaTokenizer",
        "on the model hub only (deepseek-ai/DeepSeek-V3 tokenizer.json), no package registry ships it: not obtainable "
        "offline; the debug size runs on the demo tokenizer",
    ),
)
