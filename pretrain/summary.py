"""The end-of-run report: printed and written to ``<output_dir>/run_summary.json``.

Units are in the key names: tokens, seconds, GiB (2**30 bytes), FLOP/s; ``mfu`` and
``mfu_nominal`` are fractions. Rates are over the steps this process ran after the first
``throughput_warmup_steps`` (see pretrain.throughput); memory is this card's (global rank 0's).
"""

from __future__ import annotations

import json
import math
import os
from typing import Optional

from pretrain import flops
from pretrain.atomic import atomic_outputs
from pretrain.log import logger
from pretrain.memory import peak_memory_gib
from pretrain.param_count import count_config_parameters
from pretrain.throughput import global_batch_samples


def precision(args) -> str:
    """The run's arithmetic: ``"bf16 O2"``, ``"fp16 O1"``, ... (AMP dtype and level) or ``"fp32"``."""
    for name in ("bf16", "fp16"):
        if getattr(args, name):
            return f"{name} {args.fp16_opt_level}"
    return "fp32"


def parallel_degrees(args) -> dict:
    """Degrees of each parallel dimension (1 when unused) and the sharding stage (0 = no sharding)."""
    stages = [option.value for option in args.sharding if option.value.startswith("stage")]
    return {
        "data": args.data_parallel_degree,
        "sharding": max(args.sharding_parallel_degree, 1),
        "sharding_stage": int(stages[0][len("stage") :]) if stages else 0,
        "tensor": max(args.tensor_parallel_degree, 1),
        "pipeline": max(args.pipeline_parallel_degree, 1),
    }


def parallel_strategy(degrees: dict) -> str:
    """The published tables' name, TP{tensor}PP{pipeline}SH{sharding stage}SP{sharding degree}, plus DP{data}."""
    return "TP{tensor}PP{pipeline}SH{sharding_stage}SP{sharding}DP{data}".format(**degrees)


def build_summary(trainer, model_config, data_args, eval_loss: Optional[float]) -> dict:
    """Collect the run's figures after training.

    tokens_per_card_per_sec = steps/s (this process, after the warm-up steps) x global tokens per
    step / world size, so every card of a tensor- or pipeline-parallel group is counted.
    ``num_params`` is the full model's (counted from the config, whatever the parallel degrees).
    ``mfu`` uses the PaLM FLOPs per token, ``mfu_nominal`` 6 x ``nominal_params``; both are null
    without a peak FLOP/s (see pretrain.hardware) or when no step ran after the warm-up.
    """
    args = trainer.args
    timer = trainer.step_timer
    seq_len = data_args.max_seq_length
    work = timer.work
    rates = timer.run_rates() if work else {}
    losses = trainer.loss_history.train
    degrees = parallel_degrees(args)
    batch_samples = global_batch_samples(
        args.per_device_train_batch_size, args.gradient_accumulation_steps, args.dataset_world_size
    )
    return {
        "global_step": trainer.state.global_step,
        "steps_run_this_process": timer.steps_run,
        "throughput_warmup_steps": args.throughput_warmup_steps,
        "train_loss_first": losses[0][1] if losses else None,
        "train_loss_last": losses[-1][1] if losses else None,
        "eval_loss": eval_loss,
        "ln_vocab_size": math.log(model_config.vocab_size),
        "vocab_size": model_config.vocab_size,
        "seq_length": seq_len,
        "precision": precision(args),
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "global_batch_samples": batch_samples,
        "global_batch_tokens": batch_samples * seq_len,
        "train_tokens": batch_samples * seq_len * timer.steps_run,
        "world_size": args.world_size,
        "parallel_degrees": degrees,
        "parallel_strategy": parallel_strategy(degrees),
        "samples_per_sec": rates.get("samples_per_sec"),
        "tokens_per_sec": rates.get("tokens_per_sec"),
        "tokens_per_card_per_sec": rates.get("tokens_per_card_per_sec"),
        "num_params": count_config_parameters(model_config)[0],
        "model_flops_per_token": flops.model_flops_per_token(model_config, seq_len),
        "nominal_params": args.nominal_params,
        "peak_flops_per_card": work.peak.flops_per_sec if work and work.peak else None,
        "peak_flops_source": work.peak.source if work and work.peak else None,
        "mfu": rates.get("mfu"),
        "mfu_nominal": rates.get("mfu_nominal"),
        **peak_memory_gib(),
    }


def write_summary(summary: dict, output_dir: str) -> str:
    """Log the summary and write it to ``<output_dir>/run_summary.json`` (atomically); return the path."""
    logger.info("run summary:\n%s", json.dumps(summary, indent=2))
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "run_summary.json")
    with atomic_outputs(path) as (tmp_path,):
        with open(tmp_path, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
    return path
