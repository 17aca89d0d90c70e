"""The forecast: a config resolved, checked and estimated for its target cluster, on any machine.

``plan_cluster(argv, nnodes, nproc_per_node, gpu)`` parses the config as
``python -m paddle.distributed.launch`` on ``nnodes x nproc_per_node`` cards would
(``pretrain.layout.simulated_launch``: paddlenlp's own degree derivation, no process group, no
GPU), resolves it for the cluster (files absent here become notes), runs the preflight checks that
can be answered here for the cluster's GPU, and estimates memory and speed with
``pretrain.planner``. ``run_pretrain.py --dry_run true`` under a real launch prints the same
estimate for the cards it runs on (``estimate_run``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from pretrain.arguments import parse_arguments
from pretrain.errors import UserError
from pretrain.layout import ParallelLayout, simulated_launch
from pretrain.metrics.hardware import GPU_SPECS, find_gpu, gpu_name
from pretrain.planner import Estimate, Workload, estimate
from pretrain.preflight import check_for_cluster, raise_problems, runs_on_gpu, warn_run
from pretrain.resolve import RunPlan, resolve_run

MEMORY_WARNING_FRACTION = 0.95  # warn when the predicted peak exceeds this share of the card


@dataclass
class ClusterPlan:
    """A run planned for a cluster: the resolved run, the GPU, and what the planner predicts."""

    run: RunPlan
    gpu: object  # pretrain.metrics.hardware.GpuSpec
    warnings: list = field(default_factory=list)
    estimate: Optional[Estimate] = None


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
    """``(Estimate or None, warnings)`` of a resolved run on ``gpu`` (a ``GpuSpec``).

    The estimate is None, with a line saying why, where the planner does not model the run; a
    predicted peak above ``MEMORY_WARNING_FRACTION`` of the card is a warning.
    """
    if plan.model_config is None:
        return None, []
    args = plan.training_args
    try:
        workload = Workload.from_arguments(plan.model_config, plan.layout, plan.model_args, plan.data_args, args, gpu)
        result = estimate(workload)
    except UserError as e:
        return None, [f"planner: no estimate ({e})"]
    if result.peak_memory_gib > MEMORY_WARNING_FRACTION * result.usable_memory_gib:
        stage = result.memory_gib.index(result.peak_memory_gib)
        return result, [
            f"memory: predicted peak {result.peak_memory_gib:.1f} GiB (pipeline stage {stage}) is over "
            f"{MEMORY_WARNING_FRACTION:.0%} of the {gpu.part}'s {result.usable_memory_gib:.1f} GiB; lower "
            "per_device_train_batch_size, turn recompute on, or shard more (tools/plan.py --search)"
        ]
    return result, []


def estimate_on_this_gpu(plan: RunPlan) -> tuple:
    """``estimate_run`` for the GPU this process runs on; ``(None, [])`` on CPU or an unknown GPU."""
    name = gpu_name() if runs_on_gpu(plan.training_args) else None
    spec = find_gpu(name) if name else None
    return estimate_run(plan, spec) if spec else (None, [])


def resolve_for_cluster(argv: list, nnodes: int, nproc_per_node: int) -> RunPlan:
    """The ``RunPlan`` of ``run_pretrain.py ARGV`` as launched on ``nnodes x nproc_per_node`` cards.

    Raises:
        UserError: a card count below 1, or the arguments do not parse (paddlenlp's own degree checks included).
    """
    for flag, count in (("--nnodes", nnodes), ("--nproc_per_node", nproc_per_node)):
        if count < 1:
            raise UserError(f"{flag} {count}: a cluster needs at least 1 machine and 1 card per machine")
    with simulated_launch(nnodes, nproc_per_node):
        model_args, data_args, training_args = parse_arguments(argv)
        layout = ParallelLayout.from_arguments(training_args, nnodes)
    return resolve_run(model_args, data_args, training_args, layout, on_cluster=True)


def plan_cluster(argv: list, nnodes: int, nproc_per_node: int, gpu: str) -> ClusterPlan:
    """Resolve, check and estimate ``run_pretrain.py ARGV`` for ``nnodes x nproc_per_node`` ``gpu`` cards.

    Raises:
        UserError: an unknown GPU, arguments that do not parse, or preflight problems on that
            cluster (one line each, naming the key).
    """
    spec = gpu_spec(gpu)
    run = resolve_for_cluster(argv, nnodes, nproc_per_node)
    raise_problems(check_for_cluster(run, spec))
    result, estimate_warnings = estimate_run(run, spec)
    return ClusterPlan(run, spec, warn_run(run) + estimate_warnings, result)
