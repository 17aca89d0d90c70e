"""``estimate(workload)``: peak memory per pipeline stage and training speed of one configuration.

Pure arithmetic on the config (``memory`` and ``throughput`` hold the formulas); a plan takes
milliseconds on a laptop.
"""

from __future__ import annotations

from dataclasses import dataclass

from pretrain.errors import UserError
from pretrain.metrics.flops import mfu, model_flops_per_token
from pretrain.param_count import decoder_shape
from pretrain.planner import communication, experts, memory, throughput
from pretrain.planner.activations import layer_dims
from pretrain.planner.constants import DEFAULT_CONSTANTS, PlannerConstants
from pretrain.planner.parameters import stage_parameters
from pretrain.planner.validity import problems
from pretrain.registry import implementation_for


@dataclass(frozen=True)
class Estimate:
    """Predicted memory and speed of a Workload. Memory in GiB (2**30 bytes), time in seconds."""

    memory_gib: tuple  # peak device memory (nvidia-smi style) per pipeline stage, stage 0 first
    allocated_gib: tuple  # the same peak as paddle's max_memory_allocated (no reserve, no context)
    memory_breakdown: tuple  # per stage: {term: GiB}, summing to memory_gib
    usable_memory_gib: float  # the card's memory
    fits: bool  # every stage's peak <= the card's memory
    tokens_per_card_per_sec: float
    mfu: float  # PaLM model FLOPs utilization, fraction (pretrain.metrics.flops)
    step_seconds: float  # one optimizer step
    time_breakdown: dict  # {term: seconds per step} of the slowest stage; sums to step_seconds
    flops_per_token: float  # PaLM model FLOPs per token
    assumptions: tuple = ()  # lines the plan prints about what is modelled how (a mixture of experts')

    @property
    def peak_memory_gib(self) -> float:
        return max(self.memory_gib)

    @property
    def headroom_gib(self) -> float:
        """Card memory left at the busiest stage's peak (negative: does not fit)."""
        return self.usable_memory_gib - self.peak_memory_gib


def layer_and_stages(workload) -> tuple:
    """(``LayerDims``, [``StageParameters`` of each pipeline stage]) of ``workload``."""
    config, layout = workload.model_config, workload.layout
    shape = decoder_shape(config)
    stages = stage_parameters(
        shape,
        layout.tensor_parallel_degree,
        layout.pipeline_parallel_degree,
        layout.virtual_pp_degree,
        implementation_for(config.model_type).fused_qkv(workload.fuse_attention_qkv),
        workload.fuse_attention_ffn,
        workload.expert_parallel_degree,
    )
    return layer_dims(shape, config.model_type, workload), stages


def communication_volume(workload, on_cpu: bool = False) -> list:
    """Payload bytes per optimizer step on one card of each pipeline stage (stage 0 first), as
    ``[{group kind: {collective: bytes}}]`` (``pretrain.planner.communication``; the figure
    ``pretrain.metrics.comm_volume`` counts). ``on_cpu``: as ``pretrain.cpu_comm`` runs the layout on CPU
    processes (whole pipeline sends, 4096-byte sharding alignment; ``communication.micro_batch_transfers``).

    Raises:
        UserError: the model type has no shape reader (``pretrain.param_count``).
    """
    dims, stages = layer_and_stages(workload)
    redo = throughput.recomputed_forward(dims)
    return [
        communication.step_volume(
            communication.micro_batch_transfers(workload, dims, params, stage, redo, on_cpu),
            communication.step_transfers(
                workload, params, memory.owned_state_numel(workload, params), params.replicated_numel, on_cpu
            ),
            workload.gradient_accumulation_steps,
        )
        for stage, params in enumerate(stages)
    ]


def estimate(workload, constants: PlannerConstants = DEFAULT_CONSTANTS) -> Estimate:
    """Peak memory per stage and tokens/card/s of ``workload``.

    Raises:
        UserError: the workload cannot run (``validity.problems``: degrees, divisibility, unsupported
            combinations), or the model type has no shape reader (``pretrain.param_count``).
    """
    found = problems(workload)
    if found:
        raise UserError("this configuration cannot run: " + "; ".join(found))
    config, layout = workload.model_config, workload.layout
    dims, stages = layer_and_stages(workload)

    breakdowns = [
        memory.to_gib(memory.stage_memory_bytes(workload, dims, params, index, constants))
        for index, params in enumerate(stages)
    ]
    device = tuple(sum(terms.values()) for terms in breakdowns)
    allocated = tuple(
        sum(value for name, value in terms.items() if name not in memory.DEVICE_ONLY) for terms in breakdowns
    )

    micro = [throughput.micro_batch_seconds(workload, dims, params, constants, i) for i, params in enumerate(stages)]
    per_step = [throughput.step_seconds(workload, params, constants) for params in stages]
    slowest = max(range(len(stages)), key=lambda i: sum(micro[i].values()))
    busiest = max(range(len(stages)), key=lambda i: sum(per_step[i].values()))
    m = workload.gradient_accumulation_steps
    micro_time = sum(micro[slowest].values())
    bubble = (layout.pipeline_parallel_degree - 1) / layout.virtual_pp_degree * micro_time
    breakdown = {name: m * value for name, value in micro[slowest].items()}
    breakdown[throughput.BUBBLE] = bubble
    breakdown.update(per_step[busiest])
    step = sum(breakdown.values())

    tokens_per_card = workload.tokens_per_micro_batch * m * layout.dataset_world_size / layout.world_size
    rate = tokens_per_card / step
    flops_per_token = model_flops_per_token(config, workload.seq_length)
    return Estimate(
        memory_gib=device,
        allocated_gib=allocated,
        memory_breakdown=tuple(breakdowns),
        usable_memory_gib=workload.gpu.memory_gib,
        fits=max(device) <= workload.gpu.memory_gib,
        tokens_per_card_per_sec=rate,
        mfu=mfu(rate, flops_per_token, workload.gpu.peak_flops_per_sec),
        step_seconds=step,
        time_breakdown=breakdown,
        flops_per_token=flops_per_token,
        assumptions=tuple(experts.assumptions(workload, throughput.group_crosses_nodes(layout, "dp"))),
    )
