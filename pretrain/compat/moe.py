"""paddlenlp 3.0.0b4's mixture-of-experts code on paddle 3.3.1: two one-line fixes and a detached dispatch
mask, applied by ``apply()``; the router initialisation; expert parallelism's gradient scale and clip.

paddlenlp 3.0.0b4 was released against paddle 3.0.0. Two paddle changes since then break its MoE
forward (measured: paddle 3.3.1 fails, paddle 3.0.0 runs both):

1. ``paddle.cumsum`` of an int32 tensor returns int64 (3.0.0: int32), and int64 x int32 is no longer
   promoted. ``paddlenlp/transformers/moe_gate.py``, ``PretrainedMoEGate._priority`` (line 239)::

       token_priority = paddle.cumsum(expert_mask, axis=0) * expert_mask - 1

   raises "Type promotion only support calculations between floating-point numbers ... x: int64,
   y: int32" for every Qwen2-MoE (and DeepSeek-V2) forward. Fixed: the cumsum is cast back to the
   mask's dtype, which is what paddle 3.0.0 computed.

2. ``paddle.where(condition)`` (one argument: the indices of the true elements) returns 1-D index
   tensors [n] (3.0.0: [n, 1]), so in ``paddlenlp/transformers/mixtral/modeling.py``,
   ``MixtralSparseMoeBlock.forward`` (line 532)::

       current_hidden_states = expert_layer(current_state) * routing_weights[top_x, idx]

   multiplies [n, hidden] by [n] (3.0.0: [n, 1]) and raises "Broadcast dimension mismatch". Fixed: the
   routing weights are reshaped to [n, 1].

Five fixes are for paddlenlp itself, whatever the paddle version (3 and 4 for the MoE families, 5 and 6
for DeepSeek-V2 and V3, 7 for V3 only):

3. ``PretrainedMoEGate.topkgating`` (moe_gate.py line 574), the routing of Qwen2-MoE and DeepSeek-V2,
   returns ``dispatch_mask = combine_weights.cast(paddle.bool)`` without the ``.detach()`` that
   ``top1gating`` has (line 418). paddle passes a gradient straight through a cast to bool and back
   (measured on 3.0.0 and 3.3.1: the gradient of ``sum(cast(cast(x, bool), float32))`` is 1), so
   ``MoELayer.forward``'s dispatch (moe_layer.py line 257, ``einsum("sec,sm->ecm", mask, tokens)``)
   sends into the combine weights, hence the router and every layer below it, the term
   ``sum_m dL/d(dispatched)[e, c, m] * token[s, m]`` for every token s and buffer slot c: a gradient of
   no function of the loss. Measured on the CPU demo's Qwen2-MoE (2 layers), layer 1's router: -9.0
   against 0.0043 by central differences (fixed: 0.0038). The term grows with the buffer's capacity,
   which dropless routing sizes by the busiest expert's tokens on the rank, so 2 ranks (half the tokens
   each) got about half of one process's: their losses parted by 4e-4 at step 2. ``_topkgating``
   detaches the mask (``combine_weights`` keeps its gradient); Hugging Face's Qwen2-MoE indexes the
   tokens and has no mask.

4. ``Qwen2MoeGate`` (qwen2_moe/modeling.py line 760) creates its [hidden, experts] weight with
   ``Constant(1.0)``, and ``_init_weights`` does not reach it (not an ``nn.Linear``), so a Qwen2-MoE
   trained from scratch starts with every expert's logit equal (the sum of the hidden state), ties
   broken by expert index, and logits as large as that sum. ``init_routers`` draws them from normal(0,
   initializer_range), as Hugging Face's ``Qwen2MoeForCausalLM`` initialises its gate (an ``nn.Linear``)
   and as paddlenlp initialises Mixtral's. ``pretrain.model`` calls it for a model built from scratch
   whose ``registry.Routing.init_routers`` says so.

5. DeepSeek-V2's sequence-wise load-balancing loss (``seq_aux``, which its ``DeepseekV2MoE`` adds to the
   gradient itself): ``MoEGateMixin._cal_seq_aux_loss`` (moe_gate.py line 145) counts each sequence's top-k
   choices per expert with ``ce.put_along_axis_(topk_idx, ones, axis=1)``, whose default ``reduce="assign"``
   writes 1 where DeepSeek's own code (``ce.scatter_add_``, the released modeling_deepseek.py) adds one per
   choice: the count f_i of the technical report's eq. 24 became an indicator, the loss about seq_len x
   top-k / experts times too small (measured at the debug size: 0.031 per layer where balance gives 1) and
   blind to how many tokens an expert took.

6. In training ``topkgating`` (moe_gate.py lines 563-569) combines the experts with the plain gate
   probabilities and leaves out ``routed_scaling_factor``, which its evaluation branch applies (line 524) as
   DeepSeek's and transformers' code do in both: DeepSeek-V2 (16.0) and V3 (2.5) trained with routed outputs
   16 and 2.5 times smaller than they evaluate with (measured on a transformers DeepSeek-V3: first training
   loss 9.2001381 against transformers' 9.2031612). ``fix_deepseek_moe`` gives every ``DeepseekV2MoE`` of a
   built model the forward that scales the routed output by the factor in training, and its gate the
   sequence-wise loss with ``reduce="add"``; per model, not on the classes, so paddlenlp's own outputs (the
   golden file) keep their meaning.

7. DeepSeek-V3's routing bias (``e_score_correction_bias``, ``noaux_tc``) is trainable (``stop_gradient``
   False, moe_gate.py) but reaches the loss only through the experts it selects, an index: backward gives it no
   gradient; nor does Mixtral's block give one to an expert no token of the micro-batch chose (it skips it,
   mixtral/modeling.py line 528). Under sharding stage2 paddle reduces a gradient bucket once every parameter
   in it has checked in (``GroupShardedStage2._get_reduce_fn``, ``grad_storage.all_checked_in``): the bucket
   holding the bias was never reduced, so its owner stepped on its own half-batch gradients of every tensor in
   the bucket (measured, 2 ranks: 47 of the 53 tensors), and a resumed run failed at its first step (``Optimizer set
   error, linear_0.w_0_moment1_0 should in state dict``: the other rank had kept those gradients, and Adam
   moments for them). ``_deepseek_moe_forward`` adds 0 x the bias's sum to the output in training: the bias
   gets a zero gradient, its bucket completes, and AdamW leaves it as it was (a zero update; no weight decay
   on a ``bias``); ``pretrain.bias_balancing`` moves it. Marking it ``stop_gradient`` instead would leave it in
   stage2's partition without optimizer entries, which paddlenlp's unified-checkpoint load requires.
   ``_mixtral_moe_forward`` does the same for the unchosen experts' weights: their gradient is the zero it is
   mathematically, as Qwen2-MoE's and DeepSeek's dense dispatch gives it; a step in which no token at all chose
   an expert now moves it by AdamW's momentum and weight decay, as those families' experts always were.

Two more are paddlenlp's, under expert parallelism (``MoELayer`` with its experts spread over the
data-parallel ranks): an expert's gradient is the sum of every rank's loss gradient, the replicated
weights' the mean, and the Trainer's global-norm clip counts only the rank's own experts (and, beside
sharding, only the rank's shard). ``average_expert_gradients`` (a gradient hook per expert weight, from
``pretrain.model.build_model``) and ``ExpertParallelClip`` (from ``PretrainingTrainer.create_optimizer``
through ``expert_parallel_clip``) make the run equal the same ranks without expert parallelism and one
process (tests/test_expert_parallel.py).

Fixes 1 and 2 replace the upstream method with that one line changed (marked ``# compat``); both lines
compute on paddle 3.0.0 exactly what they did before, so they are applied whatever the paddle version.
Fix 3 wraps upstream's method. Fixes 1 to 3 are applied to paddlenlp 3.0.0b4 only (``upstream.PADDLENLP_VERSION``):
another paddlenlp release may have changed these methods, and is left unpatched with a warning.

Proof (tests/test_moe_compat.py, which also checks ``init_routers``): on paddle 3.3.1 the fixed
Qwen2-MoE, Mixtral and DeepSeek-V2 give the loss and logits that paddle 3.0.0 gives unpatched, and the
gradients that paddle 3.0.0 gives with the fixes, on the same weights and input, kept in
tests/golden/moe_paddle300.json (written by ``tools/moe_golden.py`` under paddle 3.0.0); the router
gradients equal central differences of the loss.
"""

