"""What one card's collectives and pipeline transfers move, per micro-batch and per optimizer step, by group.

Each ``Transfer`` is one kind of call as paddle 3.3.1 and paddlenlp 3.0.0b4 issue it for a LLaMA-style
decoder (``transformers/llama/modeling.py`` and its siblings, ``fleet/layers/mpu``,
``fleet/utils/sequence_parallel_utils.py``, ``pp_utils/p2p_communication.py``, the sharding optimizers).
``throughput`` times them; ``step_volume`` sums them per optimizer step, the figure
``pretrain.metrics.comm_volume`` counts on CPU processes (``tests/test_parallel_layouts.py`` holds the two
equal for every layout run there).

Payload: per call the bytes of the largest tensor it touches: the reduced or broadcast tensor, the
gathered output, the full input of a reduce-scatter, the tensor sent or received (each side counts a
point-to-point transfer). The bytes an algorithm puts on the wire are the payload times its factor
(``ALGORITHM_FACTOR``). A = one [micro batch, seq, hidden] activation in the activation dtype; T =
tokens per micro-batch; t = tensor-parallel degree.

Per micro-batch, on one card of a stage:

  mp, without sequence parallelism (all_reduce of A): per decoder layer 2 forward (the row-parallel
      attention output and MLP down projections) and one backward per column-parallel matmul
      (``_c_identity``'s backward: Q, K, V separate or fused, gate and up separate or fused), and the
      forward ones again in a recomputed forward; the embedding (``VocabParallelEmbedding``) one forward;
      the head one backward (``parallel_matmul``'s ``_c_identity``).
  mp, with sequence parallelism: per layer an all_gather of A per column-parallel matmul forward
      (``ColumnSequenceParallelLinear``) and per row-parallel one backward, a reduce_scatter of A per
      row-parallel matmul forward and per column-parallel one backward, the forward ones again under
      recompute; the embedding all_reduces forward and all_gathers backward (``ScatterOp``), the head
      all_gathers forward (``GatherOp``) and all_reduces backward.
  mp, the loss: with ``tensor_parallel_output`` the parallel cross-entropy all_reduces three [T] float32
      tensors (row max, target logit, sum of exponentials); without it the head all_gathers the logits
      [T, vocab] (``c_concat``).
  mp, the batch: without pipeline parallelism ``TensorParallel`` broadcasts each input tensor (input_ids
      and labels, int64 [micro batch, seq]) and, before it, its shape (int32 [2]); twice with sharding
      stage1, whose model paddlenlp wraps in TensorParallel twice.
  pp: at each boundary between consecutive chunks of the pipeline the activation forward and its
      gradient backward; rank r of p with v chunks each touches 2v boundaries less one on the first and
      one on the last stage, and sends one tensor and receives one at each. On a GPU with t > 1 paddle
      sends A / t and the receiver all_gathers A over mp (``send_partial``/``allgather_partial``);
      ``pretrain.cpu_comm`` sends A whole (``partial_p2p=False``).
  sharding stage2: every gradient reduced to its owner, in buffers padded to the largest rank's
      (``GroupShardedStage2``, ``parameters.stage2_buffers``); stage 3 (``GroupShardedStage3``,
      ``parameters.stage3_buffers``): each tensor of more than 2**20 elements gathered whole before the
      forward and again before the backward, and its full gradient all-reduced (not reduce-scattered: paddle
      keeps this rank's slice of the sum), over the data-parallel ranks too.
  ep: under expert parallelism 4 all_to_alls per decoder layer (6 when recompute repeats the layer) of
      tokens x top-k x hidden x the routing imbalance (``experts.all_to_all_bytes``; paddlenlp sends
      experts x capacity x hidden, the capacity the busiest expert's tokens).

Per optimizer step: sharding stage1 reduces every gradient to its owner and broadcasts every parameter
(``DygraphShardingOptimizer``), stage2 broadcasts every rank's padded parameter buffer, stage3 all-reduces
the gradients of the tensors it keeps whole (one padded storage; no broadcast), and the spike detector a copy
of each of them before the step, to judge the norm the step applies (``pretrain.nan_guard``; on a GPU model
these are the norm weights and biases only); data parallelism
all-reduces the gradients this card holds (its owned share under sharding; under expert parallelism, with
or without sharding, all but its experts': paddlenlp's ``fused_allreduce_gradients_no_sync``); sequence
parallelism all-reduces the gradients of the parameters it replicates (norms, row-parallel biases:
``register_sequence_parallel_allreduce_hooks``). Scalars (the clipped norm's partial sums, the pipeline's
final loss broadcast) are not counted.
"""

from __future__ import annotations

