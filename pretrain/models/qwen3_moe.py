"""Qwen3-MoE on paddlenlp 3.0.0b4's Qwen2-MoE classes and this package's Qwen3 attention (Qwen3 Technical
Report, Yang et al. 2025, sec. 2: "the Qwen3 MoE models ... exclude shared experts ... adopt the global-batch
load balancing loss").

The decoder is Qwen2-MoE's (paddlenlp ``qwen2_moe/modeling.py``) with these changes, read from transformers'
``models/qwen3_moe/modeling_qwen3_moe.py`` (4.55), the reference these classes are tested against:

- the attention is Qwen3's (``pretrain.models.qwen3.Qwen3Attention``: per-head q/k RMSNorm, an explicit
  ``head_dim``, no q/k/v bias);
- no shared expert and no shared-expert gate (``Qwen3MoeSparseMoeBlock`` has the router and the routed
  experts only);
- the top-k routing weights renormalised to sum to 1 when ``norm_topk_prob`` (true in every published
  config.json): paddlenlp's ``PretrainedMoEGate`` does it when built with ``norm_topk_prob``
  (moe_gate.py lines 549-551 and 582-584), which ``Qwen2MoeSparseMoEBlock`` never passes;
- a layer has experts when ``layer not in mlp_only_layers and (layer + 1) % decoder_sparse_step == 0``
  (transformers' ``Qwen3MoeDecoderLayer``), else a dense SwiGLU MLP of ``intermediate_size``
  (paddlenlp's ``Qwen2MLP``); paddlenlp's Qwen2-MoE puts experts in every layer whatever the config says.

The load-balancing loss is transformers' ``load_balancing_loss_func`` over every MoE layer's router logits
(Switch Transformer's, summed over the k choices), times ``router_aux_loss_coef``: ``pretrain.routing`` adds it
as for Qwen2-MoE and Mixtral (the same function in paddlenlp's Mixtral code); ``output_router_logits`` stays off.

The weights keep paddlenlp's Qwen2-MoE names (the base model under ``qwen2_moe``, ``qwen2_moe.layers.N.mlp.
experts.E.gate_proj.weight``, ``qwen2_moe.layers.N.mlp.gate.weight``), so its name and tensor-parallel mappings
apply with the q/k/v biases and the shared expert removed, the head norms added and a dense layer's MLP named as
transformers names it (``mlp.gate_proj``). paddlenlp 3.0.0b4's ``Qwen2MoeForCausalLMPipe`` builds Qwen2-MoE
layers by name, so the registry leaves ``pipe_class`` None (and preflight refuses pipelines for a mixture of
experts in any case).
"""

from __future__ import annotations

import math

import paddle
from paddle import nn
from paddlenlp.transformers.conversion_utils import StateDictNameMapping
from paddlenlp.transformers.model_utils import register_base_model
from paddlenlp.transformers.moe_layer import MoELayer
from paddlenlp.transformers.qwen2.modeling import Qwen2Attention, Qwen2MLP
from paddlenlp.transformers.qwen2_moe import Qwen2MoeConfig
from paddlenlp.transformers.qwen2_moe.modeling import (
    Qwen2MoeDecoderLayer,
    Qwen2MoeForCausalLM,
    Qwen2MoeGate,
    Qwen2MoeLMHead,
    Qwen2MoeMLP,
    Qwen2MoeModel,
    Qwen2MoePretrainedModel,
    Qwen2MoePretrainingCriterion,
    Qwen2MoeRMSNorm,
    Qwen2MoeSparseMoEBlock,
)
from paddlenlp.transformers.refined_recompute import get_skip_recompute_ops

from pretrain.models.qwen3 import Qwen3Attention


class Qwen3MoeConfig(Qwen2MoeConfig):
    """Qwen2MoeConfig plus ``head_dim`` (default hidden_size // num_attention_heads) and ``mlp_only_layers``
    (layer indices with a dense MLP; default none), as transformers' Qwen3MoeConfig names them."""

    model_type = "qwen3_moe"

    def __init__(self, head_dim=None, mlp_only_layers=None, **kwargs):
        super().__init__(**kwargs)
        self.head_dim = head_dim or self.hidden_size // self.num_attention_heads
        self.mlp_only_layers = list(mlp_only_layers or [])


