"""``search(workload, N, K)``: the layouts and knobs that fit a run on N x K cards, fastest first.

Enumerated, for a fixed global batch (samples per optimizer step), keeping the run's model, GPU,
sequence, precision and kernels:
  tensor parallel t    divisors of the cards per machine (tensor parallelism stays inside a machine)
  pipeline p, virtual v  divisors of the rest; v in ``VIRTUAL_DEGREES`` where the layers divide into p x v
  sharding degree and stage  divisors of what is left (stage 1, 2 or 3; none when the degree is 1),
                       the remainder is data parallel
  recompute            off, or on with each of paddlenlp's granularities (``core_attn`` only without
                       flash attention, where it drops the s x s scores; with flash it saves nothing)
  micro batch          powers of two dividing the per-replica batch; accumulation = the rest
What paddlenlp refuses (``validity``) or what does not fit the card is dropped; the rest are
ranked by predicted tokens/card/s (ties: more memory headroom first).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from pretrain.errors import UserError
from pretrain.layout import ParallelLayout
from pretrain.planner.constants import DEFAULT_CONSTANTS, PlannerConstants
from pretrain.planner.estimate import Estimate, estimate
from pretrain.planner.validity import problems
from pretrain.planner.workload import Workload

VIRTUAL_DEGREES = (1, 2, 4)
RECOMPUTE_OPTIONS = ((False, "full"), (True, "full"), (True, "full_attn"), (True, "core_attn"))
MAX_MICRO_BATCH = 64  # samples


@dataclass(frozen=True)
class Candidate:
    """One runnable configuration and its estimate."""

    workload: Workload
    estimate: Estimate

    @property
    def name(self) -> str:
        """e.g. ``TP2PP1SH2SP4DP1 mbs 2 gas 128 recompute full``."""
        w = self.workload
        virtual = f" v{w.layout.virtual_pp_degree}" if w.layout.virtual_pp_degree > 1 else ""
        recompute = f"recompute {w.recompute_granularity}" if w.recompute else "no recompute"
        return f"{w.layout.name}{virtual} mbs {w.micro_batch_size} gas {w.gradient_accumulation_steps} {recompute}"


def _divisors(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


def _layouts(nnodes: int, nproc_per_node: int, num_layers: int):
    """Every ParallelLayout of N x K cards (tensor parallel within a machine), before validity checks."""
    world = nnodes * nproc_per_node
    for tp in _divisors(nproc_per_node):
        for pp in _divisors(world // tp):
            for virtual in VIRTUAL_DEGREES if pp > 1 else (1,):
                if virtual > 1 and num_layers % (pp * virtual):
                    continue
                rest = world // (tp * pp)
                for degree in _divisors(rest):
                    for stage in (1, 2, 3) if degree > 1 else (1,):
                        yield ParallelLayout(
                            world_size=world,
                            nnodes=nnodes,
                            tensor_parallel_degree=tp,
                            pipeline_parallel_degree=pp,
                            virtual_pp_degree=virtual,
                            sharding_stage=stage if degree > 1 else 0,
                            sharding_parallel_degree=degree,
                            data_parallel_degree=rest // degree,
                        )


def search(
    workload: Workload,
    nnodes: int,
    nproc_per_node: int,
    *,
    global_batch_size: Optional[int] = None,
    top_k: int = 10,
    constants: PlannerConstants = DEFAULT_CONSTANTS,
) -> list:
    """The ``top_k`` fastest configurations of ``workload``'s run that fit N x K cards, fastest first.

    Kept from ``workload``: the model config, GPU, sequence length, precision, AMP level, master
    gradients and kernels (flash attention, fused norm and RoPE, fused QKV/FFN). Searched: the layout,
    recompute and micro batch (see the module docstring).

    Args:
        workload: the run to re-plan (e.g. ``Workload.from_arguments`` of a config); its layout, micro
            batch, accumulation and recompute are ignored except to give the default global batch.
        nnodes, nproc_per_node: the cluster, N machines x K cards.
        global_batch_size: samples per optimizer step every candidate keeps (micro batch x
            accumulation x data-parallel replicas); default ``workload.global_batch_samples``.
        top_k: how many to return.

    Raises:
        UserError: a size below 1, or no configuration runs and fits (the message says so).
    """
    global_batch = global_batch_size or workload.global_batch_samples
    if min(nnodes, nproc_per_node, global_batch, top_k) < 1:
        raise UserError("nnodes, nproc_per_node, global_batch_size and top_k must be >= 1")
    num_layers = workload.model_config.num_hidden_layers
    candidates = []
    for layout in _layouts(nnodes, nproc_per_node, num_layers):
        replicas = layout.dataset_world_size
        if global_batch % replicas or problems(replace(workload, layout=layout)):
            continue
        per_replica = global_batch // replicas
        for recompute, granularity in RECOMPUTE_OPTIONS:
            if recompute and granularity == "core_attn" and workload.use_flash_attention:
                continue
            micro = 1
            while micro <= min(per_replica, MAX_MICRO_BATCH) and per_replica % micro == 0:
                candidate = replace(
                    workload,
                    layout=layout,
                    micro_batch_size=micro,
                    gradient_accumulation_steps=per_replica // micro,
                    recompute=recompute,
                    recompute_granularity=granularity,
                )
                result = estimate(candidate, constants)
                if not result.fits:
                    break  # memory grows with the micro batch
                candidates.append(Candidate(candidate, result))
                micro *= 2
    if not candidates:
        raise UserError(
            f"no layout of {nnodes} x {nproc_per_node} {workload.gpu.part} fits this model at global batch "
            f"{global_batch} x {workload.seq_length} tokens; add cards or use a larger card"
        )
    candidates.sort(key=lambda c: (-c.estimate.tokens_per_card_per_sec, -c.estimate.headroom_gib))
    return candidates[:top_k]
