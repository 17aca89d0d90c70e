"""Seconds per optimizer step of every pipeline stage, as named terms, and the resulting tokens/card/s.

Per micro-batch, on one card of a stage (tokens = micro batch x sequence):

    matmuls        FLOPs of the weight matmuls: 2 FLOPs per weight per token forward, 4 backward
                   (the 6N of PaLM, Chowdhery et al. 2022, App. B), plus 2 per recomputed weight;
                   without flash attention the score and value matmuls too (4·n·d·s per token
                   forward, the full square as paddle computes it). Time = FLOPs / (peak x gemm).
    attention      flash attention: causal forward 2·n·d·s FLOPs per token (half of the square),
                   backward 2.5x forward, the FlashAttention-2 paper's count (Dao 2023, Sec. 4.1);
                   time = FLOPs / (peak x flash_attention); + one forward under recompute.
                   A document mask (``reset_attention_mask``) changes neither term: the dense path
                   computes the full square and masks it; FlashMask skips the masked blocks, so
                   with short documents the attention term is an upper bound.
    elementwise    bytes the non-matmul kernels move (``activations``): forward x (1 + backward
                   traffic factor) + the recomputed forward; time = bytes / (HBM x hbm).
    tensor parallel  the mp collectives of ``communication.micro_batch_transfers``: all-reduces of
                   [micro batch, seq, hidden] (2 per layer forward, one per column-parallel matmul
                   backward, again in a recomputed forward), with sequence parallelism all-gathers and
                   reduce-scatters of twice the payload at half the factor; the embedding, head, parallel
                   cross-entropy and batch broadcast. paddle runs them on the compute stream: not overlapped.
    pipeline p2p   the stage output forward and its gradient backward at each chunk boundary of the
                   stage, 1/t of it per card (paddle's partial send/recv); a card's sends and receives
                   are batched together (``batch_send_recv_on_calc_stream``): the larger of the two.
    sharding stage 2  every micro-batch, backward reduces each gradient to its owner (paddle
                   ``GroupShardedStage2``; synchronous unless enable_stage2_overlap).
    expert all-to-all  mixture of experts under expert parallelism: 4 all-to-alls per MoE layer (6 under
                   full recompute) of tokens x top-k x hidden activations x routing imbalance
                   (``pretrain.planner.experts``), (ep - 1)/ep of it over the data-parallel group's link.

Per step (``communication.step_transfers``): stage 1 reduces the gradients to their owners and
broadcasts the updated parameters (``DygraphShardingOptimizer``), stage 2 broadcasts the parameters;
data parallelism all-reduces the gradients (under expert parallelism all but the experts', which each
rank keeps to itself); sequence parallelism all-reduces the gradients of the parameters it replicates;
the AdamW update reads and writes the owned states at HBM speed.

Collectives take bytes x algorithm factor / (link bandwidth x collective efficiency) + a latency
(algorithm factors of nccl-tests' PERFORMANCE.md: all-reduce 2(k-1)/k, all-gather and
reduce-scatter (k-1)/k, reduce and broadcast 1). A group uses NVLink (or PCIe) when its ranks share
a machine, else the network; paddlenlp orders ranks [dp, pp, sharding, sep, mp] (mp innermost,
``hybrid_parallel_topo_order`` pp_first).

Pipeline: with the slowest stage's micro-batch time T, a step takes (m + (p - 1)/v) T: the bubble
(p - 1)/(m v + p - 1) of the step (Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", Sec. 2.2).
"""

from __future__ import annotations

from pretrain.planner import activations, communication, memory
from pretrain.planner.constants import PlannerConstants
from pretrain.planner.parameters import StageParameters

