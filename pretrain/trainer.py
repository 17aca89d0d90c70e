"""The PaddleNLP Trainer, specialised for pretraining.

Differences from ``paddlenlp.trainer.Trainer``:
- samplers read the dataset in order: GPTDataset already shuffles, with its own seed, so a
  second shuffle would only break exact resume and data-parallel equivalence;
- the LR schedule is warmup + linear or cosine decay to ``min_learning_rate`` over ``decay_steps``;
- evaluation and checkpoint saving are excluded from the step timer behind tokens/card/s;
- every training log carries tokens/card/s, samples/s, MFU and peak memory (so ``report_to
  visualdl`` records them as scalars next to loss and learning rate).
"""

from __future__ import annotations

from paddle.io import DistributedBatchSampler
from paddlenlp.trainer import Trainer
from paddlenlp.transformers import (
    CosineAnnealingWithWarmupDecay,
    LinearAnnealingWithWarmupDecay,
)

from pretrain.errors import UserError
from pretrain.loss_history import LossHistory
from pretrain.memory import peak_memory_gib
from pretrain.throughput import StepTimer

SCHEDULERS = {"cosine": CosineAnnealingWithWarmupDecay, "linear": LinearAnnealingWithWarmupDecay}


class PretrainingTrainer(Trainer):
    """Trainer with in-order sampling, the pretraining LR schedule, a StepTimer and a LossHistory."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_timer = StepTimer()
        self.loss_history = LossHistory()
        self.add_callback(self.step_timer)
        self.add_callback(self.loss_history)

    def _sequential_sampler(self, dataset, batch_size: int):
        return DistributedBatchSampler(
            dataset,
            batch_size=batch_size,
            shuffle=False,
            num_replicas=self.args.dataset_world_size,
            rank=self.args.dataset_rank,
            drop_last=self.args.dataloader_drop_last,
        )

    def _get_train_sampler(self):
        return self._sequential_sampler(self.train_dataset, self.args.per_device_train_batch_size)

    def _get_eval_sampler(self, eval_dataset):
        return self._sequential_sampler(eval_dataset, self.args.per_device_eval_batch_size)

    def create_scheduler(self, num_training_steps: int):
        """Warmup then linear or cosine decay from learning_rate to min_learning_rate.

        Warmup steps: ``warmup_steps`` if > 0, else ``warmup_ratio x max_steps``. Decay ends at
        ``decay_steps`` (default ``max_steps``); the LR stays at min_learning_rate after it.
        """
        if self.lr_scheduler is None:
            schedule = str(getattr(self.args.lr_scheduler_type, "value", self.args.lr_scheduler_type))
            if schedule not in SCHEDULERS:
                raise UserError(
                    f"lr_scheduler_type '{schedule}' is not supported for pretraining; use one of {sorted(SCHEDULERS)}"
                )
            warmup = self.args.warmup_steps if self.args.warmup_steps > 0 else int(self.args.warmup_ratio * num_training_steps)
            decay = self.args.decay_steps if self.args.decay_steps is not None else num_training_steps
            self.lr_scheduler = SCHEDULERS[schedule](
                max_lr=self.args.learning_rate,
                min_lr=self.args.min_learning_rate,
                warmup_step=warmup,
                decay_step=decay,
                last_epoch=0,
            )
        return self.lr_scheduler

    def evaluate(self, *args, **kwargs):
        with self.step_timer.excluded():
            return super().evaluate(*args, **kwargs)

    def _save_checkpoint(self, *args, **kwargs):
        with self.step_timer.excluded():
            return super()._save_checkpoint(*args, **kwargs)

    def log(self, logs: dict, **kwargs) -> None:
        """Add the interval's throughput, MFU and peak memory to a training log, then log it.

        Evaluation logs (no ``loss`` key) pass through unchanged.
        """
        if "loss" in logs:
            logs.update(self.step_timer.interval_rates())
            logs.update({key: value for key, value in peak_memory_gib().items() if isinstance(value, float)})
        super().log(logs, **kwargs)
