"""The end-of-run report: printed and written to ``<output_dir>/run_summary.json``.

Units are in the key names: tokens, seconds, GiB (2**30 bytes), FLOP/s; ``mfu`` and
``mfu_nominal`` are fractions in [0, 1], null when unknown or not credible, with the reason in
``mfu_null_reason`` / ``mfu_nominal_null_reason`` (see pretrain.metrics.flops). Rates are over the steps this
process ran after the first ``throughput_warmup_steps`` (see pretrain.metrics.step_timer). ``peak_memory_gib`` is
this card's (global rank 0's), ``peak_memory_gib_max`` the max over ranks and ``peak_memory_max_rank``
which rank (``pretrain.metrics.rank_figures``, with the slowest rank's step time, the fastest rank's
tokens/card/s and the per-rank lists under ``per_rank``). ``peak_flops_per_card`` is what MFU divides by,
``peak_flops_definition`` says which figure it is (``datasheet``, ``physical``: the CPU's, from
/proc/cpuinfo, whatever the load, or ``override``); ``achievable_flops_per_card`` is the measured matmul
rate beside it (``measure_peak_flops``).
``time_breakdown`` (phase -> seconds), ``wall_seconds`` and ``goodput`` cover the whole run, restarts
included (``pretrain.metrics.time_breakdown``). What is printed is a few lines (``format_summary``); the file
holds it all.
"""

from __future__ import annotations

import math
import os
from typing import Optional

from pretrain.atomic import write_json
from pretrain.log import logger
from pretrain.metrics import flops
from pretrain.metrics.peak_memory import peak_memory_gib
from pretrain.metrics.rank_figures import gather_rank_figures, rank_extremes
from pretrain.metrics.time_breakdown import summary_fields
from pretrain.param_count import count_config_parameters
from pretrain.precision import Precision

SUMMARY_FILE = "run_summary.json"


def parallel_degrees(layout) -> dict:
    """Degrees of each parallel dimension of a ``ParallelLayout`` (1 when unused) and the sharding stage
    (0 = no sharding; the stage the config names, also when its degree is 1)."""
    return {
        "data": layout.data_parallel_degree,
        "sharding": layout.sharding_parallel_degree,
        "sharding_stage": layout.sharding_stage,
        "tensor": layout.tensor_parallel_degree,
        "pipeline": layout.pipeline_parallel_degree,
    }


def build_summary(trainer, plan, eval_loss: Optional[float], predicted=None) -> dict:
    """Collect the run's figures after training.

    tokens_per_card_per_sec = steps/s (this process, after the warm-up steps) x global tokens per
    step / world size, so every card of a tensor- or pipeline-parallel group is counted.
    ``num_params`` is the full model's (counted from the config, whatever the parallel degrees).
    ``mfu`` uses the PaLM FLOPs per token, ``mfu_nominal`` 6 x ``nominal_params`` (both in their
    frozen-weight forms, 4N, when the trainer's StepWork says only an adapter is trained: see
    pretrain.metrics.flops); both are null without a peak FLOP/s (see pretrain.metrics.hardware), when no step ran
    after the warm-up, or when the value would exceed 1 (the peak is wrong), with the reason in
    ``mfu_null_reason`` and ``mfu_nominal_null_reason``.
    ``predicted_*`` are the planner's figures for this GPU (``predicted``, a ``pretrain.planner.Estimate``;
    null on CPU), beside the measured ones so the planner can be recalibrated.
    """
    args, config, layout = trainer.args, plan.model_config, plan.layout
    timer = trainer.step_timer
    work = timer.work
    rates = timer.run_rates() if work else {}
    peak = work.peak if work else None
    flops_per_token = work.model_flops_per_token if work else flops.model_flops_per_token(config, plan.seq_length)

    def null_reason(flops_per_token):
        return flops.mfu_null_reason(
            rates.get("tokens_per_card_per_sec"),
            flops_per_token,
            peak.flops_per_sec if peak else None,
            peak.source if peak else None,
        )

    losses = trainer.loss_history.train
    memory = peak_memory_gib()
    run_time = trainer.time_breakdown.run_time(trainer.state.global_step)
    totals, steps = trainer.time_breakdown.totals, trainer.time_breakdown.steps
    per_rank = gather_rank_figures(  # a collective: every rank builds the summary
        {
            "peak_memory_gib": memory["peak_memory_gib"],
            "step_seconds": trainer.time_breakdown.step_seconds(),
            "data_wait_seconds": totals["data_wait"] / steps if steps else None,
            "tokens_per_card_per_sec": rates.get("tokens_per_card_per_sec"),  # this rank's own clock
            "pipeline_stage": args.pipeline_parallel_rank,  # model states held (pretrain.optimizer_chain.held_elements)
            "parameter_elements": trainer.held_elements.parameters,
            "optimizer_elements": trainer.held_elements.optimizer,
        },
        args.world_size,
    )
    achievable = work.achievable if work else None
    return {
        "global_step": trainer.state.global_step,
        "steps_run_this_process": timer.steps_run,
        "throughput_warmup_steps": args.throughput_warmup_steps,
        "train_loss_first": losses[0][1] if losses else None,
        "train_loss_last": losses[-1][1] if losses else None,
        "eval_loss": eval_loss,
        "eval_samples": len(trainer.eval_dataset) if eval_loss is not None else None,  # the samples eval_loss averages
        "ln_vocab_size": math.log(config.vocab_size),
        "vocab_size": config.vocab_size,
        "seq_length": plan.seq_length,
        "precision": Precision.from_arguments(args).label,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "global_batch_samples": plan.global_batch_samples,
        "global_batch_tokens": plan.global_batch_tokens,
        "train_tokens": plan.global_batch_tokens * trainer.applied_steps(),  # applied steps of the run, resumed or not
        "world_size": layout.world_size,
        "parallel_degrees": parallel_degrees(layout),
        "parallel_strategy": layout.name,
        "samples_per_sec": rates.get("samples_per_sec"),
        "tokens_per_sec": rates.get("tokens_per_sec"),
        "tokens_per_card_per_sec": rates.get("tokens_per_card_per_sec"),
        "num_params": plan.num_parameters,
        "num_active_params": count_config_parameters(config, activated=True)[0],  # per token; MoE: < num_params
        "model_flops_per_token": flops_per_token,
        "nominal_flops_per_token": work.nominal_flops_per_token if work else None,
        "nominal_params": args.nominal_params,
        "peak_flops_per_card": peak.flops_per_sec if peak else None,
        "peak_flops_source": peak.source if peak else None,
        "peak_flops_definition": peak.definition if peak else None,
        "achievable_flops_per_card": achievable.flops_per_sec if achievable else None,
        "achievable_flops_source": achievable.source if achievable else None,
        "mfu_of_achievable": flops.mfu_or_none(
            rates.get("tokens_per_card_per_sec"), flops_per_token, achievable.flops_per_sec if achievable else None
        ),
        "mfu": rates.get("mfu"),
        "mfu_null_reason": null_reason(flops_per_token),
        "mfu_nominal": rates.get("mfu_nominal"),
        "mfu_nominal_null_reason": null_reason(work.nominal_flops_per_token if work else None),
        **memory,
        **rank_extremes(per_rank),
        "per_rank": per_rank,
        **summary_fields(run_time),
        "predicted_tokens_per_card_per_sec": predicted.tokens_per_card_per_sec if predicted else None,
        # global rank 0 (whose memory is reported) runs pipeline stage 0
        "predicted_memory_gib": predicted.memory_gib[0] if predicted else None,
        "predicted_memory_allocated_gib": predicted.allocated_gib[0] if predicted else None,
        # loss_spike_policy: skipped steps, rollbacks, events; diverged: why the loss never recovered (recovery)
        **trainer.spikes.summary(trainer.state.global_step),
        # mixture of experts: the aux-loss coefficient, the dispatch, per-record expert shares (pretrain.routing)
        **({"routing": trainer.router_watch.summary()} if trainer.router_watch else {}),
    }