def has_experts(config: Qwen3MoeConfig, layer: int) -> bool:
    """Whether decoder layer ``layer`` (0-based) has routed experts (transformers' ``Qwen3MoeDecoderLayer``)."""
    sparse = config.num_experts > 0 and (layer + 1) % config.decoder_sparse_step == 0
    return sparse and layer not in config.mlp_only_layers


class Qwen3MoeSparseMoeBlock(Qwen2MoeSparseMoEBlock):
    """Qwen2-MoE's block without the shared expert, its gate renormalising the top-k weights when
    ``norm_topk_prob``: [batch, seq, hidden] -> ([batch, seq, hidden], the gate's load-balancing loss scalar)."""

    def __init__(self, config: Qwen3MoeConfig):
        gate = Qwen2MoeGate(
            config,
            config.num_experts,
            config.hidden_size,
            top_k=config.num_experts_per_tok,
            drop_tokens=False,
            norm_topk_prob=config.norm_topk_prob,
        )
        # MoELayer's, not Qwen2MoeSparseMoEBlock's: that one also builds the shared expert and its gate
        MoELayer.__init__(
            self,
            config,
            moe_num_experts=config.num_experts,
            expert_class=Qwen2MoeMLP,
            expert_kwargs={"config": config},
            gate=gate,
            capacity=2.0,
        )
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob

    def forward(self, hidden_states: paddle.Tensor) -> tuple:
        final_hidden_states, l_aux, _ = MoELayer.forward(self, hidden_states)
        return final_hidden_states, l_aux


class Qwen3MoeDecoderLayer(Qwen2MoeDecoderLayer):
    """Qwen2MoeDecoderLayer (its forward) on ``Qwen3Attention``, with experts or a dense MLP by
    ``has_experts``. Built without Qwen2MoeDecoderLayer.__init__, which would first build a Qwen2-MoE attention
    and a block with a shared expert; the attributes set are the ones its forward reads."""

    def __init__(self, config: Qwen3MoeConfig, layer: int, layerwise_recompute: bool = False, skip_recompute_ops=None):
        nn.Layer.__init__(self)
        self.config = config
        self.self_attn = Qwen3Attention(config, layerwise_recompute, skip_recompute_ops=skip_recompute_ops)
        if has_experts(config, layer):
            self.mlp = Qwen3MoeSparseMoeBlock(config)
        else:
            self.mlp = Qwen2MLP(config, skip_recompute_ops=skip_recompute_ops)
        self.input_layernorm = Qwen2MoeRMSNorm(config)
        self.post_attention_layernorm = Qwen2MoeRMSNorm(config)
        self.sequence_parallel = config.sequence_parallel
        self.enable_recompute = False  # the Trainer turns recompute on
        self.layerwise_recompute = layerwise_recompute
        self.recompute_granularity = config.recompute_granularity


