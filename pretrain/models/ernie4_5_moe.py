"""ERNIE-4.5's mixture of experts (ERNIE-4.5-21B-A3B, 300B-A47B) on this package's ERNIE-4.5 decoder and
paddlenlp 3.0.0b4's DeepSeek-V2 MoE block (ERNIE 4.5 Technical Report, Baidu 2025).

Read from transformers' ``models/ernie4_5_moe/modeling_ernie4_5_moe.py`` (4.55), the reference these classes are
tested against: the dense ERNIE-4.5 decoder (``pretrain.models.ernie4_5``: explicit ``head_dim``, no biases
with ``use_bias`` false, RoPE on interleaved pairs) whose MLP is, in the layers ``has_experts`` names, an
``Ernie4_5_MoeSparseMoeBlock``:

- router logits from a bias-free float32 gate [hidden, ``moe_num_experts``], their softmax the scores;
- the ``moe_k`` experts of the highest score + ``e_score_correction_bias`` (``moe_statics``, one per expert,
  not trained by the loss) chosen, weighted by their plain scores renormalised to sum to 1 (the sum clamped at
  ``moe_norm_min``, 1e-12);
- plus ``moe_num_shared_experts`` shared experts, one SwiGLU MLP of ``moe_intermediate_size`` x their number.

That is DeepSeek-V3's ``noaux_tc`` routing of paddlenlp's ``MoEGate`` (``moe_gate.py``, ``_topk_noaux_tc`` and
``topkgating``) with ``scoring_func`` softmax, one expert group (``n_group`` = ``topk_group`` = 1: the group
step keeps every expert), ``norm_topk_prob`` and ``routed_scaling_factor`` 1.0, and ``DeepseekV2MoE``'s shared
experts: the block is paddlenlp's ``DeepseekV2MoE`` (a ``MoELayer``: expert parallelism, dropless dispatch)
built from this config, whose DeepSeek keys are aliases or fixed class values (``Ernie4_5MoeConfig``). paddlenlp
divides by the sum + 1e-20 (evaluation) or clipped at float32's eps (training) instead of clamping at 1e-12:
a softmax's top-k sum is at least k / experts, so the weights are the same. The routing bias is paddlenlp's
[experts] where transformers holds [1, experts] (``moe_statics.e_score_correction_bias``): the family's
Hugging Face format reshapes it (pretrain.families.ernie4_5_moe); ``pretrain.bias_balancing`` moves it.

The load-balancing loss is ``DeepseekV2MoE``'s (``aux_loss_in_model``, pretrain.routing): each MoE layer's
gate loss (Switch Transformer's, ``MoEGateMixin._cal_aux_loss``: experts x sum_e mean score_e x share of the
tokens that chose e, k when balanced) times ``router_aux_loss_coef``, summed over the MoE layers; transformers'
``load_balancing_loss_func`` (used with ``output_router_logits`` only) takes the same product once over every
layer's tokens pooled, so at one coefficient this one weighs about (MoE layers) times more. It chooses on the
plain scores (no bias), paddlenlp's gate on the biased ones, which is what the experts received.

Weights keep paddlenlp's Qwen2 names (``qwen2.layers.N.mlp.gate.weight``, ``...mlp.experts.E.gate_proj.weight``,
``...mlp.shared_experts.up_proj.weight``) and transformers' besides the routing bias (``mlp.gate.
e_score_correction_bias`` for ``mlp.moe_statics.e_score_correction_bias``). The experts are ``DeepseekV2MLP``
(``is_moe``): plain linear layers, whole on every tensor-parallel rank; the shared experts and a dense layer's
MLP split as the dense MLP does. No pipeline class (paddlenlp has none; preflight refuses pipelines for a
mixture of experts in any case).
"""

from __future__ import annotations

from functools import partial

from paddle import nn
from paddlenlp.transformers.conversion_utils import StateDictNameMapping, split_or_merge_func
from paddlenlp.transformers.deepseek_v2.modeling import DeepseekV2MoE
from paddlenlp.transformers.model_utils import register_base_model
from paddlenlp.transformers.refined_recompute import get_skip_recompute_ops

