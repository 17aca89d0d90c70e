"""Per-step losses as the Trainer logs them, kept and written to ``<output_dir>/loss_history.json``.

paddlenlp's ``Trainer.log()`` clears ``state.log_history`` at every log, so the losses are caught
here, in ``on_log``. The file format is ``pretrain.loss_curves``'s (read by tools/compare_loss.py
and tools/benchmark.py). A train entry is the mean loss over the ``logging_steps`` steps ending at
``global_step`` (one step when logging_steps is 1), averaged over the data-parallel ranks. The
file is rewritten atomically at each checkpoint, after each evaluation and at the end of training.
A resumed run reads it back, keeping the entries up to the step it resumes from.
"""

from __future__ import annotations

import json
import os

from paddlenlp.trainer import TrainerCallback

from pretrain.atomic import atomic_outputs
from pretrain.loss_curves import LOSS_HISTORY_FILE, read_loss_history


class LossHistory(TrainerCallback):
    """Keeps ``[(global_step, loss)]`` for training (per logging interval) and evaluation."""

    def __init__(self):
        self.train = []
        self.eval = []

    def on_train_begin(self, args, state, control, **kwargs):
        path = os.path.join(args.output_dir, LOSS_HISTORY_FILE)
        if state.global_step > 0 and os.path.isfile(path):  # resuming: keep what led to this step
            history = read_loss_history(path)
            self.train = [entry for entry in history["train"] if entry[0] <= state.global_step]
            self.eval = [entry for entry in history["eval"] if entry[0] <= state.global_step]

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        if "loss" in logs:
            self.train.append((state.global_step, float(logs["loss"])))
        if "eval_loss" in logs:
            self.eval.append((state.global_step, float(logs["eval_loss"])))

    def on_save(self, args, state, control, **kwargs):
        self.write(args)

    def on_evaluate(self, args, state, control, **kwargs):
        self.write(args)

    def on_train_end(self, args, state, control, **kwargs):
        self.write(args)

    def write(self, args) -> None:
        """Write ``<output_dir>/loss_history.json`` atomically, on the process that saves (rank 0)."""
        if not args.should_save:
            return
        os.makedirs(args.output_dir, exist_ok=True)
        with atomic_outputs(os.path.join(args.output_dir, LOSS_HISTORY_FILE)) as (tmp_path,):
            with open(tmp_path, "w", encoding="utf-8") as f:
                json.dump({"train": self.train, "eval": self.eval}, f)
