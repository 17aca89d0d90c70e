"""Peak memory per card of every pipeline stage, as named terms in GiB (2**30 bytes).

Model states (bytes per parameter on the card; paddlenlp ``Trainer.create_optimizer`` passes
``multi_precision=True`` under O2, so paddle's AdamW keeps float32 master weights and float32
moments for 16-bit parameters):

    parameters      2 (O2) or 4
    gradients       2 (O2), 4 (fp32, O1, or O2 with amp_master_grad: float32 ``main_grad``)
    master weights  4 under O2, else 0
    Adam moments    8 (two float32 moments)

Sharding (ZeRO, Rajbhandari et al. 2020) divides them over the sharding degree as paddle does,
by whole tensors under stages 1 and 2 (``parameters.owned_numel`` gives the busiest rank):

    stage 1  ``DygraphShardingOptimizer``: master weights and moments of the owned tensors;
             gradients of every tensor (reduced to the owner at the step).
    stage 2  ``GroupShardedOptimizerStage2`` + ``GroupShardedStage2``: as stage 1, and gradients of
             non-owned tensors are reduced and freed as backward produces them (every micro-batch),
             so a card keeps the owned gradients plus one layer's in flight, and one gradient buffer per
             sharding rank that owns a tensor, of the largest rank's size up to 2**23 elements
             (``parameters.stage2_gradient_storage_numel``: bounded by the tensors, not the ranks).
    stage 3  ``GroupShardedStage3``: parameters sharded too, each tensor above 2**20 elements sliced over the
             ranks and gathered one layer at a time, the smaller ones whole on every rank with their
             optimizer states (``parameters.owned_numel``).

Activations (``activations``): the saved tensors of each micro-batch the stage holds. With the
1F1B schedule stage s of p holds min(p - s, m) micro-batches (paddle ``PipelineParallel``: p - s - 1
warm-up forwards); interleaved over v virtual chunks, 2(p - s - 1) + (v - 1)p + 1 chunk-forwards
(``PipelineParallelWithInterleave``; the first stage's p(1 + (p-1)/(pv)) of Korthikanti et al.
2022, Sec. 4.2.3). The first stage also keeps token ids, the last the loss's softmax; the peak adds
the larger of the loss's transient logits (last stage) and the backward working set (plus the layer
being recomputed).

A mixture of experts whose block is paddlenlp's ``MoELayer`` also saves, per MoE layer and micro-batch in
flight, the masks of its dense dispatch and combine (``experts.dispatch_saved_bytes``: they grow with the
square of the micro-batch's tokens and with the routing imbalance); a recomputed layer keeps none across
layers, and its backward rebuilds one layer's (in the working set).

A dense document mask (``reset_attention_mask`` without flash attention, ``pretrain.document_mask``)
adds, for the micro-batch being trained (pipeline parallelism, which would hold several, is refused
with it), the collator's bool ``[micro batch, 1, seq, seq]`` mask and the
float copy of it in the activation dtype that paddlenlp's ``_prepare_decoder_attention_mask`` makes
for every layer to add to its scores (FlashMask's ``[micro batch, 1, seq]`` int32 is negligible).

At the optimizer step a data-parallel all-reduce coalesces every gradient into new buffers
(paddle ``fused_allreduce_gradients``), a second copy of the gradients while activations are gone:
the card's peak is the larger of the training peak and this step peak. Under expert parallelism the
card holds E / ep experts of each MoE layer (``pretrain.planner.parameters``: their states divided by
ep) and their gradients stay out of that all-reduce (``pretrain.planner.experts``).

Every attention layer's rotary embedding keeps float32 cos and sin tables on the device for the
sequence's positions (``rope_cache_bytes``; paddlenlp's LLaMA-style classes build them for every one of
max_position_embeddings, which ``pretrain.compat.rope_tables`` trims: 4 GiB per card for Llama-3.1-8B),
or twice it (QWen v1; ``Implementation.rope_cache_rows``).

Two constants close the account (``constants``): allocations the count misses (calibrated on the
published cases) and, for device memory (what nvidia-smi shows and ``fits`` compares with the card),
the CUDA context, NCCL buffers and allocator reserve. ``max_memory_allocated`` is the sum without
the latter.
"""

from __future__ import annotations

