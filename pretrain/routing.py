"""Mixture-of-experts routing: the load-balancing loss added to the language-model loss, and what the
routers did, per layer and expert, at every log record.

A forward post-hook on each MoE layer's router (``registry.Routing.router_suffix``) keeps its logits,
its input [..., hidden] times its ``weight`` [hidden, experts] (the same product the layer computes),
while the model trains. After each training forward ``RouterWatch.take`` computes from them

- the load-balancing loss: paddlenlp's ``load_balancing_loss_func`` (Switch Transformer, Fedus et al. 2022,
  eq. 4-6; Mixtral's and Qwen2-MoE's function in paddlenlp 3.0.0b4, as in Hugging Face transformers) over
  every layer's logits of the forward: E x sum_j sum_e (fraction of the tokens whose j-th choice is e) x (mean
  router probability of e), summed over the k choices j (``transformers/mixtral/modeling.py:104,138-139``),
  so k when perfectly balanced, up to E. The trainer adds ``aux_loss_coef`` x it to
  the loss (``PretrainingTrainer.compute_loss``), with ``aux_loss_coef`` the model config's
  ``router_aux_loss_coef`` (the registry entry's, i.e. the published config.json's, or a local
  config.json's). The models' own path for it (``output_router_logits``) stays off: Qwen2-MoE's passes
  its gates' loss scalars, not logits, to that function. The evaluation loss has no auxiliary term.
  A model that adds its loss itself (``registry.Routing.aux_loss_in_model``: DeepSeek-V2, whose
  ``DeepseekV2MoE`` adds ``aux_loss_alpha`` x each MoE layer's gate loss to the gradient) gets nothing added:
  its loss is then the sum over its MoE layers of the loss each gate returned (DeepSeek-V2's sequence-wise
  loss, its technical report's eq. 23-25 with ``seq_aux``: 1.0 per layer when balanced, ``moe_gate.py:132-150``;
  without ``seq_aux`` the batch-wise one, k per layer, lines 118-129), read from the gates' outputs, so
  ``aux_loss_coef`` x it is what the model's gradient carries. Its routing shares count the experts each gate
  chose (its ``exp_counts`` output).
- ``aux_loss``, the figure logged, printed (``aux``) and recorded: that loss divided by its value under perfectly
  balanced routing (``RouterWatch.aux_loss_scale``: k; DeepSeek's, the MoE layers x 1 with ``seq_aux``, x k
  without), so 1.0 reads as balanced for every family and E/k as every token on the same experts (a softmax
  router's bound). ``aux_loss_coef`` x ``aux_loss_scale`` x ``aux_loss`` is the term the loss carries.
  DeepSeek-V3's sigmoid scores do not sum to 1: its balanced figure is the mean score sum over experts, not 1.
- ``z_loss``: the router z-loss of ST-MoE (Zoph et al. 2022, eq. 5), mean over tokens of
  logsumexp(logits)^2, averaged over layers: logged only (coefficient 0; neither paddlenlp model nor
  the published recipes add one).
- per layer, the tokens each expert received: ``expert_share[layer][expert]`` = the fraction of the
  interval's tokens that chose the expert among their top-k (so a layer's shares sum to k; balanced,
  each is k/E), and ``expert_imbalance`` = max share / mean share (1 = balanced; E/k = every token
  chose the same experts). Layers are the MoE layers in model order; ``layers`` (the summary) and the
  warnings give their indices among the model's layers (DeepSeek's dense first layers are not MoE layers).
- ``bias_min`` / ``bias_max`` per layer (DeepSeek-V3's routing biases, ``pretrain.bias_balancing``), and the
  logged ``routing_bias_spread`` (the widest layer's max - min), when the routers have biases.

Every family dispatches dropless (``registry.Routing.dropless``): no token is dropped, ``dropped_tokens`` is 0.
A layer whose busiest expert took ``COLLAPSE_FRACTION`` of the way from the balanced share k/E to every token
(``collapse_share``) is a router collapse: one warning line per log record names the layers.
An expert that receives no token contributes no rows: its share is 0 and nothing divides by it.

Each record's figures are summed over the data-parallel and sharding ranks (every rank logs), so
they describe the global batch.

The records up to a checkpoint's step are saved inside it (``routing_history.json``, written before the
completion marker, so its checksums cover it) and a resumed run starts from them (``restore``): its
summary's ``routing.records`` equal an uninterrupted run's, as the loss history does; after a loss-spike
rollback they equal those of a run that skipped the abandoned steps' batches from the start. A step
skipped by ``loss_spike_policy skip`` keeps its record: its forward ran, and the routers may be what spiked.
"""

