"""Loss-spike recovery: detect a spiking step, judge checkpoints healthy or suspect, and decide to skip
the step or roll back (``loss_spike_policy``).

Megatron-LM flags a loss or gradient norm 10x larger than expected (``is_unexpectedly_large``,
threshold 10) and can re-run the step; PaLM restarted "from a checkpoint roughly 100 steps before the
spike started" and skipped "roughly 200-500 data batches" (arXiv:2204.02311, section 5.1), by hand.
Here, once per optimizer step and from values every rank agrees on (``pretrain.nan_guard`` all-reduces
them with its verdict), a ``SpikeWatch``:

- keeps exponential moving averages (``EMA_DECAY``) of the step's loss and gradient norm over healthy
  steps; a step *spikes* when either exceeds ``spike_factor`` x its average, or the gradient norm
  falls below its average / ``spike_factor`` (vanishing: the logits overflowed), non-finite values
  always; during the first ``spike_warmup_steps`` healthy steps only the gradient norm is judged,
  against the largest and smallest so far (the averages are not settled yet);
- decides: ``none`` (log the event, train on: the run is *in trouble* until ``spike_warmup_steps``
  healthy steps in a row), ``skip`` (the optimizer step is not applied: weights, Adam moments and the LR
  schedule stay as they were; at most ``max_skipped_steps`` in a row) or ``rollback`` (back to the last
  healthy checkpoint, skipping the batches from there to at least the spiking one: paddlenlp's
  ``skip_data_intervals`` semantics, the LR scaled by ``rollback_lr_factor``; at most ``max_rollbacks``);
- judges checkpoints: the weights of a checkpoint saved at step s are *healthy* once step s + 1 ran on
  them without a spike while the run was not in trouble; the newest healthy one is ``last_good_step``,
  which rotation keeps and which the divergence stop names (a checkpoint whose weights have already
  blown up is never confirmed: the next step's gradient norm or loss spikes);
- records every event (step, kind, values, the batch's sample positions, action) and the state above in
  ``recovery.json`` inside each checkpoint, so a resumed run makes the same decisions; a rollback not yet
  followed by a checkpoint is kept in ``<output_dir>/rollback.json`` so a restart repeats it.
"""

from __future__ import annotations

import json
import math
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Optional

from paddlenlp.trainer import TrainerCallback

from pretrain.atomic import write_json
from pretrain.errors import UserError
from pretrain.log import logger
from pretrain.lr_schedule import scale_lr_schedule
from pretrain.upstream import verified

LOSS_SPIKE_POLICIES = ("none", "skip", "rollback")
EMA_DECAY = 0.9  # weight of the previous average: about the last 10 healthy steps
INJECTED_SPIKE_FACTOR = 1000.0  # debug_inject_spike_at_step multiplies that batch's loss by this
RECOVERY_FILE = "recovery.json"  # in each checkpoint
PENDING_ROLLBACK_FILE = "rollback.json"  # in output_dir, from a rollback until the next checkpoint
DIVERGED_EXIT_STATUS = 3  # a run that ended without recovering from its loss spikes (pretrain.errors.RunDiverged)


class SpikeStopError(UserError):
    """The loss spike policy gives up: too many skipped steps in a row, or too many rollbacks."""


class RollbackRequested(Exception):  # noqa: N818 -- a request the trainer acts on, not an error
    """Raised from inside paddlenlp's loop; the trainer goes back to ``checkpoint_step`` (see ``SpikeWatch``)."""

    def __init__(self, checkpoint_step: int):
        super().__init__(f"roll back to checkpoint-{checkpoint_step}")
        self.checkpoint_step = checkpoint_step


@dataclass
class RecoveryState:
    """What a resumed run needs to decide as the uninterrupted one would (JSON in each checkpoint)."""

    ema_loss: Optional[float] = None
    ema_grad_norm: Optional[float] = None
    max_grad_norm: Optional[float] = None  # over healthy steps: the bounds during the warm-up
    min_grad_norm: Optional[float] = None
    healthy_steps: int = 0  # steps that did not spike, since the start
    trouble_healthy_steps: Optional[int] = None  # None: not in trouble; else healthy steps since the last spike
    skipped_in_a_row: int = 0
    unconfirmed_step: Optional[int] = None  # the last checkpoint's step, healthy once the next step is
    last_good_step: Optional[int] = None
    skip_windows: list = field(default_factory=list)  # [[first, last]] global steps, paddlenlp skip_data_intervals
    rollbacks: int = 0
    lr_factor: float = 1.0
    skipped_steps: list = field(default_factory=list)  # steps whose update was skipped by the policy
    events: list = field(default_factory=list)  # one dict per spike or non-finite step