from __future__ import annotations

import types
from typing import Optional

import paddle
import paddle.distributed as dist
import paddle.nn.functional as F
from paddle.nn.clip import ClipGradBase, _squared_l2_norm
from paddlenlp.transformers.deepseek_v2.modeling import AddAuxiliaryLoss, DeepseekV2MoE
from paddlenlp.transformers.mixtral.modeling import MixtralSparseMoeBlock
from paddlenlp.transformers.moe_gate import PretrainedMoEGate
from paddlenlp.transformers.moe_layer import MoELayer

from pretrain.upstream import verified


def _priority(self, topk_idx: paddle.Tensor, capacity: int) -> paddle.Tensor:
    """``PretrainedMoEGate._priority`` of paddlenlp 3.0.0b4 (moe_gate.py lines 213-261), the cumsum cast
    back to int32 (fix 1 of the module docstring).

    Args:
        topk_idx: [tokens, top_k] int64, the experts each token chose.
        capacity: tokens each expert can take.

    Returns:
        [tokens, num_experts, capacity] int32: 1 where a token takes a slot of an expert's buffer.
    """
    expert_index = paddle.transpose(topk_idx, [1, 0]).reshape([-1])  # [top_k * tokens]
    expert_mask = F.one_hot(expert_index, self.num_experts).cast(paddle.int32)  # [top_k * tokens, experts]
    token_priority = paddle.cumsum(expert_mask, axis=0).cast(expert_mask.dtype) * expert_mask - 1  # compat
    token_priority = token_priority.reshape((self.top_k, -1, self.num_experts))
    token_priority = paddle.transpose(token_priority, [1, 0, 2])  # [tokens, top_k, experts]
    token_priority = paddle.max(token_priority, axis=1)  # [tokens, experts]
    valid_mask = paddle.logical_and(token_priority >= 0, token_priority < capacity)
    token_priority = paddle.masked_fill(token_priority, ~valid_mask, 0)
    dispatch_mask = F.one_hot(token_priority, capacity).cast(paddle.int32)
    valid_mask = valid_mask.unsqueeze(-1).expand(valid_mask.shape + [capacity])
    return paddle.masked_fill(dispatch_mask, ~valid_mask, 0)


