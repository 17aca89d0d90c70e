"""The pretraining learning-rate schedule: linear warm-up, then linear or cosine decay to a floor.

paddlenlp's ``LinearAnnealingWithWarmupDecay`` and ``CosineAnnealingWithWarmupDecay`` (the
schedulers of upstream PaddleNLP's run_pretrain.py): the LR rises linearly from 0 to
``learning_rate`` over the warm-up steps, then decays to ``min_learning_rate`` at ``decay_steps``
and stays there. A warm-up longer than the run is fine: the published benchmark cases measure 100
steps inside a 2000-step warm-up, and the LR simply never leaves it.
"""

from __future__ import annotations

from paddlenlp.transformers import CosineAnnealingWithWarmupDecay, LinearAnnealingWithWarmupDecay

SCHEDULERS = {"cosine": CosineAnnealingWithWarmupDecay, "linear": LinearAnnealingWithWarmupDecay}


def scheduler_name(training_args) -> str:
    """``lr_scheduler_type`` as a plain string (paddlenlp parses it into an enum)."""
    return str(getattr(training_args.lr_scheduler_type, "value", training_args.lr_scheduler_type))


def schedule_steps(training_args) -> tuple:
    """``(warmup, decay)`` optimizer steps of the schedule.

    warmup = ``warmup_steps`` if > 0, else ``int(warmup_ratio x max_steps)``;
    decay = ``decay_steps`` (the step at which the LR reaches min_learning_rate), default ``max_steps``.
    """
    args = training_args
    warmup = args.warmup_steps if args.warmup_steps > 0 else int(args.warmup_ratio * args.max_steps)
    decay = args.decay_steps if args.decay_steps is not None else args.max_steps
    return warmup, decay


def create_lr_scheduler(training_args):
    """The paddle ``LRScheduler`` of the run (``lr_scheduler_type`` must be a key of ``SCHEDULERS``:
    preflight refuses the others)."""
    warmup, decay = schedule_steps(training_args)
    return SCHEDULERS[scheduler_name(training_args)](
        max_lr=training_args.learning_rate,
        min_lr=training_args.min_learning_rate,
        warmup_step=warmup,
        decay_step=decay,
        last_epoch=0,
    )