class SpikeWatch(TrainerCallback):
    """Per-step spike verdicts and checkpoint health for one run (identical on every rank); at the start
    of training it scales the loaded LR schedule by the rollbacks' ``lr_factor``.

    Args:
        args: the run's TrainingArguments (``loss_spike_policy``, ``spike_factor``, ``spike_warmup_steps``,
            ``max_skipped_steps``, ``rollback_skip_batches``, ``rollback_lr_factor``, ``max_rollbacks``).
        global_batch_samples: samples per optimizer step, all ranks (the event's sample positions).
    """

    def __init__(self, args, global_batch_samples: int):
        self.args = args
        self.policy = args.loss_spike_policy
        self.global_batch_samples = global_batch_samples
        self.state = RecoveryState()

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        if self.state.lr_factor != 1.0 and lr_scheduler is not None:
            scale_lr_schedule(lr_scheduler, args, self.state.lr_factor)

    # -- the verdict of one step -------------------------------------------------------------------

    def spike_reason(self, loss: float, grad_norm: Optional[float]) -> Optional[str]:
        """Why a step with this mean loss and gradient norm spikes, or None.

        Non-finite values always spike. Until ``spike_warmup_steps`` healthy steps have set the moving
        averages, only a gradient norm above ``spike_factor`` x the largest so far, or below the smallest
        so far / ``spike_factor``, does (the loss of a few small batches is too noisy to judge; a blow-up
        shows in the gradients first, and a network whose logits overflowed has vanishing gradients);
        after them, a loss above ``spike_factor`` x its moving average, or a gradient norm above or below
        its moving average by that factor.
        """
        s, factor = self.state, self.args.spike_factor
        if not math.isfinite(loss):
            return "non-finite loss"
        if grad_norm is not None and not math.isfinite(grad_norm):
            return "non-finite gradients"
        if grad_norm is not None and s.ema_grad_norm is not None:
            high, low, what = s.ema_grad_norm, s.ema_grad_norm, "its moving average"
            if not self._warmed_up:
                assert s.max_grad_norm is not None and s.min_grad_norm is not None  # set with ema_grad_norm
                high, low, what = s.max_grad_norm, s.min_grad_norm, "the largest so far"
            if grad_norm > factor * high:
                return f"gradient norm {grad_norm:.4g} > {factor:g} x {what} {high:.4g}"
            what = what.replace("largest", "smallest")
            if grad_norm < low / factor:
                return f"gradient norm {grad_norm:.4g} < {what} {low:.4g} / {factor:g} (vanishing)"
        if self._warmed_up and loss > factor * s.ema_loss:
            return f"loss {loss:.4g} > {factor:g} x its moving average {s.ema_loss:.4g}"
        return None

    def judge(self, step: int, loss: float, grad_norm: Optional[float], reason: Optional[str]) -> str:
        """The action for optimizer step ``step`` (1-based) given its agreed mean loss and gradient norm and
        the non-finite reason (None when finite): "train" (healthy), "none" (a spike left alone, or a
        non-finite step handed to nan_policy), "skip" or "rollback".

        Raises:
            SpikeStopError: more than ``max_skipped_steps`` skips in a row, or more than ``max_rollbacks``.
        """
        s = self.state
        reason = reason or self.spike_reason(loss, grad_norm)
        if reason is None:
            self._healthy(step, loss, grad_norm)
            return "train"
        s.unconfirmed_step = None  # the weights of the last checkpoint led to this step: not confirmed
        action = self.policy
        event: dict = {
            "step": step,
            "reason": reason,
            "loss": loss if math.isfinite(loss) else str(loss),
            "grad_norm": grad_norm if grad_norm is None or math.isfinite(grad_norm) else str(grad_norm),
            "ema_loss": s.ema_loss,
            "ema_grad_norm": s.ema_grad_norm,
            "samples": [(step - 1) * self.global_batch_samples, step * self.global_batch_samples],
            "action": "nan_policy" if action == "none" and reason.startswith("non-finite") else action,
        }
        if action == "skip":
            if s.skipped_in_a_row >= self.args.max_skipped_steps:
                raise SpikeStopError(self._stop_message(step, reason, f"{s.skipped_in_a_row} steps skipped in a row"))
            s.skipped_in_a_row += 1
            s.skipped_steps.append(step)
        elif action == "rollback":
            if s.rollbacks >= self.args.max_rollbacks:
                raise SpikeStopError(self._stop_message(step, reason, f"after {s.rollbacks} rollbacks"))
            target = s.last_good_step if s.last_good_step is not None else 0
            window = [target + 1, max(step, target + self.args.rollback_skip_batches)]
            s.rollbacks += 1
            s.lr_factor *= self.args.rollback_lr_factor
            s.skip_windows.append(window)
            event.update(rolled_back_to=target, skipped_batches=window, lr_factor=s.lr_factor)
        else:
            s.trouble_healthy_steps = 0  # the update is applied: later checkpoints are suspect for a while
        s.events.append(event)
        if action == "none" and reason.startswith("non-finite"):
            return action  # nan_policy decides and speaks
        logger.warning(
            "loss spike at step %d: %s (samples %d-%d); %s",
            step,
            reason,
            event["samples"][0],
            event["samples"][1] - 1,
            self._describe(action, event),
        )
        return action

    @property
    def _warmed_up(self) -> bool:
        return self.state.healthy_steps >= self.args.spike_warmup_steps

    def _healthy(self, step: int, loss: float, grad_norm: Optional[float]) -> None:
        s = self.state
        s.healthy_steps += 1
        s.skipped_in_a_row = 0
        s.ema_loss = loss if s.ema_loss is None else EMA_DECAY * s.ema_loss + (1 - EMA_DECAY) * loss
        if grad_norm is not None:
            ema = s.ema_grad_norm
            s.ema_grad_norm = grad_norm if ema is None else EMA_DECAY * ema + (1 - EMA_DECAY) * grad_norm
            s.max_grad_norm = grad_norm if s.max_grad_norm is None else max(s.max_grad_norm, grad_norm)
            s.min_grad_norm = grad_norm if s.min_grad_norm is None else min(s.min_grad_norm, grad_norm)
        if s.trouble_healthy_steps is not None:
            s.trouble_healthy_steps += 1
            if s.trouble_healthy_steps >= self.args.spike_warmup_steps:
                s.trouble_healthy_steps = None
        if s.unconfirmed_step == step - 1 and s.trouble_healthy_steps is None:
            s.last_good_step = s.unconfirmed_step
        s.unconfirmed_step = None

    def _describe(self, action: str, event: dict) -> str:
        if action == "skip":
            return f"its update is skipped ({self.state.skipped_in_a_row} in a row, loss_spike_policy skip)"
        if action == "rollback":
            first, last = event["skipped_batches"]
            return (
                f"rolling back to checkpoint-{event['rolled_back_to']} and skipping the batches of steps "
                f"{first}-{last}, learning rate x {event['lr_factor']:g} (rollback {self.state.rollbacks} of at most "
                f"{self.args.max_rollbacks})"
            )
        return "left alone (loss_spike_policy none)"

    def _stop_message(self, step: int, reason: str, why: str) -> str:
        return (
            f"loss spike at step {step} ({reason}), {why}: loss_spike_policy {self.policy} gives up; "
            f"{self.healthy_checkpoint_text()}. Lower learning_rate or raise warmup_steps, "
            f"max_skipped_steps or max_rollbacks, and {self.restart_advice()}"
        )

    # -- checkpoints ---------------------------------------------------------------------------------

    def on_checkpoint(self, step: int) -> None:
        """A checkpoint of step ``step`` is being saved: healthy once the next step is (never while in trouble)."""
        self.state.unconfirmed_step = step if self.state.trouble_healthy_steps is None else None

    def mark_initial_checkpoint(self) -> None:
        """checkpoint-0 (the initial weights, saved for ``rollback``) is healthy by definition."""
        self.state.last_good_step = 0

    def healthy_checkpoint_text(self) -> str:
        """``the last healthy checkpoint is checkpoint-N`` or that there is none."""
        step = self.state.last_good_step
        if step is None:
            return "no checkpoint is known to be healthy (none was followed by a step without a spike)"
        return f"the last healthy checkpoint is {os.path.join(self.args.output_dir, f'checkpoint-{step}')}"

    def restart_advice(self) -> str:
        """How to restart from the last healthy checkpoint (a plain restart resumes the newest complete one)."""
        folder = self.healthy_checkpoint()
        if folder is None:
            return "restart from scratch with overwrite_output_dir true"
        return f"restart with resume_from_checkpoint {folder}"

    def healthy_checkpoint(self) -> Optional[str]:
        """The folder of the last healthy checkpoint, or None."""
        step = self.state.last_good_step
        return None if step is None else os.path.join(self.args.output_dir, f"checkpoint-{step}")

    def write(self, folder: str) -> None:
        """Write the state to ``folder/recovery.json`` atomically."""
        write_json(os.path.join(folder, RECOVERY_FILE), asdict(self.state), indent=1)

    def restore(self, checkpoint_folder: Optional[str]) -> None:
        """Start from the state in ``checkpoint_folder`` (None, or a checkpoint without one: a fresh state),
        or from the pending rollback of ``output_dir`` when it goes back to that checkpoint.

        Raises:
            UserError: the file is not a recovery state.
        """
        self.state = RecoveryState()
        if checkpoint_folder is None:
            return
        pending = os.path.join(self.args.output_dir, PENDING_ROLLBACK_FILE)
        saved = _read_json(pending)
        if saved is not None and os.path.basename(os.path.normpath(checkpoint_folder)) == saved.get("checkpoint"):
            logger.info("repeating the rollback recorded in %s", pending)
            self._load(saved["state"], pending)
            return
        saved = _read_json(os.path.join(checkpoint_folder, RECOVERY_FILE))
        if saved is not None:
            self._load(saved, os.path.join(checkpoint_folder, RECOVERY_FILE))

    def _load(self, saved: dict, path: str) -> None:
        try:
            self.state = RecoveryState(**saved)
        except TypeError as e:
            raise UserError(f"{path} is not a recovery state ({e}); resume from another checkpoint") from None

    def record_rollback(self, checkpoint_step: int) -> None:
        """Write ``<output_dir>/rollback.json`` (the checkpoint gone back to and the state to resume with)."""
        path = os.path.join(self.args.output_dir, PENDING_ROLLBACK_FILE)
        write_json(path, {"checkpoint": f"checkpoint-{checkpoint_step}", "state": asdict(self.state)}, indent=1)

    def unrecovered(self, step: int) -> Optional[str]:
        """Why a run that ended at optimizer step ``step`` never recovered from its loss spikes, or None: it is
        still *in trouble* (its last spike left alone was followed by fewer than ``spike_warmup_steps`` healthy
        steps in a row), so its final weights carry updates of spiking steps that nothing has since shown sound."""
        s = self.state
        if s.trouble_healthy_steps is None:
            return None
        left_alone = [event for event in s.events if event["action"] == "none"]
        last = left_alone[-1]
        return (
            f"the loss never recovered: {len(s.events)} loss spike(s) in {step} steps, the last at step "
            f"{last['step']} ({last['reason']}), then {s.trouble_healthy_steps} healthy step(s) of the "
            f"{self.args.spike_warmup_steps} in a row (spike_warmup_steps) that end a trouble; the final model in "
            f"{self.args.output_dir} holds those updates; {self.healthy_checkpoint_text()}. Lower learning_rate "
            f"or raise warmup_steps, or set loss_spike_policy skip or rollback, and {self.restart_advice()}"
        )

    def summary(self, step: int) -> dict:
        """The run-summary keys: skipped steps, rollbacks, skipped windows, events and, for a run ending at
        optimizer step ``step``, ``diverged`` (``unrecovered``: null when the loss recovered or never spiked)."""
        s = self.state
        return {
            "diverged": self.unrecovered(step),
            "loss_spike_policy": self.policy,
            "spike_skipped_steps": list(s.skipped_steps),
            "rollbacks": s.rollbacks,
            "rollback_skipped_batches": [list(window) for window in s.skip_windows],
            "loss_spike_events": list(s.events),
        }


