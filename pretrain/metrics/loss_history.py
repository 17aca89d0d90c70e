"""Per-step losses as the Trainer logs them, kept with each checkpoint and in ``<output_dir>/loss_history.json``.

paddlenlp's ``Trainer.log()`` clears ``state.log_history`` at every log, so the losses are caught
here, in ``on_log``. The file format is ``pretrain.metrics.loss_curves``'s (read by tools/compare_loss.py
and tools/benchmark.py). A train entry is the mean loss over the ``logging_steps`` steps ending at
``global_step`` (one step when logging_steps is 1), averaged over the data-parallel ranks.

The history up to a checkpoint's step is saved inside that checkpoint (``write`` by the trainer,
before the completion marker, so it is covered by the marker's checksums); a resumed run starts
from the history of the checkpoint it resumes from (``restore``), so its history equals an
uninterrupted run's whatever happened to the top-level file. The top-level file is rewritten
atomically after each checkpoint and evaluation and at the end of training.
"""

from __future__ import annotations

import os
from typing import Optional

from paddlenlp.trainer import TrainerCallback

from pretrain.atomic import write_json
from pretrain.errors import UserError
from pretrain.log import logger
from pretrain.metrics.loss_curves import LOSS_HISTORY_FILE, read_loss_history


class LossHistory(TrainerCallback):
    """Keeps ``[(global_step, loss)]`` for training (per logging interval) and evaluation, the global
    steps whose update was skipped (``skipped``: nan_policy or loss_spike_policy skip, a skipped data
    window; a logging interval made only of skipped steps has no train entry), and
    ``[(global_step, hash)]`` of the samples of every optimizer step (``pretrain.sample_log``)."""

    def __init__(self):
        self.train = []
        self.eval = []
        self.skipped = []
        self.samples = []

    def record_skipped(self, step: int) -> None:
        """Record global step ``step``, whose optimizer update was not applied (once)."""
        if step not in self.skipped:
            self.skipped.append(step)

    def mark_skipped(self, logs: dict, first: int, last: int) -> dict:
        """paddlenlp's training log record of steps ``first``..``last``, with the count of those whose update was
        skipped (``skipped_steps``) and without ``loss`` when every one was (paddlenlp's would be 0.0)."""
        skipped = [step for step in self.skipped if step >= first]
        if skipped:
            logs = {**logs, "skipped_steps": len(skipped)}
        if len(skipped) == last - first + 1:
            logs = {key: value for key, value in logs.items() if key != "loss"}
        return logs

    def restore(self, checkpoint_folder: Optional[str]) -> None:
        """Start from the history saved in ``checkpoint_folder`` (None: a fresh start, no history).

        A checkpoint saved without one (by an earlier version) restores nothing, with a warning.

        Raises:
            UserError: the checkpoint's history is not in the loss_history.json format.
        """
        self.train, self.eval, self.skipped, self.samples = [], [], [], []
        if checkpoint_folder is None:
            return
        path = os.path.join(checkpoint_folder, LOSS_HISTORY_FILE)
        if not os.path.isfile(path):
            logger.warning("%s holds no %s: the loss history starts at its step", checkpoint_folder, LOSS_HISTORY_FILE)
            return
        try:
            history = read_loss_history(path)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(
                f"{path} is not a loss history ({e!r}); resume from another checkpoint with resume_from_checkpoint"
            ) from e
        self.train, self.eval = history["train"], history["eval"]
        self.skipped, self.samples = history["skipped"], history["samples"]

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        if "loss" in logs:
            self.train.append((state.global_step, float(logs["loss"])))
        if "eval_loss" in logs:
            self.eval.append((state.global_step, float(logs["eval_loss"])))

    def on_save(self, args, state, control, **kwargs):
        self.write_run_copy(args)

    def on_evaluate(self, args, state, control, **kwargs):
        self.write_run_copy(args)

    def on_train_end(self, args, state, control, **kwargs):
        self.write_run_copy(args)

    def write_run_copy(self, args) -> None:
        """Write ``<output_dir>/loss_history.json`` on the process that saves (rank 0)."""
        if args.should_save:
            self.write(args.output_dir)

    def write(self, folder: str) -> None:
        """Write ``folder/loss_history.json`` atomically (the folder is created if needed)."""
        os.makedirs(folder, exist_ok=True)
        history = {"train": self.train, "eval": self.eval, "samples": self.samples}
        if self.skipped:  # additive: readers of the train and eval keys are unaffected
            history["skipped"] = self.skipped
        write_json(os.path.join(folder, LOSS_HISTORY_FILE), history)
