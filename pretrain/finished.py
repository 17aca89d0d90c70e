"""A finished run is left as it is: rerunning it (or restarting it after a kill during its last writes)
never trains past ``max_steps`` nor rewrites its outputs.

A run is finished when the checkpoint it would resume from is at ``max_steps`` (or beyond) and
``output_dir`` holds the ``run_summary.json`` of that step: the summary is written last, after the
final model, the final evaluation and (fine-tuning) the merged model, so its presence means every
output is complete. Without it (killed during the final save, the merge or the summary) the run
restarts from that checkpoint, trains nothing, and writes what is missing.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import paddle.distributed as dist

from pretrain import checkpoint
from pretrain.log import logger
from pretrain.metrics.summary import SUMMARY_FILE


def _local_verdict(plan) -> Optional[dict]:
    args = plan.training_args
    if not args.do_train or plan.resume_checkpoint is None:
        return None
    step = checkpoint.step_of(plan.resume_checkpoint)
    if step < args.max_steps:
        return None
    try:
        with open(os.path.join(args.output_dir, SUMMARY_FILE), encoding="utf-8") as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and summary.get("global_step") == step else None


def finished_summary(plan) -> Optional[dict]:
    """The summary of the finished run in ``plan``'s output_dir, or None when there is training or writing left.

    Global rank 0's verdict holds on every rank (a collective call under a launcher): only it writes
    the summary. When finished, one line says so.
    """
    summary = _local_verdict(plan)
    if plan.layout.world_size > 1:
        verdicts = []
        dist.all_gather_object(verdicts, summary)
        summary = verdicts[0]
    if summary is not None:
        logger.info(
            "%s already finished at step %d (max_steps %d): nothing to train, its outputs are left as they are; "
            "raise max_steps to train on, or set overwrite_output_dir true to start again",
            plan.training_args.output_dir,
            summary["global_step"],
            plan.training_args.max_steps,
        )
    return summary