def _mixtral_moe_forward(self, hidden_states: paddle.Tensor) -> tuple:
    """``MixtralSparseMoeBlock.forward`` of paddlenlp 3.0.0b4 (mixtral/modeling.py lines 500-540), the
    routing weights reshaped to [n, 1] (fix 2 of the module docstring), and in training a zero gradient for the
    experts no token chose (fix 7: paddlenlp skips them, and sharding stage2 would then never reduce their bucket).

    Args:
        hidden_states: [batch, seq, hidden].

    Returns:
        ([batch, seq, hidden] output, [batch * seq, num_experts] router logits).
    """
    batch_size, seq_len, hidden_dim = hidden_states.shape
    hidden_states = hidden_states.reshape([-1, hidden_dim])
    router_logits = self.gate(hidden_states)  # [tokens, experts]
    with paddle.amp.auto_cast(False):
        routing_weights = F.softmax(router_logits.astype("float32"), axis=1)
    routing_weights, selected_experts = paddle.topk(routing_weights, self.top_k, axis=-1)
    routing_weights /= routing_weights.sum(axis=-1, keepdim=True)
    routing_weights = routing_weights.astype(hidden_states.dtype)
    final_hidden_states = paddle.zeros([batch_size * seq_len, hidden_dim], dtype=hidden_states.dtype)
    # [experts, top_k, tokens]
    expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).transpose([2, 1, 0]).to("bool")
    unchosen = []  # the weights of experts no token chose, for their zero gradient
    for expert_id in range(self.num_experts):
        expert_layer = self.experts[expert_id]
        idx, top_x = paddle.where(expert_mask[expert_id])
        if top_x.shape[0] == 0:
            unchosen += [weight.sum() for weight in expert_layer.parameters() if not weight.stop_gradient]
            continue
        current_state = paddle.gather(hidden_states, top_x.squeeze())
        weights = routing_weights[top_x, idx].reshape([-1, 1])  # compat: [n] on paddle >= 3.1, [n, 1] before
        current_hidden_states = expert_layer(current_state) * weights
        top_x = top_x.squeeze()
        if top_x.shape == []:
            top_x = paddle.to_tensor([top_x.item()])
        final_hidden_states.index_add_(top_x, 0, current_hidden_states.astype(hidden_states.dtype))
    if self.training and unchosen:  # compat: fix 7, a zero gradient
        final_hidden_states = final_hidden_states + 0.0 * paddle.add_n(unchosen).astype(final_hidden_states.dtype)
    return final_hidden_states.reshape([batch_size, seq_len, hidden_dim]), router_logits