def format_mfu(summary: dict) -> str:
    """``41.2% (PaLM; peak 0.121 TFLOP/s, <source>)`` [+ ``; 38.0% nominal``], or ``n/a (<reason>)``."""
    if summary["mfu"] is None:
        return f"n/a ({summary['mfu_null_reason']})"
    text = (
        f"{100 * summary['mfu']:.1f}% (PaLM; peak {summary['peak_flops_per_card'] / 1e12:.3g} TFLOP/s, "
        f"{summary['peak_flops_source']})"
    )
    if summary["mfu_nominal"] is not None:
        text += f"; {100 * summary['mfu_nominal']:.1f}% nominal"
    return text


def format_time(summary: dict) -> str:
    """``goodput 61.0% of 1:35 wall (2 attempts); startup 12.1 s, data_wait 0.3 s, ...`` (phases over 0.05 s)."""
    goodput = "n/a" if summary["goodput"] is None else f"{100 * summary['goodput']:.1f}%"
    phases = ", ".join(
        f"{phase} {seconds:.1f} s" for phase, seconds in summary["time_breakdown"].items() if seconds >= 0.05
    )
    lost = f", {summary['lost_seconds']:.1f} s of steps lost to restarts" if summary["lost_seconds"] else ""
    return (
        f"goodput {goodput} of {summary['wall_seconds']:.1f} s wall ({summary['attempts']} attempt(s){lost}): {phases}"
    )


def format_summary(summary: dict, output_dir: str) -> str:
    """The run summary in a few lines: losses, throughput, MFU, memory, and where the files are."""

    def loss(value):
        return "n/a" if value is None else f"{value:.4f}"

    tokens = summary["tokens_per_card_per_sec"]
    ranks = len(summary["per_rank"]["peak_memory_gib"])
    max_memory = (
        f"; max {summary['peak_memory_gib_max']:.2f} GiB on rank {summary['peak_memory_max_rank']} of {ranks}"
        if ranks > 1
        else ""
    )
    ended = "done" if summary.get("diverged") is None else "diverged (the loss never recovered from its spikes)"
    return "\n".join(
        [
            f"{ended} at step {summary['global_step']}: train loss {loss(summary['train_loss_first'])} -> "
            f"{loss(summary['train_loss_last'])}, eval loss {loss(summary['eval_loss'])} "
            f"(uniform guess: ln {summary['vocab_size']} = {summary['ln_vocab_size']:.4f})",
            f"{'n/a' if tokens is None else f'{tokens:,.0f}'} tokens/card/s; peak memory "
            f"{summary['peak_memory_gib']:.2f} GiB ({summary['peak_memory_kind']}{max_memory}); "
            f"MFU {format_mfu(summary)}",
            format_time(summary),
            f"wrote {os.path.join(output_dir, SUMMARY_FILE)} (every figure), loss_history.json, run_config.json",
        ]
    )


def write_summary(summary: dict, output_dir: str) -> str:
    """Write the summary to ``<output_dir>/run_summary.json`` (atomically) and log ``format_summary``; return
    the path."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, SUMMARY_FILE)
    write_json(path, summary, indent=2)
    for line in format_summary(summary, output_dir).splitlines():
        logger.info(line)
    return path