from __future__ import annotations

import json
import os
import re
from typing import Optional

import numpy as np
import paddle
import paddle.distributed as dist
import paddle.nn.functional as F
from paddlenlp.transformers.mixtral.modeling import load_balancing_loss_func

from pretrain.atomic import write_json
from pretrain.bias_balancing import routing_biases
from pretrain.errors import UserError
from pretrain.log import logger
from pretrain.registry import Routing

COLLAPSE_FRACTION = 0.9  # a layer whose busiest expert went this far from the balanced share to 1 has collapsed
ROUTING_HISTORY_FILE = "routing_history.json"  # in each checkpoint: the records up to its step


class RouterWatch:
    """The routers of one model: the load-balancing loss of each training forward and the routing figures.

    Args:
        model: the causal LM (paddlenlp's class), whose MoE routers are the sublayers named ``*<router_suffix>``.
        routing: the model type's ``registry.Routing``.
        config: its paddlenlp config (``num_experts_per_tok``, ``router_aux_loss_coef``).

    Raises:
        ValueError: the model has no sublayer named ``*<router_suffix>``.
    """

    def __init__(self, model: paddle.nn.Layer, routing: Routing, config):
        named = [(name, layer) for name, layer in model.named_sublayers() if name.endswith(routing.router_suffix)]
        if not named:
            raise ValueError(f"no MoE router (a sublayer named *{routing.router_suffix}) in {type(model).__name__}")
        self.routers = [layer for _, layer in named]
        self.layers = model_layer_indices([name for name, _ in named])
        self.num_layers, self.num_experts = len(named), self.routers[0].weight.shape[1]
        self.top_k = config.num_experts_per_tok
        self.aux_loss_coef = float(getattr(config, routing.aux_loss_coef_key))
        # the load-balancing loss under perfectly balanced routing: Switch's sums its k choices; DeepSeek's gates
        # give 1 each with seq_aux (choices / (T x k / E)), k each without (moe_gate.py:118-129, 132-150)
        per_layer = 1 if getattr(config, "seq_aux", False) else self.top_k
        self.aux_loss_scale = float(self.num_layers * per_layer if routing.aux_loss_in_model else self.top_k)
        self.biases = routing_biases(self.routers)  # DeepSeek-V3's e_score_correction_bias per layer, else []
        self.routing = routing
        self.dropless = routing.dropless
        self.bias_update_rate = 0.0  # DeepSeek-V3's routing-bias update speed, when pretrain.bias_balancing runs
        self.history: list = []  # one entry per log record: step, per-layer shares and imbalance
        self._logits: list = []  # [tokens, experts] float32 per router, of the forward being run
        self._gate_outputs: list = []  # (exp_counts [experts], loss scalar) per router, when the model adds its loss
        for router in self.routers:
            router.register_forward_post_hook(self._keep)
        self._reset()
        self._step_counts = np.zeros((self.num_layers, self.num_experts))  # since the last ``step_loads``

    def _reset(self) -> None:
        # since the last record: [tokens, aux_sum, z_sum, lm_sum, forwards] and [layers, experts] token counts
        self._sums = np.zeros(5)
        self._counts = np.zeros((self.num_layers, self.num_experts))

    def _keep(self, router, inputs, outputs) -> None:
        if not router.training:
            return
        hidden = inputs[0].reshape([-1, router.weight.shape[0]])  # [tokens, hidden]
        logits = F.linear(hidden, router.weight, getattr(router, "bias", None))  # [tokens, experts]
        self._logits.append(logits.cast("float32"))
        if self.routing.aux_loss_in_model:  # PretrainedMoEGate: (capacity, combine, dispatch, exp_counts, l_aux, z)
            self._gate_outputs.append((outputs[3], outputs[4]))

    def begin(self) -> None:
        """Forget logits kept outside a training forward (a recompute in backward re-runs the hooks)."""
        self._logits, self._gate_outputs = [], []

    def take(self, lm_loss: paddle.Tensor) -> Optional[paddle.Tensor]:
        """The load-balancing loss the trainer adds for the training forward just run (scalar float32, with
        gradient), or None when no router ran (evaluation) or the model adds it itself; counts the forward's
        routing, its load-balancing loss and ``lm_loss`` (its language-model loss)."""
        logits, self._logits = self._logits, []
        gates, self._gate_outputs = self._gate_outputs, []
        if not logits:
            return None
        if gates:  # the model's own loss and choices (registry.Routing.aux_loss_in_model)
            aux = paddle.add_n([loss.reshape([]).cast("float32") for _, loss in gates])
        else:
            aux = load_balancing_loss_func(tuple(logits), self.num_experts, self.top_k)
        with paddle.no_grad():
            z_loss = paddle.stack([paddle.logsumexp(x, axis=-1).square().mean() for x in logits]).mean()
            if gates:
                counts = paddle.stack([exp_counts.cast("float32") for exp_counts, _ in gates])
            else:
                chosen = [paddle.topk(x, self.top_k, axis=-1)[1] for x in logits]  # [tokens, k] per layer
                counts = paddle.stack([F.one_hot(c, self.num_experts).sum(axis=[0, 1]) for c in chosen])
        # one device-to-host copy per forward: the five sums and the [layers, experts] counts
        values = paddle.concat(
            [
                paddle.to_tensor([float(logits[0].shape[0])]),
                aux.detach().reshape([1]).cast("float32"),
                z_loss.reshape([1]),
                lm_loss.detach().reshape([1]).cast("float32"),
                paddle.ones([1]),
                counts.cast("float32").reshape([-1]),
            ]
        ).numpy()
        self._sums += values[:5]
        self._counts += values[5:].reshape(self._counts.shape)
        self._step_counts += values[5:].reshape(self._counts.shape)
        return None if gates else aux

    def record(self, step: int, world_size: int) -> dict:
        """The figures since the last record, for the log record of ``step`` (summed over the data-parallel
        and sharding ranks when ``world_size`` > 1: a collective, every rank calls it); kept in ``history``.

        Returns:
            {"lm_loss", "z_loss": means over the interval's forwards, "aux_loss": the mean load-balancing loss over
            ``aux_loss_scale`` (1.0: balanced), "expert_imbalance": the max over layers, "expert_share": [layers]
            [experts] fractions of tokens, "moe_layers": the model layer of each, and with routing biases
            "routing_bias_spread": the largest max - min of a layer's biases}; {} when no forward was counted.
        """
        sums, counts = _summed_over_data_ranks(self._sums, self._counts, world_size)
        self._reset()
        tokens, aux, z_loss, lm, forwards = sums
        if not forwards:
            return {}
        shares = counts / tokens  # [layers, experts]
        imbalance = shares.max(axis=1) / shares.mean(axis=1)
        entry = {"step": step, "expert_share": shares.round(4).tolist(), "imbalance": imbalance.round(4).tolist()}
        figures = {
            "lm_loss": lm / forwards,
            "aux_loss": aux / forwards / self.aux_loss_scale,
            "z_loss": z_loss / forwards,
            "expert_imbalance": float(imbalance.max()),
            "expert_share": shares.tolist(),
            "moe_layers": self.layers,
        }
        if self.biases:  # float32 values as the gates add them, every rank's alike
            biases = np.stack([bias.numpy() for bias in self.biases])  # [layers, experts]
            entry["bias_min"], entry["bias_max"] = biases.min(axis=1).tolist(), biases.max(axis=1).tolist()
            figures["routing_bias_spread"] = float((biases.max(axis=1) - biases.min(axis=1)).max())
        self.history.append(entry)
        collapsed = collapse_message(shares, self.top_k, step, self.layers)
        if collapsed:
            logger.warning(collapsed)
        return figures

    def step_loads(self, world_size: int) -> np.ndarray:
        """[layers, experts] tokens each expert received in the training forwards since the last call (one
        optimizer step's), summed over the data-parallel and sharding ranks (a collective when ``world_size``
        > 1: every rank calls it); for ``pretrain.bias_balancing``."""
        counts, self._step_counts = self._step_counts, np.zeros_like(self._step_counts)
        return _summed_over_data_ranks(np.zeros(0), counts, world_size)[1]

    def write(self, folder: str) -> None:
        """Write the records so far to ``folder/routing_history.json`` atomically."""
        write_json(os.path.join(folder, ROUTING_HISTORY_FILE), self.history)

    def restore(self, checkpoint_folder: Optional[str]) -> None:
        """Start from the records saved in ``checkpoint_folder`` (None: a fresh start, no records), with nothing
        counted since: a rollback (``pretrain.recovery``) drops what the abandoned steps routed, the spiked
        forward's included, as their records. A checkpoint saved without them (by an earlier version)
        restores nothing, with a warning.

        Raises:
            UserError: the checkpoint's file is not a list of records.
        """
        self.history, self._logits = [], []
        self._reset()
        self._step_counts[:] = 0
        if checkpoint_folder is None:
            return
        path = os.path.join(checkpoint_folder, ROUTING_HISTORY_FILE)
        if not os.path.isfile(path):
            logger.warning(
                "%s holds no %s: the routing records start at its step", checkpoint_folder, ROUTING_HISTORY_FILE
            )
            return
        try:
            with open(path, encoding="utf-8") as f:
                history = json.load(f)
        except (OSError, ValueError) as e:
            raise UserError(
                f"{path} is unreadable ({e}); resume from another checkpoint with resume_from_checkpoint"
            ) from e
        if not isinstance(history, list) or not all(
            isinstance(record, dict) and "step" in record for record in history
        ):
            raise UserError(
                f"{path} is not a list of routing records; resume from another checkpoint with resume_from_checkpoint"
            )
        self.history = history

    def summary(self) -> dict:
        """The run summary's ``routing`` entry: the coefficient and where it came from, the dispatch, every record."""
        return {
            "aux_loss_coef": self.aux_loss_coef,
            "aux_loss_coef_source": f"model config {self.routing.aux_loss_coef_key}",
            "aux_loss_scale": self.aux_loss_scale,
            "aux_loss_added_by": self.routing.aux_loss_in_model or "the trainer (pretrain.routing)",
            "z_loss_coef": 0.0,
            "experts": self.num_experts,
            "experts_per_token": self.top_k,
            "layers": self.layers,
            "dropped_tokens": 0,
            "dropless": self.dropless,
            "bias_update_rate": self.bias_update_rate,
            "records": self.history,
        }