_UPSTREAM_TOPKGATING = PretrainedMoEGate.topkgating  # paddlenlp's, kept before ``apply`` replaces it


def _topkgating(self, gates: paddle.Tensor) -> tuple:
    """``PretrainedMoEGate.topkgating`` of paddlenlp (moe_gate.py lines 503-577) with its dispatch mask
    detached (fix 3 of the module docstring).

    Args:
        gates: [batch, seq, num_experts] router probabilities.

    Returns:
        upstream's (capacity, combine_weights [tokens, experts, capacity], dispatch_mask (the same shape,
        bool, now without gradient), exp_counts, l_aux, l_zloss).
    """
    capacity, combine_weights, dispatch_mask, exp_counts, l_aux, l_zloss = _UPSTREAM_TOPKGATING(self, gates)
    return capacity, combine_weights, dispatch_mask.detach(), exp_counts, l_aux, l_zloss


def _cal_seq_aux_loss(self, gates: paddle.Tensor, top_k: int, topk_idx: paddle.Tensor) -> paddle.Tensor:
    """``MoEGateMixin._cal_seq_aux_loss`` of paddlenlp 3.0.0b4 (moe_gate.py lines 132-150), the choices counted
    with ``reduce="add"`` (fix 5 of the module docstring).

    Args:
        gates: [batch, seq, experts] router probabilities.
        top_k: experts per token.
        topk_idx: [batch * seq, top_k] the experts each token chose.

    Returns:
        Scalar: mean over sequences of sum_e f_e P_e, f_e = the sequence's choices of e x experts / (seq x top_k),
        P_e = its mean probability of e (DeepSeek-V2 technical report, eq. 23-25); 1.0 when balanced.
    """
    batch_size, seq_len, _ = gates.shape
    ce = paddle.zeros([batch_size, self.num_experts])
    topk_idx = topk_idx.reshape([batch_size, -1])
    ones = paddle.ones([batch_size, seq_len * top_k])
    ce.put_along_axis_(indices=topk_idx, values=ones, axis=1, reduce="add")  # compat: "assign" wrote 1s
    ce = ce / (seq_len * top_k / self.num_experts)
    return (ce * paddle.mean(gates, axis=1)).sum(axis=1).mean()


def _deepseek_moe_forward(self, hidden_states: paddle.Tensor) -> paddle.Tensor:
    """``DeepseekV2MoE.forward`` of paddlenlp 3.0.0b4 (deepseek_v2/modeling.py lines 769-778), the routed
    output scaled by ``routed_scaling_factor`` in training (fix 6 of the module docstring), and a routing bias
    given a zero gradient (fix 7).

    Args:
        hidden_states: [batch, seq, hidden].

    Returns:
        [batch, seq, hidden]: the routed experts' weighted output plus the shared experts'.
    """
    final_hidden_states, l_aux, _ = MoELayer.forward(self, hidden_states)
    if self.training:  # compat: the evaluation branch of topkgating scales the weights already
        final_hidden_states = final_hidden_states * self.gate.routed_scaling_factor
    if self.training and self.alpha > 0.0:
        final_hidden_states = AddAuxiliaryLoss.apply(final_hidden_states, l_aux * self.alpha)
    if self.config.n_shared_experts is not None:
        final_hidden_states = final_hidden_states + self.shared_experts(hidden_states)
    bias = getattr(self.gate, "e_score_correction_bias", None)
    if self.training and bias is not None and not bias.stop_gradient:  # compat: fix 7, a zero gradient
        final_hidden_states = final_hidden_states + 0.0 * bias.sum()
    return final_hidden_states


