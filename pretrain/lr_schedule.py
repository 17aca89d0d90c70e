"""The pretraining learning-rate schedule: linear warm-up, then linear or cosine decay to a floor, or
a constant rate (with or without a warm-up).

``linear`` and ``cosine`` are paddlenlp's ``LinearAnnealingWithWarmupDecay`` and
``CosineAnnealingWithWarmupDecay`` (the schedulers of upstream PaddleNLP's run_pretrain.py): the LR
rises linearly from 0 to ``learning_rate`` over the warm-up steps, then decays to
``min_learning_rate`` at ``decay_steps`` and stays there. A warm-up longer than the run is fine:
the published benchmark cases measure 100 steps inside a 2000-step warm-up, and the LR simply
never leaves it.

``constant`` and ``constant_with_warmup`` are paddlenlp's (and Hugging Face's) schedules of those
names: ``learning_rate`` at every step, after the same linear warm-up for the second; the first
ignores ``warmup_steps``, and both ignore ``min_learning_rate`` and ``decay_steps``. These four are
the choices ``run_pretrain.py --help`` offers for ``lr_scheduler_type``.
"""

from __future__ import annotations

from typing import Optional

from paddlenlp.trainer.trainer_utils import get_constant_schedule, get_constant_schedule_with_warmup
from paddlenlp.transformers import CosineAnnealingWithWarmupDecay, LinearAnnealingWithWarmupDecay

from pretrain.enums import plain


def _constant(max_lr: float, min_lr: float, warmup_step: int, decay_step: int, last_epoch: int):
    return get_constant_schedule(max_lr, last_epoch=last_epoch)


def _constant_with_warmup(max_lr: float, min_lr: float, warmup_step: int, decay_step: int, last_epoch: int):
    return get_constant_schedule_with_warmup(max_lr, warmup_step, last_epoch=last_epoch)


# lr_scheduler_type -> a constructor taking (max_lr, min_lr, warmup_step, decay_step, last_epoch) by keyword.
SCHEDULERS = {
    "cosine": CosineAnnealingWithWarmupDecay,
    "linear": LinearAnnealingWithWarmupDecay,
    "constant": _constant,
    "constant_with_warmup": _constant_with_warmup,
}


def scheduler_name(training_args) -> str:
    """``lr_scheduler_type`` as a plain string (paddlenlp parses it into an enum)."""
    return str(plain(training_args.lr_scheduler_type))


def schedule_steps(training_args, max_steps: Optional[int] = None) -> tuple:
    """``(warmup, decay)`` optimizer steps of the schedule (of a run of ``max_steps`` steps, by default
    the run's own).

    warmup = ``warmup_steps`` if > 0, else ``int(warmup_ratio x max_steps)``;
    decay = ``decay_steps`` (the step at which the LR reaches min_learning_rate), default ``max_steps``.
    """
    args = training_args
    max_steps = args.max_steps if max_steps is None else max_steps
    warmup = args.warmup_steps if args.warmup_steps > 0 else int(args.warmup_ratio * max_steps)
    decay = args.decay_steps if args.decay_steps is not None else max_steps
    return warmup, decay


def describe_schedule(training_args) -> str:
    """The schedule in words, e.g. ``lr 0.002, 10 warm-up steps, cosine to 0.0002 at step 120``; a warm-up
    that reaches past the decay steps (the published benchmark cases measure 100 steps inside a
    2000-step warm-up) is said as such, with the rate the run ends at."""
    args, name = training_args, scheduler_name(training_args)
    warmup, decay = schedule_steps(training_args)
    warmup_words = f", {warmup} warm-up steps" if warmup and name != "constant" else ""
    if name.startswith("constant"):
        return f"lr {args.learning_rate:g} constant{warmup_words}"
    if warmup >= decay:  # paddlenlp's schedules: the warm-up runs to its end, then min_learning_rate
        words = f"lr {args.learning_rate:g}{warmup_words}, no {name} decay (decay ends at step {decay})"
        if args.max_steps < warmup:
            reached = args.learning_rate * args.max_steps / warmup
            return f"{words}: the run's {args.max_steps} steps end inside the warm-up, at lr {reached:.3g}"
        return f"{words}: lr {args.min_learning_rate:g} after step {warmup}"
    return f"lr {args.learning_rate:g}{warmup_words}, {name} to {args.min_learning_rate:g} at step {decay}"


def create_lr_scheduler(training_args, max_steps: Optional[int] = None, last_epoch: int = 0):
    """The paddle ``LRScheduler`` of the run (``lr_scheduler_type`` must be a key of ``SCHEDULERS``:
    preflight refuses the others); ``max_steps`` and ``last_epoch`` only to ask what rate another
    run length gives at another step (``stretched_schedule``).

    Step 1 (the first optimizer step) trains at ``learning_rate / warmup`` with a warm-up, at
    ``learning_rate`` without one: every schedule starts at ``last_epoch`` 0, and step s trains at
    the rate of ``last_epoch`` s - 1.
    """
    warmup, decay = schedule_steps(training_args, max_steps)
    return SCHEDULERS[scheduler_name(training_args)](
        max_lr=training_args.learning_rate,
        min_lr=training_args.min_learning_rate,
        warmup_step=warmup,
        decay_step=decay,
        last_epoch=last_epoch,
    )


def stretched_schedule(training_args, step: int, saved_max_steps: int) -> Optional[str]:
    """The warning for resuming at optimizer ``step`` a run that was planned for ``saved_max_steps`` with a
    larger ``max_steps``, when its decay follows ``max_steps`` (no ``decay_steps``): the decay is
    stretched to the new end, so the rate at step + 1 is read off the new curve (a jump up when the old
    decay was over). None when nothing is stretched."""
    args, name = training_args, scheduler_name(training_args)
    if args.max_steps <= saved_max_steps or name.startswith("constant") or args.decay_steps is not None:
        return None
    before = create_lr_scheduler(args, saved_max_steps, step - 1).get_lr()
    old_next = create_lr_scheduler(args, saved_max_steps, step).get_lr()
    new_next = create_lr_scheduler(args, None, step).get_lr()
    return (
        f"max_steps: raised from {saved_max_steps} (the checkpoint's run) to {args.max_steps}, which stretches the "
        f"{name} decay to end at step {args.max_steps}: the learning rate goes from {before:.3g} at step {step} to "
        f"{new_next:.3g} at step {step + 1} ({old_next:.3g} on the old schedule); set decay_steps "
        f"{saved_max_steps} to keep the old one"
    )


def scale_lr_schedule(scheduler, training_args, factor: float) -> None:
    """Make ``scheduler`` (one of ``create_lr_scheduler``'s) run at ``factor`` x its learning rates from now
    on, in place (the optimizer holds this object): ``learning_rate`` and ``min_learning_rate`` are
    scaled, the step count is kept, and the current rate is recomputed (a loaded scheduler state
    holds the unscaled one)."""
    if hasattr(scheduler, "max_lr"):  # paddlenlp's linear and cosine schedules
        scheduler.max_lr = training_args.learning_rate * factor
        scheduler.min_lr = training_args.min_learning_rate * factor
    else:  # LambdaDecay: base_lr x a multiplier of the step
        scheduler.base_lr = training_args.learning_rate * factor
    scheduler.last_lr = scheduler.get_lr()
