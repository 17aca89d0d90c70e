"""The end-of-run report: printed and written to ``<output_dir>/run_summary.json``.

Units are in the key names: tokens, seconds, GiB (2**30 bytes), FLOP/s; ``mfu`` is a fraction.
"""

from __future__ import annotations

import json
import math
import os
import resource
from typing import Optional

import paddle

from pretrain import flops
from pretrain.log import logger
from pretrain.throughput import global_tokens_per_step

GIB = 2**30


def peak_memory_gib() -> dict:
    """Peak memory of this process's card: GPU max allocated/reserved, or CPU peak RSS.

    Returns:
        ``{"peak_memory_gib": float, "peak_memory_kind": str}`` plus ``peak_memory_reserved_gib``
        on GPU. On CPU the figure is the process's peak resident set size (``ru_maxrss``, KiB on Linux).
    """
    if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
        return {
            "peak_memory_gib": paddle.device.cuda.max_memory_allocated() / GIB,
            "peak_memory_reserved_gib": paddle.device.cuda.max_memory_reserved() / GIB,
            "peak_memory_kind": "gpu_max_allocated",
        }
    return {
        "peak_memory_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB,
        "peak_memory_kind": "cpu_peak_rss",
    }


def build_summary(trainer, model_config, data_args, num_params: int, num_embedding_params: int,
                  eval_loss: Optional[float]) -> dict:
    """Collect the run's figures after training.

    tokens_per_card_per_sec = steps/s (this process, after the first step) x global tokens per
    step / world size, so every card of a tensor- or pipeline-parallel group is counted.
    MFU uses ``flops.flops_per_token`` (PaLM) and ``peak_flops_per_card``; null when that is unset.
    """
    args = trainer.args
    seq_len = data_args.max_seq_length
    tokens_per_step = global_tokens_per_step(
        args.per_device_train_batch_size, args.gradient_accumulation_steps, args.dataset_world_size, seq_len
    )
    timer = trainer.step_timer
    steps_per_sec = timer.steps_per_second(warmup_steps=1)
    tokens_per_card_per_sec = None if steps_per_sec is None else steps_per_sec * tokens_per_step / args.world_size

    head_dim = model_config.hidden_size // model_config.num_attention_heads
    model_flops_per_token = flops.flops_per_token(
        num_params - num_embedding_params, model_config.num_hidden_layers, model_config.num_attention_heads,
        head_dim, seq_len,
    )
    mfu = None
    if tokens_per_card_per_sec is not None and args.peak_flops_per_card:
        mfu = flops.mfu(tokens_per_card_per_sec, model_flops_per_token, args.peak_flops_per_card)

    losses = trainer.loss_history.train
    summary = {
        "global_step": trainer.state.global_step,
        "steps_run_this_process": timer.steps_run,
        "train_loss_first": losses[0][1] if losses else None,
        "train_loss_last": losses[-1][1] if losses else None,
        "eval_loss": eval_loss,
        "ln_vocab_size": math.log(model_config.vocab_size),
        "vocab_size": model_config.vocab_size,
        "seq_length": seq_len,
        "global_batch_tokens": tokens_per_step,
        "train_tokens": tokens_per_step * timer.steps_run,
        "world_size": args.world_size,
        "tokens_per_card_per_sec": tokens_per_card_per_sec,
        "num_params": num_params,
        "model_flops_per_token": model_flops_per_token,
        "peak_flops_per_card": args.peak_flops_per_card,
        "mfu": mfu,
        **peak_memory_gib(),
    }
    return summary


def write_summary(summary: dict, output_dir: str) -> str:
    """Log the summary and write it to ``<output_dir>/run_summary.json`` (atomically); return the path."""
    logger.info("run summary:\n%s", json.dumps(summary, indent=2))
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "run_summary.json")
    tmp_path = path + ".tmp"
    with open(tmp_path, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    os.replace(tmp_path, path)
    return path