def fix_deepseek_moe(model: paddle.nn.Layer) -> int:
    """Give every ``DeepseekV2MoE`` of ``model`` (DeepSeek-V2 and V3) the forward that scales its routed output
    in training and its gate the sequence-wise loss that counts the choices, on the instances; the number of
    MoE layers fixed (0 for other models, or another paddlenlp than the ledger's: ``pretrain.upstream``)."""
    layers = [layer for layer in model.sublayers() if isinstance(layer, DeepseekV2MoE)]
    if layers and not verified("deepseek-moe-forward"):
        return 0
    for layer in layers:
        layer.forward = types.MethodType(_deepseek_moe_forward, layer)
        layer.gate._cal_seq_aux_loss = types.MethodType(_cal_seq_aux_loss, layer.gate)
    return len(layers)


def init_routers(model: paddle.nn.Layer, router_suffix: str, std: float) -> int:
    """Draw every router weight (sublayers named ``*<router_suffix>``) from normal(0, ``std``), in place.

    Returns:
        The number of routers initialised.
    """
    routers = [layer for name, layer in model.named_sublayers() if name.endswith(router_suffix)]
    with paddle.no_grad():
        for router in routers:
            router.weight.set_value(paddle.normal(0.0, std, router.weight.shape).cast(router.weight.dtype))
    return len(routers)


def average_expert_gradients(model: paddle.nn.Layer) -> int:
    """Scale each expert weight's gradient by 1 / the expert-parallel degree of its ``MoELayer``, as it is
    computed; the number of weights given the hook (0 without expert parallelism).

    Under expert parallelism (``MoELayer.expert_parallel_degree`` n > 1) an expert lives on one rank and
    receives, through the all-to-all, the tokens of all n ranks, so its gradient is the sum of the n
    ranks' loss gradients, while the replicated weights' gradients are averaged over the ranks (data
    parallel). paddlenlp 3.0.0b4 neither averages nor scales it (``trainer.py`` skips ``no_sync``
    weights in ``fused_allreduce_gradients_no_sync``; ``moe_layer.py`` sets ``no_sync``): the experts
    trained on n x their gradient, which changes the clipped norm and Adam's epsilon term against the
    same run without expert parallelism. Megatron-LM scales expert gradients by 1 / the data-parallel
    size for the same reason (``DistributedDataParallel``, ``expert_gradient_scaling_factor``).
    """
    weights = 0
    for layer in _expert_parallel_layers(model):
        for expert in (e for e in layer.experts if e is not None):
            for weight in expert.parameters():
                weight.register_hook(lambda gradient, n=layer.expert_parallel_degree: gradient / n)
                weights += 1
    return weights


def _expert_parallel_layers(model: paddle.nn.Layer) -> list:
    """``model``'s ``MoELayer`` sublayers that spread their experts over ranks (degree above 1)."""
    return [layer for layer in model.sublayers() if isinstance(layer, MoELayer) and layer.expert_parallel_degree > 1]