class Qwen3MoePretrainedModel(Qwen2MoePretrainedModel):
    """Qwen2-MoE's mappings without the q/k/v biases and the shared expert, plus the per-head norms
    (replicated on tensor-parallel ranks: no split action); a dense layer's MLP as transformers names it."""

    config_class = Qwen3MoeConfig

    @classmethod
    def _get_name_mappings(cls, config: Qwen3MoeConfig) -> list:
        prefixes = ("", "") if "Qwen2MoeModel" in config.architectures else ("model.", "qwen2_moe.")
        rows = []
        for m in super()._get_name_mappings(config):
            if _left_out(m.source_name, config):
                continue
            rows.append([m.source_name, m.target_name, m.action])
        for layer in range(config.num_hidden_layers):
            names: list = [(f"layers.{layer}.self_attn.{norm}.weight", None) for norm in ("q_norm", "k_norm")]
            if not has_experts(config, layer):
                names += [(f"layers.{layer}.mlp.{p}_proj.weight", "transpose") for p in ("gate", "up", "down")]
            rows += [[prefixes[0] + name, prefixes[1] + name, action] for name, action in names]
        return [StateDictNameMapping(*row, index=index) for index, row in enumerate(rows)]

    @classmethod
    def _get_tensor_parallel_mappings(cls, config: Qwen3MoeConfig, is_split=True):
        actions = super()._get_tensor_parallel_mappings(config, is_split=is_split)
        kept = {name: action for name, action in actions.items() if not _left_out(name, config)}
        for layer in range(config.num_hidden_layers):
            if not has_experts(config, layer):  # a dense MLP splits as the experts do
                expert = f"layers.{layer}.mlp.experts.0."
                for part in ("gate", "up", "down"):
                    kept[f"layers.{layer}.mlp.{part}_proj.weight"] = actions[f"{expert}{part}_proj.weight"]
        return kept

    def _init_weights(self, layer):
        """paddlenlp's Qwen2-MoE init, and its 1 / sqrt(2 x layers) scale of the output projections
        (qwen2_moe/modeling.py lines 1175-1182) on the Qwen2 classes it does not know (Qwen3's attention, a
        dense layer's ``Qwen2MLP``), as paddlenlp's Qwen2 init scales them (qwen2/modeling.py lines 1107-1112)."""
        super()._init_weights(layer)
        projection = {Qwen2MLP: "down_proj", Qwen2Attention: "o_proj"}
        for layer_class, name in projection.items():
            if isinstance(layer, layer_class):
                with paddle.no_grad():
                    getattr(layer, name).weight.scale_(1 / math.sqrt(2 * self.config.num_hidden_layers))


def _left_out(name: str, config: Qwen3MoeConfig) -> bool:
    """Whether a Qwen2-MoE mapping's tensor ``name`` is absent from Qwen3-MoE: the q/k/v biases, the shared
    expert and its gate, and the experts and router of a dense layer."""
    if name.endswith("_proj.bias") or ".mlp.shared_expert" in name:
        return True
    parts = name.split(".")
    if "layers" not in parts or ".mlp." not in name:
        return False
    layer = int(parts[parts.index("layers") + 1])
    return not has_experts(config, layer)


@register_base_model
class Qwen3MoeModel(Qwen3MoePretrainedModel, Qwen2MoeModel):
    """Qwen2MoeModel on ``Qwen3MoeDecoderLayer``s (built once: Qwen2MoeModel's own layers are never made)."""

    def __init__(self, config: Qwen3MoeConfig):
        layers = config.num_hidden_layers
        config.num_hidden_layers = 0  # Qwen2MoeModel.__init__ builds its embedding and norm, no Qwen2-MoE layer
        try:
            Qwen2MoeModel.__init__(self, config)
        finally:
            config.num_hidden_layers = layers
        self.layers = nn.LayerList(
            [
                Qwen3MoeDecoderLayer(
                    config,
                    index,
                    layerwise_recompute=index not in self.no_recompute_layers,
                    skip_recompute_ops=get_skip_recompute_ops(config, index),
                )
                for index in range(layers)
            ]
        )


class Qwen3MoeForCausalLM(Qwen3MoePretrainedModel, Qwen2MoeForCausalLM):
    """Qwen2MoeForCausalLM on ``Qwen3MoeModel`` (its forward, loss and generation unchanged)."""

    def __init__(self, config: Qwen3MoeConfig):
        super(Qwen2MoeForCausalLM, self).__init__(config)  # PretrainedModel's: Qwen2MoeForCausalLM's builds Qwen2-MoE
        self.config = config
        self.qwen2_moe = Qwen3MoeModel(config)
        self.lm_head = Qwen2MoeLMHead(config)
        self.criterion = Qwen2MoePretrainingCriterion(config)
        self.router_aux_loss_coef = config.router_aux_loss_coef
        self.num_experts = config.num_experts
        self.num_experts_per_tok = config.num_experts_per_tok
