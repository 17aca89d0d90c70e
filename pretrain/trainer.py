"""The PaddleNLP Trainer, specialised for pretraining.

Differences from ``paddlenlp.trainer.Trainer``:
- samplers read the dataset in order: GPTDataset already shuffles, with its own seed, so a
  second shuffle would only break exact resume and data-parallel equivalence; they are paddlenlp's
  ``DistributedBatchSampler``, which the Trainer moves straight to ``consumed_samples`` on resume
  instead of reading and discarding every batch already trained on;
- checkpoints are atomic and verified (``pretrain.checkpoint``): marked complete (sizes and
  checksums) after every rank has written, with the loss history inside, and old ones rotated only
  once every node has marked the new one; ``overwrite_output_dir`` first moves an earlier run's
  checkpoints aside;
- a nan/inf loss or gradient stops the run or skips the step, checked once per optimizer step,
  and non-finite weights are never saved (``pretrain.nan_guard``);
- each optimizer step's sample ids are taken off the batches and their rolling hash is kept in the
  loss history (``pretrain.sample_log``; ``step_sample_ids`` gives the step's ids so far);
- a stop request (SIGTERM, SIGUSR1, ``max_wall_time``) agreed by all ranks in the NaN guard's
  all-reduce saves ``checkpoint-<step>`` at the next step boundary and ends training
  (``pretrain.preemption``; the entry script then exits with ``EXIT_PREEMPTED``);
- a failure to read a sample ends the run with a UserError instead of a silent hang
  (``pretrain.data.CheckedDataset``);
- the LR schedule is warmup + linear or cosine decay to ``min_learning_rate`` over ``decay_steps``
  (``pretrain.lr_schedule``);
- evaluation and checkpoint saving are excluded from the step timer behind tokens/card/s;
- paddlenlp's phase timers run and feed ``pretrain.metrics.time_breakdown`` (per-step breakdown, goodput,
  ``time_history.json`` in each checkpoint) instead of printing every step; each save logs its duration;
- every training log carries tokens/card/s, samples/s, MFU, peak memory, the time breakdown and, on
  several ranks, the max over ranks of memory and step time (``pretrain.metrics.rank_figures``), and not
  paddlenlp's ``interval_*`` rates (they count evaluation time, and would disagree with ours);
- a progress bar and one line per log record (``pretrain.metrics.progress``) replace paddlenlp's printer;
  ``report_to visualdl`` writes the board of ``pretrain.metrics.board`` instead of paddlenlp's;
- evaluating again at the step of the last evaluation returns its metrics instead of running it
  twice (the final evaluation when ``max_steps`` is a multiple of ``eval_steps``).
"""

from __future__ import annotations

import os
from typing import Any, Optional

import paddle.distributed as dist
from paddlenlp.trainer import PrinterCallback, ProgressCallback, Trainer
from paddlenlp.trainer.integrations import VisualDLCallback
from paddlenlp.trainer.trainer_utils import PREFIX_CHECKPOINT_DIR
from paddlenlp.utils.batch_sampler import DistributedBatchSampler

from pretrain import checkpoint
from pretrain.data import ReadErrorCheck, raise_read_error
from pretrain.log import logger
from pretrain.lr_schedule import create_lr_scheduler
from pretrain.metrics.board import BoardContent, VisualDLBoard
from pretrain.metrics.loss_history import LossHistory
from pretrain.metrics.peak_memory import peak_memory_gib
from pretrain.metrics.progress import RunProgress
from pretrain.metrics.rank_figures import record_extremes
from pretrain.metrics.step_timer import StepTimer, StepWork
from pretrain.metrics.time_breakdown import TimeBreakdown
from pretrain.nan_guard import NanGuard
from pretrain.preemption import SIGNALS, Preemption
from pretrain.sample_log import SampleLog