FP32 = 4
# Names of the terms
MATMUL = "matmuls"
ATTENTION = "flash attention"
ELEMENTWISE = "elementwise kernels"
TENSOR_PARALLEL = "tensor-parallel communication"
PIPELINE_P2P = "pipeline send/recv"
SHARDING_MICRO = "sharding gradient reduce (per micro-batch)"
ALL_TO_ALL = "expert-parallel all-to-all"
BUBBLE = "pipeline bubble"
SHARDING_STEP = "sharding reduce/broadcast (per step)"
DATA_PARALLEL = "data-parallel all-reduce"
SEQUENCE_PARALLEL = "sequence-parallel gradient all-reduce"
OPTIMIZER = "optimizer update"
ORDER = ("dp", "pp", "sharding", "sep", "mp")  # paddlenlp pp_first topology, outermost first


def group_crosses_nodes(layout, dim: str) -> bool:
    """Whether the ranks of a parallel group span more than one machine (rank order ``ORDER``)."""
    degrees = {
        "dp": layout.data_parallel_degree,
        "pp": layout.pipeline_parallel_degree,
        "sharding": layout.sharding_parallel_degree,
        "sep": layout.sep_parallel_degree,
        "mp": layout.tensor_parallel_degree,
    }
    stride = 1
    for inner in reversed(ORDER[ORDER.index(dim) + 1 :]):
        stride *= degrees[inner]
    return degrees[dim] > 1 and stride * degrees[dim] > layout.nproc_per_node


def collective_seconds(
    nbytes: float, factor: float, calls: int, bandwidth: float, constants: PlannerConstants
) -> float:
    """Time of ``calls`` collectives moving ``nbytes`` in all with an algorithm factor over a link."""
    if nbytes <= 0:
        return 0.0
    return nbytes * factor / (bandwidth * constants.collective_efficiency) + calls * constants.collective_latency_sec


def transfer_seconds(workload, transfers: list, constants: PlannerConstants) -> float:
    """Seconds of ``communication.Transfer``s of one card: each kind's group link, each collective's
    algorithm factor (``communication.ALGORITHM_FACTOR``), one latency per call."""
    layout, gpu = workload.layout, workload.gpu
    degrees = {
        "mp": layout.tensor_parallel_degree,
        "pp": 2,
        "sharding": layout.sharding_parallel_degree,
        "dp": layout.data_parallel_degree,
        "ep": workload.expert_parallel_degree,
    }
    return sum(
        collective_seconds(
            t.nbytes,
            communication.ALGORITHM_FACTOR[t.collective](degrees[t.kind]),
            int(t.calls),
            _bandwidth(layout, gpu, "dp" if t.kind == "ep" else t.kind),  # the experts span the data-parallel ranks
            constants,
        )
        for t in transfers
    )


def _bandwidth(layout, gpu, dim: str) -> float:
    return gpu.internode_bytes_per_sec if group_crosses_nodes(layout, dim) else gpu.intranode_bytes_per_sec


def recomputed_forward(x) -> dict:
    """Per layer, what recompute repeats (``x.recomputed``): weights, core attentions, bytes, row-parallel
    outputs (``allreduces``: all-reduced, or reduce-scattered under sequence parallelism) and column-parallel
    inputs (``columns``: all-gathered under sequence parallelism)."""
    attention_weights = x.h * (x.q + 2 * x.kv) + x.q * x.h
    mlp_weights = (3 if x.gated else 2) * x.h * x.f
    traffic = {t.name: t.traffic(x) for t in activations.LAYER_TERMS}
    attention_traffic = sum(traffic[t.name] for t in activations.LAYER_TERMS if t.block == "attention")
    units = {
        "layer": (attention_weights + mlp_weights, 1.0, sum(traffic.values()), 2.0, x.attention_copies + x.mlp_copies),
        "attention": (attention_weights, 1.0, attention_traffic - traffic["attention norm"], 1.0, x.attention_copies),
        "core": (0.0, 1.0, traffic["core attention"], 0.0, 0.0),
    }
    totals = [sum(column) for column in zip((0.0,) * 5, *(units[unit] for unit in x.recomputed))]
    return dict(zip(("weights", "core", "traffic", "allreduces", "columns"), totals))


