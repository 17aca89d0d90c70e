"""DeepSeek-V3's auxiliary-loss-free load balancing: after each optimizer step, every routed expert's routing
bias moves by a fixed amount toward balance.

DeepSeek-V3 (technical report, arXiv:2412.19437, section 2.1.2) chooses each token's experts by its affinity
score plus a per-expert bias b_i (``e_score_correction_bias`` in paddlenlp's and transformers' gate; the bias
chooses, the gating weights stay the plain scores), and "at the end of each step" decreases b_i by gamma for an
overloaded expert and increases it by gamma for an underloaded one: b_i += gamma x sign(mean load - load_i),
the loads counted over the whole batch; gamma ("bias update speed") was 0.001 for the first 14.3T tokens and 0
for the last 500B (section 4.2). Megatron-LM (``moe_router_enable_expert_bias``,
``moe_router_bias_update_rate`` 1e-3, the loads summed over the data-parallel ranks) and torchtitan
(``load_balance_coeff`` 1e-3) implement the same rule.

paddlenlp 3.0.0b4 creates the bias (zeros; ``DeepseekV2MoEGate`` with ``topk_method: noaux_tc``) and never
updates it in dygraph training: its gradient is None (only the choice reads it) and no code path applies the
rule, so a DeepSeek-V3 pretrained with paddlenlp alone routes by its scores alone. ``BiasBalancer`` applies the
rule at the end of each applied optimizer step (not a step the NaN or spike guard skipped), from the expert
loads ``pretrain.routing.RouterWatch`` counts (the experts each gate chose, its ``exp_counts``), summed over the
data-parallel and sharding ranks so every rank applies the same update. The bias is a model parameter, so it is
saved in every checkpoint and restored by a resume or a rollback with the weights.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import paddle

BIAS = "e_score_correction_bias"  # the gate attribute, paddlenlp's and transformers' name
DEFAULT_RATE = 1e-3  # gamma of DeepSeek-V3 (technical report, section 4.2), Megatron-LM's and torchtitan's default


def routing_biases(routers: list) -> list:
    """The ``e_score_correction_bias`` parameter ([experts] float32) of each router that has one, in order;
    [] when none has (every family but DeepSeek-V3's ``noaux_tc`` routing)."""
    return [getattr(router, BIAS) for router in routers if getattr(router, BIAS, None) is not None]


def update_rate(requested: Optional[float], has_biases: bool) -> float:
    """The bias update speed gamma of a run: ``requested`` (the ``moe_bias_update_rate`` argument) when set,
    else ``DEFAULT_RATE`` for a model with routing biases and 0 without (preflight refuses a rate > 0 there)."""
    if requested is not None:
        return float(requested)
    return DEFAULT_RATE if has_biases else 0.0


def bias_steps(loads: np.ndarray) -> np.ndarray:
    """sign(mean load - load) of each expert ([layers, experts] token counts -> [layers, experts] of -1, 0,
    1): +1 for an underloaded expert, -1 for an overloaded one, 0 at the mean."""
    return np.sign(loads.mean(axis=1, keepdims=True) - loads)


class BiasBalancer:
    """Moves each routing bias by ``rate`` x ``bias_steps`` of its layer's loads.

    Args:
        biases: the routing-bias parameters ([experts] float32 each), one per MoE layer (``routing_biases``).
        rate: gamma, > 0.
    """

    def __init__(self, biases: list, rate: float):
        self.biases, self.rate = biases, float(rate)

    @paddle.no_grad()
    def update(self, loads: np.ndarray) -> None:
        """Apply one step's update; ``loads``: [layers, experts] tokens each expert received in the step
        (over the global batch), in the order of ``biases``.

        Raises:
            ValueError: ``loads`` has another number of layers or experts than the biases.
        """
        if loads.shape != (len(self.biases), self.biases[0].shape[0]):
            raise ValueError(f"loads of shape {loads.shape} for {len(self.biases)} biases of {self.biases[0].shape}")
        steps = bias_steps(loads).astype("float32")
        for bias, step in zip(self.biases, steps):
            bias.set_value(bias + paddle.to_tensor(step * np.float32(self.rate)))
