"""The forecast: a config resolved, checked and estimated for its target cluster, on any machine.

``forecast_cluster(argv, nnodes, nproc_per_node, gpu)`` parses the config as
``python -m paddle.distributed.launch`` on ``nnodes x nproc_per_node`` cards would
(``pretrain.layout.simulated_launch``: paddlenlp's own degree derivation, no process group, no
GPU), resolves it for the cluster (files absent here become notes), runs the preflight checks that
can be answered here for the cluster's GPU, and estimates memory and speed with
``pretrain.planner``. ``run_pretrain.py --dry_run true`` under a real launch prints the same
estimate for the cards it runs on (``estimate_run``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from pretrain.arguments import parse_arguments
from pretrain.errors import UserError
from pretrain.layout import ParallelLayout, simulated_launch
from pretrain.layout_rules import expert_parallel_degree
from pretrain.metrics.hardware import GPU_SPECS, find_gpu, gpu_name
from pretrain.metrics.peak_memory import GIB
from pretrain.model_config import model_label
from pretrain.param_count import decoder_shape, experts_text
from pretrain.planner import Estimate, Workload, estimate
from pretrain.planner.memory import model_states_bytes_per_parameter
from pretrain.planner.parameters import layer_shapes, outer_shapes, stage_parameters
from pretrain.preflight import check_run, raise_problems, runs_on_gpu, warn_run
from pretrain.registry import implementation_for
from pretrain.resolve import RunPlan, resolve_run

MEMORY_WARNING_FRACTION = 0.95  # warn when the predicted peak exceeds this share of the card


@dataclass
class ClusterForecast:
    """A run forecast for a cluster: the resolved run, the GPU, and what the planner predicts."""

    run: RunPlan
    gpu: object  # pretrain.metrics.hardware.GpuSpec
    warnings: list = field(default_factory=list)
    estimate: Optional[Estimate] = None
    does_not_fit: Optional[str] = None  # the line saying why, when the predicted peak exceeds the card


def gpu_spec(name: str):
    """The ``GpuSpec`` of a part or CUDA name (``A100-SXM4-80GB``, ``H100``, ...).

    Raises:
        UserError: the name matches no part of ``pretrain.metrics.hardware.GPU_SPECS``.
    """
    spec = find_gpu(name)
    if spec is None:
        parts = ", ".join(spec.part for _, spec in GPU_SPECS)
        raise UserError(f"--gpu {name!r} is not a GPU the planner knows; use one of {parts}")
    return spec


def estimate_run(plan: RunPlan, gpu) -> tuple:
    """``(Estimate or None, warnings, does_not_fit)`` of a resolved run on ``gpu`` (a ``GpuSpec``).

    The estimate is None, with a warning saying why, where the planner does not model the run, and
    None, with ``does_not_fit`` saying so, where the model states alone exceed all the cards' memory
    (no layout can fit: nothing is estimated). ``does_not_fit`` is also the line for a predicted peak
    above the card; a peak above ``MEMORY_WARNING_FRACTION`` of it is a warning.
    """
    if plan.model_config is None:
        return None, [], None
    args = plan.training_args
    try:
        workload = Workload.from_arguments(plan.model_config, plan.layout, plan.model_args, plan.data_args, args, gpu)
        hopeless = _no_layout_fits(plan, workload)
        result = None if hopeless else estimate(workload)
    except UserError as e:
        return None, [f"planner: no estimate ({e})"], None
    if result is None:
        return None, [], hopeless
    stage = result.memory_gib.index(result.peak_memory_gib)

    def peak(against: str) -> str:
        return (
            f"memory: predicted peak {result.peak_memory_gib:.1f} GiB (pipeline stage {stage}) {against} the "
            f"{gpu.part}'s {result.usable_memory_gib:.1f} GiB; lower per_device_train_batch_size, turn recompute on, "
            "or shard more (tools/plan.py --search)"
        )

    if not result.fits:
        return result, [], peak("does not fit")
    if result.peak_memory_gib > MEMORY_WARNING_FRACTION * result.usable_memory_gib:
        return result, [peak(f"is over {MEMORY_WARNING_FRACTION:.0%} of")], None
    return result, [], None


def _no_layout_fits(plan: RunPlan, workload: Workload) -> Optional[str]:
    """The line for a model whose model states alone, sharded over every card, exceed all their memory."""
    gpu, cards = workload.gpu, plan.layout.world_size
    parameters = plan.num_parameters or 0  # None only without a model config, which has no estimate
    per_parameter = model_states_bytes_per_parameter(workload)
    states_gib = parameters * per_parameter / GIB
    if states_gib <= cards * gpu.memory_gib:
        return None
    cards_needed = math.ceil(states_gib / gpu.memory_gib)
    return (
        f"memory: {model_label(plan.model_args, plan.model_config)} has {parameters:,} parameters, whose model "
        f"states alone ({per_parameter} bytes each: parameter, gradient, master weight, Adam moments) need "
        f"{states_gib:,.0f} GiB, more than the {cards} x {gpu.memory_gib:.1f} GiB of the cluster together: no "
        f"layout fits; use a smaller model or more cards (the model states alone need {cards_needed:,} or more; "
        "tools/plan.py --search ranks the layouts that fit a card count)"
    )


def estimate_on_this_gpu(plan: RunPlan) -> tuple:
    """``(Estimate or None, warnings)`` of ``estimate_run`` for the GPU this process runs on; ``(None, [])`` on
    CPU or an unknown GPU.

    Raises:
        UserError: ``does_not_fit``: the predicted peak exceeds the card, or the model states alone exceed all
            the cards together, as ``tools/plan.py`` refuses it (a launch used to warn, then run out of memory
            at the first optimizer step).
    """
    name = gpu_name() if runs_on_gpu(plan.training_args) else None
    spec = find_gpu(name) if name else None
    if spec is None:
        return None, []
    result, warnings, does_not_fit = estimate_run(plan, spec)
    if does_not_fit:
        raise UserError(does_not_fit)
    return result, warnings


def resolve_for_cluster(argv: list, nnodes: int, nproc_per_node: int) -> RunPlan:
    """The ``RunPlan`` of ``run_pretrain.py ARGV`` as launched on ``nnodes x nproc_per_node`` cards.

    Raises:
        UserError: a card count below 1, or the arguments do not parse (paddlenlp's own degree checks included).
    """
    for flag, count in (("--nnodes", nnodes), ("--nproc_per_node", nproc_per_node)):
        if count < 1:
            raise UserError(f"{flag} {count}: a cluster needs at least 1 machine and 1 card per machine")
    with simulated_launch(nnodes, nproc_per_node):
        model_args, data_args, training_args = parse_arguments(
            argv, program="tools/plan.py", example_config="config/llama/pretrain_argument.json"
        )
        layout = ParallelLayout.from_arguments(training_args, nnodes)
    return resolve_run(model_args, data_args, training_args, layout, on_cluster=True)


def forecast_cluster(argv: list, nnodes: int, nproc_per_node: int, gpu: str) -> ClusterForecast:
    """Resolve, check and estimate ``run_pretrain.py ARGV`` for ``nnodes x nproc_per_node`` ``gpu`` cards.

    A predicted peak above the card is not a warning but ``does_not_fit`` (``tools/plan.py`` prints
    the plan, then refuses it).

    Raises:
        UserError: an unknown GPU, arguments that do not parse, preflight problems on that cluster
            (one line each, naming the key), or model states that exceed every card's memory together.
    """
    spec = gpu_spec(gpu)
    run = resolve_for_cluster(argv, nnodes, nproc_per_node)
    raise_problems(check_run(run, spec))
    result, estimate_warnings, does_not_fit = estimate_run(run, spec)
    if result is None and does_not_fit:
        raise UserError(does_not_fit)
    return ClusterForecast(run, spec, warn_run(run) + estimate_warnings, result, does_not_fit)


def rate_text(tokens_per_sec: float) -> str:
    """Tokens per second as printed: whole numbers, or two significant digits below 10 (never a bare 0)."""
    return f"{tokens_per_sec:,.0f}" if tokens_per_sec >= 10 else f"{tokens_per_sec:.2g}"


def format_estimate(estimate) -> list:
    """Lines describing a planner ``Estimate``: memory per pipeline stage with its terms, speed with its terms."""
    lines = [
        f"predicted (pretrain.planner): {rate_text(estimate.tokens_per_card_per_sec)} tokens/card/s, MFU "
        f"{estimate.mfu:.1%}, {estimate.step_seconds:.2f} s per step; peak {estimate.peak_memory_gib:.1f} of "
        f"{estimate.usable_memory_gib:.1f} GiB per card ({'fits' if estimate.fits else 'DOES NOT FIT'})",
        "  memory per card, GiB (device, as nvidia-smi shows; max_memory_allocated in brackets):",
    ]
    for stage, (device, allocated, terms) in enumerate(
        zip(estimate.memory_gib, estimate.allocated_gib, estimate.memory_breakdown)
    ):
        shown = ", ".join(f"{name} {value:.2f}" for name, value in terms.items() if value >= 0.005)
        lines.append(f"    stage {stage}: {device:.1f} [{allocated:.1f}] = {shown}")
    shown = ", ".join(
        f"{name} {value / estimate.step_seconds:.0%}" for name, value in estimate.time_breakdown.items() if value > 0
    )
    lines.append(f"  step time: {shown}")
    lines += [f"  assumed: {line}" for line in estimate.assumptions]
    return lines


def _parameter_layout(plan) -> tuple:
    """``(DecoderShape, tp, pp, fused_qkv, fused_ffn, ep)`` of a plan, as ``pretrain.planner.parameters`` takes them."""
    config, layout = plan.model_config, plan.layout
    fused_qkv = implementation_for(config.model_type).fused_qkv(getattr(config, "fuse_attention_qkv", False))
    fused_ffn = bool(getattr(config, "fuse_attention_ffn", False))
    ep = expert_parallel_degree(layout, plan.training_args.use_expert_parallel)
    tp, pp = layout.tensor_parallel_degree, layout.pipeline_parallel_degree
    return decoder_shape(config), tp, pp, fused_qkv, fused_ffn, ep


def _stages(plan, parameter_layout: tuple) -> list:
    """``StageParameters`` of each pipeline stage of a plan, stage 0 first (``parameter_layout``: its
    ``_parameter_layout``)."""
    shape, tp, pp, fused_qkv, fused_ffn, ep = parameter_layout
    return stage_parameters(shape, tp, pp, plan.layout.virtual_pp_degree, fused_qkv, fused_ffn, ep)


def format_parameters(plan) -> list:
    """Lines with the per-rank parameter shapes of one decoder layer, the embedding and head, and the
    parameters each pipeline stage holds on one card (``pretrain.planner.parameters``)."""
    parameter_layout = _parameter_layout(plan)
    shape, tp, pp, fused_qkv, fused_ffn, ep = parameter_layout
    outer = outer_shapes(shape, tp, pp)
    experts = f", expert parallel {ep}: rank 0's {experts_text(shape.experts // ep)} per layer" if ep > 1 else ""
    lines = [f"parameter shapes on one card (tensor_parallel_degree {tp}{experts}; [in, out] for weights):"]
    layer = layer_shapes(shape, tp, fused_qkv, fused_ffn, ep)
    if shape.experts // ep > 1:  # the card's experts are alike: expert 0's shapes, named for all of them
        span = f"experts.0-{shape.experts // ep - 1}."
        layer = [(name.replace("experts.0.", span), dims) for name, dims in layer if not _other_expert(name)]
    lines.append("  each decoder layer: " + ", ".join(f"{name} {list(dims)}" for name, dims in layer))
    for part in ("embedding", "final_norm", "head"):
        if outer[part]:
            lines.append(f"  {part}: " + ", ".join(f"{name} {list(dims)}" for name, dims in outer[part]))
    for index, stage in enumerate(_stages(plan, parameter_layout)):
        parts = [f"{stage.decoder_layers} layers"]
        parts += ["embedding"] * stage.has_embedding + ["norm + head"] * stage.has_head
        lines.append(f"  pipeline stage {index}: {stage.numel:,} parameters per card ({' + '.join(parts)})")
    return lines


def _other_expert(name: str) -> bool:
    """Whether a parameter name of ``layer_shapes`` is a routed expert's other than expert 0's."""
    return name.startswith("experts.") and not name.startswith("experts.0.")


def format_forecast(cluster) -> str:
    """The human-readable plan of a ``pretrain.forecast.ClusterForecast``."""
    plan, gpu, layout, args = cluster.run, cluster.gpu, cluster.run.layout, cluster.run.training_args
    per_replica = plan.global_batch_samples // layout.dataset_world_size
    lines = [
        f"plan: {layout.nnodes} x {layout.nproc_per_node} {gpu.part} ({gpu.memory_gib:.1f} GiB, "
        f"{gpu.peak_flops_per_sec / 1e12:.0f} TFLOP/s dense bf16/fp16): preflight passed",
        f"layout {layout.name}: tensor {layout.tensor_parallel_degree}, pipeline {layout.pipeline_parallel_degree} "
        f"(virtual {layout.virtual_pp_degree}), sharding stage {layout.sharding_stage} over "
        f"{layout.sharding_parallel_degree}, data {layout.data_parallel_degree}, sep {layout.sep_parallel_degree}, "
        f"context {layout.context_parallel_degree}, sequence parallel {'on' if layout.sequence_parallel else 'off'}",
        f"global batch {plan.global_batch_samples} samples x {plan.seq_length} tokens = {plan.global_batch_tokens:,} "
        f"tokens per step; each of {layout.dataset_world_size} data ranks reads {per_replica} samples "
        f"({args.per_device_train_batch_size} per micro batch x {args.gradient_accumulation_steps} accumulation)",
        f"model {model_label(plan.model_args, plan.model_config)}: {plan.num_parameters:,} parameters, vocabulary "
        f"{plan.model_config.vocab_size}",
        *format_parameters(plan),
    ]
    if cluster.estimate is not None:
        lines += format_estimate(cluster.estimate)
    lines += [f"warning: {line}" for line in cluster.warnings]
    lines += [f"note: {line}" for line in plan.notes]
    return "\n".join(lines)


def forecast_json(cluster) -> dict:
    """The machine-readable plan: layout, batch, parameters per card, and the planner's predictions
    (null where the planner gives no estimate). Memory in GiB per card, one entry per pipeline stage."""
    plan, layout, estimate = cluster.run, cluster.run.layout, cluster.estimate
    stages = _stages(plan, _parameter_layout(plan))
    return {
        "layout": {
            "tensor_parallel_degree": layout.tensor_parallel_degree,
            "pipeline_parallel_degree": layout.pipeline_parallel_degree,
            "virtual_pp_degree": layout.virtual_pp_degree,
            "sharding_stage": layout.sharding_stage,
            "sharding_parallel_degree": layout.sharding_parallel_degree,
            "data_parallel_degree": layout.data_parallel_degree,
            "sep_parallel_degree": layout.sep_parallel_degree,
            "context_parallel_degree": layout.context_parallel_degree,
            "sequence_parallel": layout.sequence_parallel,
            "world_size": layout.world_size,
            "nnodes": layout.nnodes,
        },
        "gpu": cluster.gpu.part,
        "global_batch_size": plan.global_batch_samples,
        "global_batch_tokens": plan.global_batch_tokens,
        "seq_length": plan.seq_length,
        "num_params": plan.num_parameters,
        "params_per_card": max(stage.numel for stage in stages),
        "params_per_card_per_stage": [stage.numel for stage in stages],
        "tokens_per_card_per_sec": estimate.tokens_per_card_per_sec if estimate else None,
        "mfu": estimate.mfu if estimate else None,
        "memory_gib": list(estimate.memory_gib) if estimate else None,
        "memory_allocated_gib": list(estimate.allocated_gib) if estimate else None,
        "memory_breakdown": (
            {f"stage {i}": terms for i, terms in enumerate(estimate.memory_breakdown)} if estimate else None
        ),
        "fits": estimate.fits if estimate else None,
        "time_breakdown": estimate.time_breakdown if estimate else None,
        "assumptions": list(estimate.assumptions) if estimate else None,
        "warnings": cluster.warnings,
        "notes": plan.notes,
    }