def micro_batch_seconds(workload, x, params: StageParameters, constants: PlannerConstants, stage: int = 0) -> dict:
    """Named seconds of one micro-batch (forward + backward) on one card of pipeline stage ``stage``."""
    gpu = workload.gpu
    eff = constants.efficiency(gpu.architecture)
    peak = gpu.peak_flops_per_sec
    tokens = workload.tokens_per_micro_batch
    layers = params.decoder_layers
    vocab = workload.model_config.vocab_size
    vocab_rows = vocab / x.tp if vocab % x.tp == 0 else vocab
    redo = recomputed_forward(x)

    weights = x.h * (x.q + 2 * x.kv) + x.q * x.h + (3 if x.gated else 2) * x.h * x.f  # per layer, this card
    square = 4.0 * x.n * x.d * x.s  # QK^T and PV forward FLOPs per token, full square
    matmul_flops = layers * (6.0 * weights + 2.0 * redo["weights"])
    flash_flops = 0.0
    if x.flash:
        flash_flops = layers * (square / 2) * (3.5 + redo["core"])
    else:
        matmul_flops += layers * square * (3.0 + redo["core"])
    if params.has_head:
        matmul_flops += 6.0 * x.h * vocab_rows

    forward_traffic = layers * activations.layer_traffic_bytes(x)
    if params.has_embedding:
        forward_traffic += activations.embedding_bytes(x)[1]
    if params.has_head:
        forward_traffic += activations.loss_traffic_bytes(x, vocab)
    traffic = forward_traffic * (1.0 + constants.backward_traffic_factor) + layers * redo["traffic"]

    terms = {
        MATMUL: matmul_flops * tokens / (peak * eff.gemm),
        ATTENTION: flash_flops * tokens / (peak * eff.flash_attention),
        ELEMENTWISE: traffic * tokens / (gpu.hbm_bytes_per_sec * eff.hbm),
    }
    transfers = communication.micro_batch_transfers(workload, x, params, stage, redo)
    terms[TENSOR_PARALLEL] = transfer_seconds(workload, [t for t in transfers if t.kind == "mp"], constants)
    sends = [t for t in transfers if t.collective == "send"]
    receives = [t for t in transfers if t.collective == "recv"]  # batched with the sends: both ways at once
    terms[PIPELINE_P2P] = max(
        transfer_seconds(workload, sends, constants), transfer_seconds(workload, receives, constants)
    )
    terms[SHARDING_MICRO] = transfer_seconds(workload, [t for t in transfers if t.kind == "sharding"], constants)
    terms[ALL_TO_ALL] = transfer_seconds(workload, [t for t in transfers if t.kind == "ep"], constants)
    return terms


def step_seconds(workload, params: StageParameters, constants: PlannerConstants) -> dict:
    """Named seconds spent once per optimizer step on one card of a stage (outside the micro-batches)."""
    gpu = workload.gpu
    eff = constants.efficiency(gpu.architecture)
    owned = memory.owned_state_numel(workload, params)
    transfers = communication.step_transfers(workload, params, owned, params.replicated_numel)
    terms = {
        kind_term: transfer_seconds(workload, [t for t in transfers if t.kind == kind], constants)
        for kind, kind_term in (("sharding", SHARDING_STEP), ("dp", DATA_PARALLEL), ("mp", SEQUENCE_PARALLEL))
    }
    master = FP32 if workload.pure_low_precision else 0
    update_bytes = owned * (workload.grad_bytes + 2 * master + 4 * FP32 + workload.param_bytes)  # r/w master, m, v
    clip_bytes = params.numel * 2 * workload.grad_bytes  # global-norm: read, then scale in place
    terms[OPTIMIZER] = (update_bytes + clip_bytes) / (gpu.hbm_bytes_per_sec * eff.hbm)
    return terms