class PretrainingTrainer(Trainer):
    """Trainer with in-order sampling, the pretraining LR schedule, atomic checkpoints, a NanGuard,
    a StepTimer, a LossHistory, progress output and our VisualDL board."""

    lr_scheduler: Any  # paddlenlp's Trainer holds it: None until create_scheduler

    def __init__(
        self,
        *args,
        step_work: Optional[StepWork] = None,
        board: Optional[BoardContent] = None,
        sample_ids_file: Optional[str] = None,
        **kwargs,
    ):
        """paddlenlp's Trainer arguments, plus

        Args:
            step_work: what one optimizer step processes (``pretrain.metrics.step_timer.step_work(plan)``), for
                tokens/card/s and MFU (None: no rates, e.g. a toy model).
            board: the hparams and settings of the VisualDL board (``pretrain.report.board_content(plan)``);
                with ``report_to visualdl`` and None, the board has scalars only.
            sample_ids_file: where the sample log writes every step's ids (None: hashes only).
        """
        super().__init__(*args, **kwargs)
        self.step_timer = StepTimer(step_work, self.args.throughput_warmup_steps)
        self.time_breakdown = TimeBreakdown()
        self.timers = self.time_breakdown.timers  # paddlenlp's loop times its phases on these
        self.loss_history = LossHistory()
        self.sample_log = SampleLog(self.loss_history, sample_ids_file)
        self.nan_guard = NanGuard(
            self.args.nan_policy,
            self.args.max_skipped_nan_steps,
            self.args.world_size,
            check_gradients=not self.do_grad_scaling,  # the fp16 loss scaler skips overflowing steps itself
        )
        self.preemption = Preemption(self.args.max_wall_time, self.args.world_size)
        self._last_evaluation: Optional[tuple] = None  # (global_step, metrics) of the last evaluate()
        for callback in (
            self.step_timer,
            self.time_breakdown,
            self.loss_history,
            self.sample_log,
            self.nan_guard,
            self.preemption,
            ReadErrorCheck(),
        ):
            self.add_callback(callback)
        self._replace_output_callbacks(board or BoardContent({}, {}))

    def _replace_output_callbacks(self, board: BoardContent) -> None:
        """Swap paddlenlp's log printer / tqdm bar for RunProgress, and its VisualDL callback for VisualDLBoard."""
        self.pop_callback(PrinterCallback)
        self.pop_callback(ProgressCallback)
        self.add_callback(RunProgress(self.step_timer, show_bar=not self.args.disable_tqdm))
        if self.pop_callback(VisualDLCallback) is not None:
            self.add_callback(VisualDLBoard(board))

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

    def get_train_dataloader(self):
        """paddlenlp's loader; its worker processes outlive a stop signal meant for their rank (preemption)."""
        loader = super().get_train_dataloader()
        loader.worker_init_fn = SIGNALS.worker_init
        return loader

    def get_eval_dataloader(self, eval_dataset=None):
        """paddlenlp's loader; its worker processes outlive a stop signal meant for their rank (preemption)."""
        loader = super().get_eval_dataloader(eval_dataset)
        loader.worker_init_fn = SIGNALS.worker_init
        return loader

    def create_scheduler(self, num_training_steps: int):
        """The pretraining schedule of ``pretrain.lr_schedule`` (warm-up, then linear or cosine decay)."""
        if self.lr_scheduler is None:
            self.lr_scheduler = create_lr_scheduler(self.args)
        return self.lr_scheduler

    def train(self, resume_from_checkpoint: Optional[str] = None, **kwargs):
        """paddlenlp's training from ``resume_from_checkpoint`` (a checkpoint folder, None: from scratch),
        with the loss history restored from that checkpoint.

        From scratch with ``overwrite_output_dir``, an earlier run's checkpoints are moved aside first.

        Raises:
            UserError: a sample could not be read (``pretrain.data.ReadErrorCheck``).
            NonFiniteLossError: the loss, gradients or weights became nan/inf (``pretrain.nan_guard``).
        """
        if resume_from_checkpoint is None and self.args.overwrite_output_dir and self.is_local_process_zero():
            checkpoint.retire_previous_run(self.args.output_dir)
        self._barrier()
        self.loss_history.restore(resume_from_checkpoint)
        resumed_step = None if resume_from_checkpoint is None else checkpoint.step_of(resume_from_checkpoint)
        self.sample_log.restore(resumed_step, self.args.should_save)
        fresh = resume_from_checkpoint is None and self.args.overwrite_output_dir
        self.time_breakdown.restore(resume_from_checkpoint, self.args.output_dir, fresh)
        if resume_from_checkpoint is not None and checkpoint.step_of(resume_from_checkpoint) >= self.args.max_steps:
            logger.info("%s is at max_steps %d: nothing is left to train", resume_from_checkpoint, self.args.max_steps)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict:
        """paddlenlp's evaluation, off the step clock.

        On the run's own evaluation set, called again at the step of the last evaluation (the weights
        have not changed: the final evaluation when ``max_steps`` is a multiple of ``eval_steps``), it
        returns that evaluation's metrics: no second run, no duplicate point in loss_history.json or on
        the board.
        """
        own = eval_dataset is None and metric_key_prefix == "eval"
        if own and self._last_evaluation is not None and self._last_evaluation[0] == self.state.global_step:
            return dict(self._last_evaluation[1])
        with self.step_timer.excluded(), self.time_breakdown.timed("evaluation"):
            metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        raise_read_error(self.eval_dataset)
        if own:
            self._last_evaluation = (self.state.global_step, dict(metrics))
        return metrics

    def training_step(self, model, inputs, *args, **kwargs):
        """paddlenlp's forward and backward; the batch's ``sample_ids`` go to the sample log, the loss
        to the NanGuard on the device (0 if not finite)."""
        self.sample_log.add(inputs.pop("sample_ids", None))
        return self.nan_guard.add_loss(super().training_step(model, inputs, *args, **kwargs))

    def prediction_step(self, model, inputs, *args, **kwargs):
        """paddlenlp's evaluation step, without the batch's ``sample_ids`` (not a model input)."""
        inputs.pop("sample_ids", None)
        return super().prediction_step(model, inputs, *args, **kwargs)

    def step_sample_ids(self):
        """int64 ``[samples]``: this rank's sample ids (training dataset indices) of the optimizer step in
        progress, in reading order (``pretrain.sample_log.SampleLog.current_step_ids``)."""
        return self.sample_log.current_step_ids()

    def _check_loss_valid(self, loss):
        """Called by paddlenlp once per optimizer step, before the optimizer: the NanGuard's verdict on
        the step's losses and gradients. A skipped step's losses leave ``loss`` (the logged sum) and
        the logged average (paddlenlp divides by the steps since the last log, less the skipped ones).
        With delayed loss scaling (``enable_delay_scale_loss`` in tensor_parallel_config, no pipeline)
        paddlenlp has divided ``loss`` by gradient_accumulation_steps just before: so is the step's sum.
        The same all-reduce agrees on a stop request (``pretrain.preemption``)."""
        step = self.state.global_step + 1
        self._wait_for_gradient_reduce()
        skipped_step = self.nan_guard.verdict(
            self.model.parameters(), step, self.args.output_dir, requests=self.preemption.local_request()
        )
        self.preemption.agreed(self.nan_guard.agreed_requests, step)
        if skipped_step:
            skipped = self.nan_guard.step_loss_sum
            if self.args.pipeline_parallel_degree <= 1 and self._enable_delay_scale_loss():
                skipped = skipped / self.args.gradient_accumulation_steps
            loss.subtract_(skipped)
            self._skip_steps_since_last_logged += 1

    def _wait_for_gradient_reduce(self) -> None:
        """Under sharding stage2 with ``enable_stage2_overlap`` the last gradient bucket's reduce is still in
        flight when paddlenlp calls ``_check_loss_valid``: paddle waits for it only inside the optimizer's
        step (``GroupShardedStage2._redefine_opt_step``: ``self._comm_task.wait()``). Wait for it here,
        so that the NaN guard reads reduced gradients (paddle's wait then returns at once)."""
        if getattr(self.optimizer, "_reduce_overlap", False) and getattr(self.optimizer, "_comm_task", None):
            self.optimizer._comm_task.wait()

    def save_model(self, output_dir: Optional[str] = None, *args, **kwargs):
        """paddlenlp's save_model, refused (NonFiniteLossError) when a weight is nan/inf. Call it on every rank."""
        self.nan_guard.check_weights(self.model.parameters(), self.state.global_step, self.args.output_dir)
        with self.time_breakdown.timed("checkpoint-save"):
            return super().save_model(output_dir, *args, **kwargs)

    def _barrier(self):
        if self.args.world_size > 1:
            dist.barrier()

    def _save_checkpoint(self, model, metrics=None):
        """paddlenlp's save plus the loss history; after every rank has written, the completion marker
        (each node's local rank 0); after every node has marked, rotation."""
        with self.step_timer.excluded(), self.time_breakdown.timed("checkpoint-save") as took:
            folder = os.path.join(self.args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            if self.is_local_process_zero():
                checkpoint.discard_before_save(folder)
            self._barrier()
            super()._save_checkpoint(model, metrics)
            if self.args.should_save:
                self.loss_history.write(folder)
                self.time_breakdown.write(folder, self.state.global_step)
            self._barrier()
            # One writer per node: with a node-local output_dir each node marks its own files.
            if self.is_local_process_zero() and os.path.isdir(folder):
                checkpoint.mark_complete(folder, self.state.global_step)
            self._barrier()  # every node has marked the new checkpoint: old ones may go
            if self.is_local_process_zero():
                checkpoint.rotate(
                    self.args.output_dir,
                    self.args.save_total_limit,
                    self.state.global_step,
                    self.state.best_model_checkpoint,
                )
        logger.info("saved %s in %.2f s", os.path.basename(folder), took["seconds"])
        if self.args.should_save:
            self.time_breakdown.write(self.args.output_dir, self.state.global_step)

    def _print_timer(self):
        """Called by paddlenlp once a step's logging, evaluation and saving are done: instead of printing
        its timers (``pretrain.metrics.time_breakdown`` reads them), mark the wait for the next batch."""
        self.time_breakdown.step_complete()

    def _rotate_checkpoints(self, use_mtime=False, output_dir=None):
        """Disabled: paddlenlp rotates inside ``_save_checkpoint``, before the new checkpoint is complete
        (and, in a single process, never: it tests ``local_rank == 0`` where that is -1);
        ``_save_checkpoint`` above calls ``checkpoint.rotate`` once the new one is marked complete."""

    def log(self, logs: dict, **kwargs) -> None:
        """Replace paddlenlp's ``interval_*`` rates of a training log with the interval's throughput, MFU
        (when credible), peak memory and time breakdown (``time_<phase>``, seconds per step), and on
        several ranks the max over ranks (``pretrain.metrics.rank_figures``; a collective: every rank logs), then
        log it and update ``<output_dir>/time_history.json``.

        Evaluation logs (no ``loss`` key) pass through unchanged.
        """
        if "loss" in logs:
            logs = {key: value for key, value in logs.items() if not key.startswith("interval_")}
            logs.update(self.step_timer.interval_rates())
            logs.update({key: value for key, value in peak_memory_gib().items() if isinstance(value, float)})
            logs.update(self.time_breakdown.interval_record())
            if self.args.world_size > 1:
                logs.update(record_extremes(logs, self.args.world_size))
            if self.args.should_save:
                self.time_breakdown.write(self.args.output_dir, self.state.global_step, durable=False)
        super().log(logs, **kwargs)
