"""Mixture of experts in the planner: what expert parallelism divides, what its all-to-all costs, and the
assumptions, in words, for the plan.

Expert parallelism (``use_expert_parallel``; Qwen2-MoE's ``Qwen2MoeSparseMoEBlock`` is paddlenlp 3.0.0b4's
``MoELayer``, ``transformers/moe_layer.py``) spreads each MoE layer's E routed experts over the data-parallel
group (line 163: the expert-parallel degree ep is the data-parallel degree): a card builds E / ep of them
(``pretrain.planner.parameters``), so their weights, gradients, fp32 master weights and Adam moments are
divided by ep (``pretrain.planner.memory``); the router, the shared expert, attention and embeddings stay
whole on every card. Their weights are marked ``no_sync``: the Trainer's data-parallel all-reduce leaves
them out (``trainer.py``, ``fused_allreduce_gradients_no_sync``), so it moves the other gradients only.

The all-to-all (``MoELayer.forward``): a layer's forward sends each token's hidden state to the ranks of
its top-k experts (dispatch, ``_AllToAll.apply`` of the ``[experts, capacity, hidden]`` tensor) and brings
the experts' outputs back (combine, the same shape); backward runs the two again on the gradients: 4
all-to-alls per MoE layer per micro-batch, 2 more when recompute repeats the layer's forward. Each moves
``experts x capacity x hidden`` activations per card. The dispatch is dropless (``drop_tokens=False``:
``capacity`` is the busiest expert's token count over the group, ``moe_gate.py``), so
experts x capacity = tokens x top-k x imbalance, with imbalance the busiest expert's tokens over the mean
(the ``expert_imbalance`` a run logs, ``pretrain.routing``; ``Workload.routing_imbalance``, 1.0 = balanced
assumed). Of each, the (ep - 1) / ep going to other ranks crosses the data-parallel group's link
(NVLink within a machine, else the network), at the collective efficiency of the other collectives, not
overlapped (paddle runs it on the compute stream). The experts' matmuls are a token's top-k experts, as
without expert parallelism (balanced routing: each card computes its share of the tokens' expert work).

Mixtral's ``MixtralSparseMoeBlock`` is no ``MoELayer``: every expert on every card, no all-to-all.

The dense dispatch and combine (``MoELayer.forward``, moe_layer.py lines 256 and 277): ``einsum("sec,sm->ecm",
dispatch_mask cast to the activation dtype, tokens)`` and ``einsum("sec,ecm->sm", combine_weights cast to it,
expert outputs)`` over ``[tokens, experts, capacity]`` tensors, where the dropless capacity is the busiest
expert's tokens: experts x capacity = tokens x top-k x imbalance, so each holds top-k x imbalance x tokens^2
elements, the square of a micro-batch's tokens. Each einsum saves for its backward its [s, e, c] operand and a
transposed [e, c, s] copy of it: 4 such tensors per MoE layer per micro-batch in the activation dtype
(``dispatch_saved_bytes``; counted with paddle's ``saved_tensors_hooks`` on the CPU demo models:
tests/test_planner.py). On the Qwen1.5-MoE recipe (4,096 tokens a micro-batch, top-4) that is 0.5 GiB per layer
at balanced routing, 12 GiB over its 24 layers. Mixtral's block indexes the tokens instead (none of this).

Not modelled: the dispatch einsums' FLOPs, the per-expert loop's launches, and the router's [hidden, experts]
matmul.
"""

from __future__ import annotations

from pretrain.param_count import decoder_shape, experts_text
from pretrain.registry import implementation_for

ALL_TO_ALLS_PER_LAYER = 4  # dispatch and combine, forward and backward (MoELayer.forward, _AllToAll)
RECOMPUTED_ALL_TO_ALLS_PER_LAYER = 2  # the forward's two again, when recompute repeats the whole layer