from pretrain.metrics.peak_memory import GIB
from pretrain.mtp import prediction_depth
from pretrain.planner import activations, experts
from pretrain.planner.constants import PlannerConstants
from pretrain.planner.parameters import (
    SHARDING_ALIGNMENT,
    STAGE2_BUFFER_MAX,
    StageParameters,
    owned_numel,
    stage2_gradient_storage_numel,
)
from pretrain.registry import (
    ROPE_ROWS_SEQUENCE,
    ROPE_ROWS_TWICE_SEQUENCE,
    implementation_for,
)

FP32 = 4
ADAM_MOMENTS = 2

# Names of the terms, in the order the breakdown lists them.
PARAMETERS = "parameters"
GRADIENTS = "gradients"
MASTER_WEIGHTS = "master weights (fp32)"
MOMENTS = "Adam moments (fp32)"
ACTIVATIONS = "activations"
MOE_DISPATCH = "MoE dispatch and combine masks"
ROPE_TABLES = "RoPE cos/sin tables (fp32)"
LOSS = "logits and loss (transient)"
WORKING = "backward working set"
DOCUMENT_MASK = "dense document mask"
COMM_BUFFERS = "communication buffers"
DP_COALESCE = "data-parallel gradient coalescing (step)"
UNMODELED = "unmodeled allocations (calibrated)"
DEVICE = "CUDA context, NCCL and allocator reserve"
DEVICE_ONLY = (DEVICE,)  # terms max_memory_allocated does not count


def in_flight_chunks(stage: int, pp: int, virtual_pp: int, micro_batches: int) -> float:
    """Micro-batches of a stage's activations alive at its peak (in units of the whole stage).

    1F1B: min(p - s, m). Interleaved: min(2(p - s - 1) + (v - 1)(m mod p + p) + 1, m v) chunk
    forwards of 1/v of the stage each (paddle's startup steps plus the one in flight).
    """
    if virtual_pp == 1:
        return min(pp - stage, micro_batches)
    first_chunk_micro_batches = micro_batches % pp + pp
    chunks = 2 * (pp - stage - 1) + (virtual_pp - 1) * first_chunk_micro_batches + 1
    return min(chunks, micro_batches * virtual_pp) / virtual_pp


def owned_state_numel(workload, params: StageParameters) -> int:
    """Elements of the stage's parameters whose optimizer states the busiest sharding rank owns (all of them
    without sharding; ``parameters.owned_numel``, with the GPU's buffer alignment)."""
    layout = workload.layout
    return owned_numel(
        params.tensors,
        layout.sharding_parallel_degree,
        layout.sharding_stage,
        workload.param_bytes,
        SHARDING_ALIGNMENT["gpu"],
    )


def model_states_bytes(workload, params: StageParameters) -> dict:
    """Bytes of parameters, gradients, master weights and moments on the busiest card of a stage."""
    layout = workload.layout
    degree = layout.sharding_parallel_degree if layout.sharding_stage > 0 else 1
    stage = layout.sharding_stage if degree > 1 else 0
    owned = owned_state_numel(workload, params)
    layer = params.layer_numel
    held_params = owned + 2 * layer if stage == 3 else params.numel  # stage 3: owned + two gathered layers
    held_grads = owned + layer if stage >= 2 else params.numel  # stage 2/3: owned + one layer in flight
    return {
        PARAMETERS: held_params * workload.param_bytes,
        GRADIENTS: held_grads * workload.grad_bytes,
        MASTER_WEIGHTS: owned * FP32 if workload.pure_low_precision else 0,
        MOMENTS: owned * ADAM_MOMENTS * FP32,
    }


def model_states_bytes_per_parameter(workload) -> int:
    """Bytes of parameter, gradient, master weight and Adam moments per parameter (the table above):
    what the model states of N parameters need at least, fully sharded over every card."""
    master = FP32 if workload.pure_low_precision else 0
    return workload.param_bytes + workload.grad_bytes + master + ADAM_MOMENTS * FP32