from typing import NamedTuple

from pretrain.planner import experts
from pretrain.planner.activations import FP32, INDEX
from pretrain.planner.parameters import SHARDING_ALIGNMENT, STAGE3_SEGMENT_SIZE, stage2_buffers, stage3_buffers

# collective -> bytes on the wire per payload byte with k ranks (nccl-tests' PERFORMANCE.md bus bandwidth)
ALGORITHM_FACTOR = {
    "all_reduce": lambda k: 2 * (k - 1) / k,
    "all_gather": lambda k: (k - 1) / k,
    "reduce_scatter": lambda k: (k - 1) / k,
    "all_to_all": lambda k: (k - 1) / k,
    "broadcast": lambda k: 1.0,
    "reduce": lambda k: 1.0,
    "send": lambda k: 1.0,
    "recv": lambda k: 1.0,
}
SHAPE = 4  # bytes of one dimension of a broadcast shape (int32)
BATCH_INPUTS = 2  # input_ids and labels


class Transfer(NamedTuple):
    """One kind of call on one card: ``calls`` of them moving ``nbytes`` payload in all."""

    kind: str  # group: mp, pp, sharding, dp or ep (expert parallel: the data-parallel ranks)
    collective: str  # a key of ALGORITHM_FACTOR
    calls: float
    nbytes: float


def _tensor_parallel(workload, x, params, redo: dict) -> list:
    """The mp transfers of one micro-batch (see the module docstring)."""
    tokens = workload.tokens_per_micro_batch
    a = x.a * x.h * tokens
    layers = params.decoder_layers
    columns = x.attention_copies + x.mlp_copies
    outer = params.has_embedding + params.has_head  # one all-reduce each (forward / backward)
    if x.sequence_parallel:
        gathers = layers * (columns + 2 + redo["columns"]) + outer
        scatters = layers * (2 + columns + redo["allreduces"])
        transfers = [
            Transfer("mp", "all_gather", gathers, gathers * a),
            Transfer("mp", "reduce_scatter", scatters, scatters * a),
            Transfer("mp", "all_reduce", outer, outer * a),
        ]
    else:
        reduces = layers * (2 + columns + redo["allreduces"]) + outer
        transfers = [Transfer("mp", "all_reduce", reduces, reduces * a)]
    if params.has_head and getattr(workload.model_config, "tensor_parallel_output", True):
        transfers.append(Transfer("mp", "all_reduce", 3, 3 * FP32 * tokens))
    elif params.has_head:
        transfers.append(Transfer("mp", "all_gather", 1, tokens * workload.model_config.vocab_size * FP32))
    layout = workload.layout
    if layout.pipeline_parallel_degree == 1:
        # paddlenlp 3.0.0b4 wraps the model in TensorParallel for sharding stage1 and fleet.distributed_model
        # wraps it again (Trainer._wrap_model): each wrapper broadcasts the batch
        wrappers = 2 if layout.sharding_stage == 1 and layout.sharding_parallel_degree > 1 else 1
        batch = BATCH_INPUTS * (tokens * INDEX + 2 * SHAPE)
        transfers.append(Transfer("mp", "broadcast", wrappers * 2 * BATCH_INPUTS, wrappers * batch))
    return transfers


def micro_batch_transfers(workload, x, params, stage: int, redo: dict, on_cpu: bool = False) -> list:
    """The Transfers of one micro-batch (forward + backward) on one card of pipeline stage ``stage``.

    Args:
        workload: ``pretrain.planner.Workload``; x: its ``LayerDims``; params: the stage's ``StageParameters``.
        redo: ``throughput``'s recomputed forward per layer: ``allreduces`` (row-parallel outputs
            recomputed) and ``columns`` (column-parallel inputs recomputed).
        on_cpu: as ``pretrain.cpu_comm`` runs it on CPU processes: whole pipeline sends (paddle's GPU path
            sends A / t, then gathers), sharding buffers aligned to 4096 bytes (GPU: 256).
    """
    layout = workload.layout
    transfers = _tensor_parallel(workload, x, params, redo) if layout.tensor_parallel_degree > 1 else []
    pp, tp = layout.pipeline_parallel_degree, layout.tensor_parallel_degree
    if pp > 1:
        a = x.a * x.h * workload.tokens_per_micro_batch
        boundaries = 2 * layout.virtual_pp_degree - (stage == 0) - (stage == pp - 1)
        split = tp if tp > 1 and not on_cpu else 1
        transfers += [Transfer("pp", op, boundaries, boundaries * a / split) for op in ("send", "recv")]
        if split > 1:  # the receiver gathers the parts over mp
            transfers.append(Transfer("mp", "all_gather", boundaries, boundaries * a))
    sent = experts.all_to_all_bytes(workload, workload.tokens_per_micro_batch)  # 0 without expert parallelism
    if sent:
        calls = params.decoder_layers * experts.all_to_alls_per_layer("layer" in x.recomputed)
        transfers.append(Transfer("ep", "all_to_all", calls, calls * sent))
    degree = layout.sharding_parallel_degree
    if layout.sharding_stage == 2 and degree > 1:
        reduced = _sharding_buffers(workload, params, on_cpu)[0]
        transfers.append(Transfer("sharding", "reduce", len(params.tensors), reduced * workload.grad_bytes))
    elif layout.sharding_stage == 3 and degree > 1:
        sliced, gathered, _ = _sharding_buffers(workload, params, on_cpu)
        transfers.append(Transfer("sharding", "all_gather", 2 * sliced, 2 * gathered * workload.param_bytes))
        transfers += [
            Transfer(kind, "all_reduce", sliced, gathered * workload.grad_bytes) for kind in _stage3_groups(layout)
        ]
    return transfers