from pretrain.models.ernie4_5 import (
    Ernie4_5Config,
    Ernie4_5DecoderLayer,
    Ernie4_5ForCausalLM,
    Ernie4_5Model,
    Ernie4_5PretrainedModel,
)


class Ernie4_5MoeConfig(Ernie4_5Config):
    """Ernie4_5Config plus transformers' ``Ernie4_5_MoeConfig`` routing keys (its defaults: ERNIE-4.5-21B-A3B's),
    as model type ``ernie4_5_moe``; ``DeepseekV2MoE``'s keys read them through ``attribute_map`` or are the
    fixed values of ERNIE's routing (module docstring)."""

    model_type = "ernie4_5_moe"
    attribute_map = {
        **Ernie4_5Config.attribute_map,
        "n_routed_experts": "moe_num_experts",
        "num_experts_per_tok": "moe_k",  # transformers' alias too
        "aux_loss_alpha": "router_aux_loss_coef",
    }
    topk_method = "noaux_tc"
    scoring_func = "softmax"
    n_group = 1
    topk_group = 1
    norm_topk_prob = True
    routed_scaling_factor = 1.0
    seq_aux = False  # the batch-wise gate loss
    use_fp8 = False  # DeepseekV2MLP reads it

    def __init__(
        self,
        moe_num_experts=64,
        moe_k=6,
        moe_intermediate_size=1536,
        moe_num_shared_experts=2,
        moe_layer_start_index=1,
        moe_layer_end_index=-1,
        moe_layer_interval=1,
        moe_norm_min=1e-12,
        router_aux_loss_coef=0.001,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.moe_num_experts = moe_num_experts
        self.moe_k = moe_k
        self.moe_intermediate_size = moe_intermediate_size
        self.moe_num_shared_experts = moe_num_shared_experts
        self.moe_layer_start_index = moe_layer_start_index
        self.moe_layer_end_index = moe_layer_end_index
        self.moe_layer_interval = moe_layer_interval
        self.moe_norm_min = moe_norm_min
        self.router_aux_loss_coef = router_aux_loss_coef

    @property
    def n_shared_experts(self):
        """``DeepseekV2MoE``'s: None for no shared expert (it builds one whenever this is not None)."""
        return self.moe_num_shared_experts or None


def has_experts(config: Ernie4_5MoeConfig, layer: int) -> bool:
    """Whether decoder layer ``layer`` (0-based) has routed experts: transformers' ``Ernie4_5_MoeDecoderLayer``,
    (layer + 1) % moe_layer_interval == 0 and moe_layer_start_index <= layer <= moe_layer_end_index (-1: the last
    layer, as ``Ernie4_5_MoeConfig`` reads it)."""
    end = config.moe_layer_end_index if config.moe_layer_end_index >= 0 else config.num_hidden_layers - 1
    sparse = config.moe_num_experts > 0 and (layer + 1) % config.moe_layer_interval == 0
    return sparse and config.moe_layer_start_index <= layer <= end


class Ernie4_5MoeDecoderLayer(Ernie4_5DecoderLayer):
    """Ernie4_5DecoderLayer whose MLP is a ``DeepseekV2MoE`` where ``has_experts`` says so (Qwen2DecoderLayer's
    forward calls ``self.mlp`` either way)."""

    def __init__(self, config: Ernie4_5MoeConfig, layer: int, layerwise_recompute=False, skip_recompute_ops=None):
        super().__init__(config, layerwise_recompute, skip_recompute_ops=skip_recompute_ops)
        if has_experts(config, layer):
            self.mlp = DeepseekV2MoE(config)


def _moe_tensors(layer: int, config: Ernie4_5MoeConfig) -> list:
    """(name under the base model, mapping action) of MoE layer ``layer``'s tensors, transformers' names."""
    names = [(f"layers.{layer}.mlp.gate.weight", "transpose")]
    experts = [f"experts.{expert}" for expert in range(config.moe_num_experts)]
    for module in experts + (["shared_experts"] if config.n_shared_experts else []):
        names += [(f"layers.{layer}.mlp.{module}.{part}_proj.weight", "transpose") for part in ("gate", "up", "down")]
    return names


class Ernie4_5MoePretrainedModel(Ernie4_5PretrainedModel):
    """ERNIE-4.5's (Qwen2's) mappings with each MoE layer's router, routing bias, experts and shared experts in
    place of its dense MLP; the shared experts split over tensor-parallel ranks as a dense MLP, the rest whole."""

    config_class: type = Ernie4_5MoeConfig

    @classmethod
    def _get_name_mappings(cls, config: Ernie4_5MoeConfig) -> list:
        source, target = ("", "") if "Qwen2Model" in config.architectures else ("model.", "qwen2.")
        rows = [[m.source_name, m.target_name, m.action] for m in super()._get_name_mappings(config)]
        rows = [row for row in rows if not _dense_mlp_of_moe_layer(row[1], config)]
        for layer in filter(lambda index: has_experts(config, index), range(config.num_hidden_layers)):
            rows += [[source + name, target + name, action] for name, action in _moe_tensors(layer, config)]
            bias = f"layers.{layer}.mlp.%s.e_score_correction_bias"
            rows.append([source + bias % "moe_statics", target + bias % "gate", None])
        return [StateDictNameMapping(*row, index=index) for index, row in enumerate(rows)]

    @classmethod
    def _get_tensor_parallel_mappings(cls, config: Ernie4_5MoeConfig, is_split=True):
        actions = super()._get_tensor_parallel_mappings(config, is_split=is_split)
        kept = {name: action for name, action in actions.items() if not _dense_mlp_of_moe_layer(name, config)}
        if not config.n_shared_experts:
            return kept
        # DeepseekV2MLP(is_moe=False): gate and up column-parallel, down row-parallel (Qwen2's dense MLP's split)
        split = split_or_merge_func(
            is_split=is_split,
            tensor_parallel_degree=config.tensor_parallel_degree,
            tensor_parallel_rank=config.tensor_parallel_rank,
            num_attention_heads=config.num_attention_heads,
        )
        for layer in filter(lambda index: has_experts(config, index), range(config.num_hidden_layers)):
            for part in ("gate", "up", "down"):
                action = partial(split, is_column=part != "down")
                kept[f"layers.{layer}.mlp.shared_experts.{part}_proj.weight"] = action
        return kept


def _dense_mlp_of_moe_layer(name: str, config: Ernie4_5MoeConfig) -> bool:
    """Whether ``name`` (a mapping's paddlenlp name or tensor-parallel key) is the dense MLP of a layer that has
    experts instead."""
    parts = name.split(".")
    if ".mlp." not in name or "layers" not in parts:
        return False
    return has_experts(config, int(parts[parts.index("layers") + 1]))


@register_base_model
class Ernie4_5MoeModel(Ernie4_5MoePretrainedModel, Ernie4_5Model):
    """Ernie4_5Model on ``Ernie4_5MoeDecoderLayer``s."""

    def __init__(self, config: Ernie4_5MoeConfig):
        Ernie4_5Model.__init__(self, config)

    def decoder_layer(self, config: Ernie4_5MoeConfig, index: int) -> nn.Layer:
        return Ernie4_5MoeDecoderLayer(
            config,
            index,
            layerwise_recompute=index not in self.no_recompute_layers,
            skip_recompute_ops=get_skip_recompute_ops(config, index),
        )


class Ernie4_5MoeForCausalLM(Ernie4_5MoePretrainedModel, Ernie4_5ForCausalLM):
    """Qwen2ForCausalLM on ``Ernie4_5MoeModel`` (its forward, loss and generation unchanged)."""

    def __init__(self, config: Ernie4_5MoeConfig):
        Ernie4_5ForCausalLM.__init__(self, config)