class ExpertParallelClip(ClipGradBase):
    """paddle's global-norm clip (``nn.ClipGradByGlobalNorm``: every gradient whose parameter has
    ``need_clip`` times clip_norm / max(norm, clip_norm)), the norm taken over the whole model while each
    rank holds part of it.

    The squared norm, float32: the rank's expert gradients (``param.expert``, set by ``MoELayer``) summed
    over ``expert_group`` (the other ranks hold the other experts), plus its replicated gradients; then,
    beside sharding, summed over ``sharding_group`` (under stage1 a rank's optimizer holds and clips only
    its shard). Every rank calls both all-reduces, whatever its list holds.

    paddle's ``ClipGradForMOEByGlobalNorm`` (paddle/incubate/distributed/models/moe/grad_clip.py) is the
    first half: it has no sharding group (beside sharding stage1 each rank clipped by its shard's norm:
    losses 5e-4 apart from one process at step 2), and calls the expert all-reduce only on a rank whose
    list holds an expert, which a shard need not.

    Args:
        clip_norm: the largest global norm kept (``max_grad_norm``), > 0.
        expert_group: the expert-parallel group (``MoELayer.moe_group``).
        sharding_group: the sharding group, or None without sharding.
    """

    def __init__(self, clip_norm: float, expert_group, sharding_group=None):
        super().__init__()
        self.clip_norm = float(clip_norm)
        self.expert_group, self.sharding_group = expert_group, sharding_group

    def __str__(self) -> str:
        return f"Gradient Clip By GlobalNorm over experts and shards, global_norm={self.clip_norm:f}"

    @paddle.no_grad()
    def squared_norm(self, params_grads: list) -> paddle.Tensor:
        """The squared global norm (float32 ``[]``, the same on every rank) of the gradients among
        ``params_grads`` ([(param, grad or None)]) whose parameter has ``need_clip``: the clip's, and the spike
        detector's (``pretrain.nan_guard.global_squared_norm``)."""
        squares = {True: paddle.zeros([], "float32"), False: paddle.zeros([], "float32")}  # expert? -> sum
        for param, grad in params_grads:
            if grad is not None and getattr(param, "need_clip", True):
                squares[bool(getattr(param, "expert", False))] += _squared_l2_norm(grad).cast("float32")
        dist.all_reduce(squares[True], group=self.expert_group)
        total = squares[True] + squares[False]
        if self.sharding_group is not None:
            dist.all_reduce(total, group=self.sharding_group)
        return total.reshape([])  # paddle's _squared_l2_norm gives [1]

    @paddle.no_grad()
    def _dygraph_clip(self, params_grads: list) -> list:
        """[(param, grad)] -> the same list, each clipped grad scaled (a new tensor)."""
        total = self.squared_norm(params_grads)
        clip_norm = paddle.full([], self.clip_norm, "float32")
        scale = clip_norm / paddle.maximum(paddle.sqrt(total), clip_norm)
        return [
            (p, g * scale.cast(g.dtype) if g is not None and getattr(p, "need_clip", True) else g)
            for p, g in params_grads
        ]


def expert_parallel_clip(model: paddle.nn.Layer, clip_norm: float) -> Optional[ExpertParallelClip]:
    """The ``ExpertParallelClip`` of ``model`` when it has expert parallelism and ``clip_norm`` > 0 (else
    None); with fleet's sharding group when that has more than one rank.

    paddlenlp 3.0.0b4's Trainer clips with ``nn.ClipGradByGlobalNorm`` whatever the layout, which on a
    rank counts only that rank's experts: each rank clips by another factor (the replicated weights part
    ways) and none by the norm of the same run without expert parallelism.
    """
    groups = {layer.moe_group.id: layer.moe_group for layer in _expert_parallel_layers(model)}
    if clip_norm <= 0 or not groups:
        return None
    (group,) = groups.values()
    sharding = dist.fleet.get_hybrid_communicate_group().get_sharding_parallel_group()
    return ExpertParallelClip(clip_norm, group, sharding if sharding.nranks > 1 else None)


def apply() -> bool:
    """Install fixes 1 to 3 on paddlenlp's classes (idempotent). Called when a model with experts is built.

    Returns:
        True when installed (or already), False when paddlenlp is not ``pretrain.upstream.PADDLENLP_VERSION`` (a warning
            says so).
    """
    if not verified("moe-routing"):
        return False
    PretrainedMoEGate._priority = _priority
    PretrainedMoEGate.topkgating = _topkgating
    MixtralSparseMoeBlock.forward = _mixtral_moe_forward
    return True