def _stage3_groups(layout) -> tuple:
    """The groups stage3 all-reduces its gradients over: sharding, then data parallel (``_get_allreduce_fn``)."""
    return ("sharding", "dp") if layout.data_parallel_degree > 1 else ("sharding",)


def _sharding_buffers(workload, params, on_cpu: bool) -> tuple:
    """``parameters.stage2_buffers`` or ``stage3_buffers`` (by the layout's stage) of a stage's parameters on
    the run's device."""
    alignment = SHARDING_ALIGNMENT["cpu" if on_cpu else "gpu"]
    buffers = stage3_buffers if workload.layout.sharding_stage == 3 else stage2_buffers
    return buffers(params.tensors, workload.layout.sharding_parallel_degree, workload.param_bytes, alignment)


def step_transfers(workload, params, owned: int, replicated: int, on_cpu: bool = False) -> list:
    """The Transfers made once per optimizer step on one card of a stage (outside the micro-batches).

    Args:
        owned: elements of the parameters this card's sharding rank owns (all of them without sharding).
        replicated: elements of the parameters sequence parallelism replicates on this stage.
        on_cpu: as ``micro_batch_transfers``.
    """
    layout = workload.layout
    transfers = []
    degree = layout.sharding_parallel_degree if layout.sharding_stage > 0 else 1
    if degree > 1 and layout.sharding_stage == 3:  # the whole tensors' gradients, in one storage
        unsliced = _sharding_buffers(workload, params, on_cpu)[2]
        # and the spike detector's copy of each, unpadded, before the step (pretrain.nan_guard._applied_gradient)
        whole = [numel for numel in params.tensors if numel <= STAGE3_SEGMENT_SIZE]
        return [
            Transfer(kind, "all_reduce", count, numel * workload.grad_bytes)
            for kind in _stage3_groups(layout)
            for count, numel in ((1, unsliced), (len(whole), sum(whole)))
        ]
    if degree > 1:
        broadcast = params.numel if layout.sharding_stage == 1 else _sharding_buffers(workload, params, on_cpu)[1]
        transfers.append(Transfer("sharding", "broadcast", len(params.tensors), broadcast * workload.param_bytes))
        if layout.sharding_stage == 1:
            transfers.append(Transfer("sharding", "reduce", len(params.tensors), params.numel * workload.grad_bytes))
    if layout.data_parallel_degree > 1:
        if workload.expert_parallel_degree > 1:  # paddlenlp's Trainer, before any sharding reduce: every
            held = params.numel - params.expert_numel  # gradient but this rank's experts' (use_expert_parallel)
        else:
            held = owned if degree > 1 else params.numel
        transfers.append(Transfer("dp", "all_reduce", 1, held * workload.grad_bytes))
    if layout.sequence_parallel and layout.tensor_parallel_degree > 1 and replicated:
        transfers.append(Transfer("mp", "all_reduce", 1, replicated * workload.grad_bytes))
    return transfers


def step_volume(micro: list, step: list, gradient_accumulation_steps: int) -> dict:
    """``{kind: {collective: payload bytes per optimizer step}}`` of one card: ``gradient_accumulation_steps``
    x the micro-batch Transfers + the step Transfers (as ``micro_batch_transfers`` and ``step_transfers``
    return them)."""
    volume: dict = {}
    for transfers, times in ((micro, gradient_accumulation_steps), (step, 1)):
        for transfer in transfers:
            per_kind = volume.setdefault(transfer.kind, {})
            per_kind[transfer.collective] = per_kind.get(transfer.collective, 0.0) + times * transfer.nbytes
    return volume