def all_to_all_bytes(workload, tokens: int) -> float:
    """Bytes one card sends in one all-to-all of an MoE layer: ``tokens`` x top-k x hidden x activation
    bytes x routing imbalance (0 without expert parallelism)."""
    if workload.expert_parallel_degree <= 1:
        return 0.0
    shape = decoder_shape(workload.model_config)
    return tokens * shape.experts_per_token * shape.hidden_size * workload.activation_bytes * workload.routing_imbalance


DISPATCH_SAVED_TENSORS = 4  # [s, e, c] tensors one MoE layer saves: each einsum's operand and its transposed copy


def dispatch_saved_bytes(workload) -> float:
    """Bytes one MoE layer saves for backward in its dense dispatch and combine, per micro-batch on one card:
    ``DISPATCH_SAVED_TENSORS`` x activation bytes x top-k x routing imbalance x tokens^2 (see the module
    docstring; the tokens of a micro-batch, ``Workload.tokens_per_micro_batch``, all of them on every
    tensor-parallel rank). 0 for a dense model and for a block that is no ``MoELayer`` (Mixtral's, which
    ``Routing.no_expert_parallel`` names for that reason)."""
    routing = implementation_for(workload.model_config.model_type).routing
    if routing is None or routing.no_expert_parallel:
        return 0.0
    top_k = decoder_shape(workload.model_config).experts_per_token
    tokens = workload.tokens_per_micro_batch
    elements = top_k * workload.routing_imbalance * tokens**2  # [tokens, experts, capacity]
    return DISPATCH_SAVED_TENSORS * workload.activation_bytes * elements


def all_to_alls_per_layer(recomputes_layer: bool) -> int:
    """All-to-alls of one MoE layer per micro-batch: 4, or 6 when recompute repeats the layer's forward."""
    return ALL_TO_ALLS_PER_LAYER + (RECOMPUTED_ALL_TO_ALLS_PER_LAYER if recomputes_layer else 0)


def assumptions(workload, crosses_nodes: bool) -> list:
    """Lines saying how the planner counts a mixture of experts in ``workload`` ([] for a dense model);
    ``crosses_nodes``: the data-parallel group spans machines (``throughput.group_crosses_nodes``)."""
    config = workload.model_config
    routing = implementation_for(config.model_type).routing
    if routing is None:
        return []
    shape = decoder_shape(config)
    ep = workload.expert_parallel_degree
    experts = f"{experts_text(shape.experts)} per MoE layer, top-{shape.experts_per_token}"
    if ep <= 1:
        why = routing.no_expert_parallel or "use_expert_parallel is off"
        return [
            f"mixture of experts: {experts}; no expert parallelism ({why}): every expert's weights, gradients, "
            "master weights and moments on every card, no all-to-all; a token's matmuls counted as one dense MLP of "
            "its top-k experts (and shared expert); the dispatch einsums' saved masks counted at routing imbalance "
            f"{workload.routing_imbalance:g}, their FLOPs not"
        ]
    link = "the network" if crosses_nodes else "the machine's NVLink/PCIe"
    return [
        f"mixture of experts: {experts}; expert parallel over the {ep} data-parallel ranks: each card holds "
        f"{experts_text(shape.experts // ep)} per layer (their weights, gradients, master weights and moments "
        f"divided by {ep}; router, shared expert, attention and embeddings whole) and all-reduces the non-expert "
        "gradients only",
        f"expert-parallel all-to-all: {ALL_TO_ALLS_PER_LAYER} per MoE layer per micro batch (dispatch + combine, "
        f"forward and backward; {ALL_TO_ALLS_PER_LAYER + RECOMPUTED_ALL_TO_ALLS_PER_LAYER} under full recompute), "
        f"each tokens x top-k x hidden x {workload.activation_bytes} bytes x routing imbalance "
        f"{workload.routing_imbalance:g} (1 = balanced; a run logs it as expert_imbalance), {ep - 1}/{ep} of it over "
        f"{link}, not overlapped; the dispatch einsums' saved masks counted at that imbalance, their FLOPs not",
    ]