def stage_memory_bytes(workload, dims, params: StageParameters, stage: int, constants: PlannerConstants) -> dict:
    """Named peak-memory terms (bytes) of one card of pipeline stage ``stage``; see the module docstring."""
    layout = workload.layout
    tokens = workload.tokens_per_micro_batch
    vocab = workload.model_config.vocab_size
    states = model_states_bytes(workload, params)

    layer_saved, recomputed = activations.recomputed_layer_bytes(dims)
    per_micro_batch = params.decoder_layers * layer_saved
    if params.has_embedding:
        per_micro_batch += activations.embedding_bytes(dims)[0]
    loss_transient = 0.0
    if params.has_head:
        loss_saved, loss_transient = activations.loss_bytes(dims, vocab, prediction_depth(workload.model_config))
        per_micro_batch += loss_saved
    elif layout.pipeline_parallel_degree > 1:
        per_micro_batch += dims.a * dims.h / dims.outside  # the stage output kept for its backward
    in_flight = in_flight_chunks(
        stage, layout.pipeline_parallel_degree, layout.virtual_pp_degree, workload.gradient_accumulation_steps
    )
    working = activations.backward_working_bytes(dims) + recomputed if params.decoder_layers else 0.0
    dispatch = experts.dispatch_saved_bytes(workload) if params.moe_layers else 0.0  # one MoE layer, one micro-batch
    layer_recomputed = dims.recomputed[:1] == ("layer",)

    buckets = 0
    if layout.sharding_parallel_degree > 1 and layout.sharding_stage == 2:
        buckets = workload.grad_bytes * stage2_gradient_storage_numel(
            params.tensors, layout.sharding_parallel_degree, workload.grad_bytes, SHARDING_ALIGNMENT["gpu"]
        )
    elif layout.sharding_parallel_degree > 1 and layout.sharding_stage == 3:
        buckets = layout.sharding_parallel_degree * STAGE2_BUFFER_MAX * workload.grad_bytes
    training = {
        **states,
        ACTIVATIONS: in_flight * per_micro_batch * tokens,
        MOE_DISPATCH: 0.0 if layer_recomputed else in_flight * params.moe_layers * dispatch,
        LOSS: loss_transient * tokens,
        WORKING: working * tokens + dispatch,
        DOCUMENT_MASK: document_mask_bytes(workload),
        COMM_BUFFERS: buckets,
        DP_COALESCE: 0.0,
        ROPE_TABLES: params.decoder_layers * rope_cache_bytes(workload),
    }
    # the transients do not add up: the loss's logits are freed before the first layer's backward
    smaller = WORKING if training[LOSS] >= training[WORKING] else LOSS
    training[smaller] = 0.0

    step = {name: 0.0 for name in training}  # the optimizer step: states and the coalesced gradients
    coalesced = states[GRADIENTS] if layout.data_parallel_degree > 1 else 0.0
    if coalesced and workload.expert_parallel_degree > 1:  # the experts' gradients stay out of the all-reduce
        coalesced -= params.expert_numel * workload.grad_bytes
    step.update(states, **{DP_COALESCE: coalesced, ROPE_TABLES: training[ROPE_TABLES]})
    peak = training if sum(training.values()) >= sum(step.values()) else step
    return {**peak, UNMODELED: constants.unmodeled_allocated_gib * GIB, DEVICE: constants.device_overhead_gib * GIB}


def rope_cache_bytes(workload) -> float:
    """Bytes of the float32 RoPE cos and sin tables one attention layer keeps on the device: 2 x rows x rotary dim
    x 4, the rows the sequence length or twice it (``Implementation.rope_cache_rows``), the rotary dim DeepSeek's
    qk_rope_head_dim or the head size (x QWen v1's rotary_pct); 0 without RoPE."""
    config = workload.model_config
    impl = implementation_for(config.model_type)
    if impl.rope_cache_rows is None or getattr(config, "alibi", False):
        return 0.0
    shape = impl.read_shape(config)
    if shape.latent_attention is not None:
        dim = shape.latent_attention.qk_rope_head_dim
    else:
        dim = int(shape.query_size // config.num_attention_heads * getattr(config, "rotary_pct", 1.0))
    rows = {
        ROPE_ROWS_SEQUENCE: workload.seq_length,
        ROPE_ROWS_TWICE_SEQUENCE: max(2 * workload.seq_length, 16),
    }[impl.rope_cache_rows]
    return 2 * rows * dim * FP32


def document_mask_bytes(workload) -> float:
    """Bytes of a dense document mask on one card (0 without one): the bool mask and its float copy,
    ``micro batch x seq^2 x (1 + activation bytes)``."""
    if not workload.dense_document_mask:
        return 0.0
    return workload.micro_batch_size * workload.seq_length**2 * (1 + workload.activation_bytes)


def to_gib(terms: dict) -> dict:
    """The same terms in GiB (2**30 bytes)."""
    return {name: value / GIB for name, value in terms.items()}