@contextmanager
def pipeline_spike(pipeline_model):
    """Within the block, every loss function of paddle's ``PipelineParallel`` ``pipeline_model`` returns its loss
    x ``INJECTED_SPIKE_FACTOR`` (``debug_inject_spike_at_step`` under pipeline parallelism).

    paddle 3.3.1's pipeline schedules compute the loss on the last stage as
    ``pipeline_model._layers._loss_fn[i](output, labels)`` (``PipelineParallel._maybe_loss_compute``, then
    divided by the accumulation steps), and paddlenlp 3.0.0b4's ``training_pipeline_step`` runs them without
    the Trainer's ``compute_loss``, where the injection of the other layouts is; the scaled loss is what the
    backward and the returned mean see, as there. (The overlapped schedule builds nodes from the loss layers
    instead of calling them: not covered.)
    """
    verified("pipeline-injected-spike")  # applied on any version: at most a warning
    layers = pipeline_model._layers
    originals = layers._loss_fn

    def scaled(loss_fn):
        return lambda output, labels: loss_fn(output, labels) * INJECTED_SPIKE_FACTOR

    layers._loss_fn = [None if loss_fn is None else scaled(loss_fn) for loss_fn in originals]
    try:
        yield
    finally:
        layers._loss_fn = originals


def clear_pending_rollback(output_dir: str) -> None:
    """Delete ``<output_dir>/rollback.json`` once a checkpoint after the rollback holds its state."""
    try:
        os.remove(os.path.join(output_dir, PENDING_ROLLBACK_FILE))
    except FileNotFoundError:
        pass


def _read_json(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is unreadable ({e}); delete it and resume from another checkpoint") from None
    return value if isinstance(value, dict) else None