def model_layer_indices(names: list) -> list:
    """The model layer of each router, from its sublayer name (``mixtral.layers.3.block_sparse_moe.gate`` -> 3);
    the position among ``names`` for a name without ``layers.<i>.``."""
    found = [re.search(r"(?:^|\.)layers\.(\d+)\.", name) for name in names]
    return [int(match.group(1)) if match else i for i, match in enumerate(found)]


def collapse_share(top_k: int, num_experts: int) -> float:
    """The share of the tokens (a fraction) at which a layer's busiest expert has collapsed the routing: the
    balanced share k/E plus ``COLLAPSE_FRACTION`` of the way from it to 1 (every token); 1.0 when k = E."""
    balanced = top_k / num_experts
    return balanced + COLLAPSE_FRACTION * (1 - balanced)


def collapse_message(shares: np.ndarray, top_k: int, step: int, layers: Optional[list] = None) -> Optional[str]:
    """One warning line when a layer's busiest expert took at least ``collapse_share`` of the tokens
    (``shares``: [layers, experts] fractions of tokens; ``layers``: the model layer of each, default their
    positions), unless every expert takes every token (k = E); else None."""
    num_experts = shares.shape[1]
    if top_k >= num_experts:
        return None
    threshold = collapse_share(top_k, num_experts)
    indices = list(range(shares.shape[0])) if layers is None else layers
    collapsed = [int(i) for i in np.flatnonzero(shares.max(axis=1) >= threshold)]
    if not collapsed:
        return None
    worst = max(collapsed, key=lambda i: shares[i].max())
    return (
        f"router collapse at step {step}: in {len(collapsed)} of {shares.shape[0]} MoE layers (model layers "
        f"{', '.join(str(indices[i]) for i in collapsed)}) one expert took >= {threshold:.1%} of the tokens (model "
        f"layer {indices[worst]}: expert {int(shares[worst].argmax())} took {shares[worst].max():.0%}; balanced: "
        f"{top_k / num_experts:.0%} each, every token: 100%); see expert_share in run_summary.json"
    )


def _summed_over_data_ranks(sums: np.ndarray, counts: np.ndarray, world_size: int) -> tuple:
    """``sums`` and ``counts`` added over the data-parallel and sharding groups (unchanged on one process)."""
    if world_size <= 1:
        return sums, counts
    packed = paddle.to_tensor(np.concatenate([sums, counts.reshape([-1])]), dtype="float64")
    try:
        hcg = dist.fleet.get_hybrid_communicate_group()
    except AttributeError:  # fleet not initialised: plain data parallel, every rank reads its own samples
        groups = [None]
    else:
        groups = [g for g in (hcg.get_data_parallel_group(), hcg.get_sharding_parallel_group()) if g.nranks > 1]
    for group in groups:
        dist.all_reduce(packed, group=group)
    values = packed.numpy()
    return values[: len(sums)], values[len(sums) :].reshape(counts.shape)
