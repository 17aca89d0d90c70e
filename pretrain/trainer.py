"""The PaddleNLP Trainer, specialised for pretraining.

Differences from ``paddlenlp.trainer.Trainer``:
- the training sampler reads the dataset in order: GPTDataset already shuffles, with its own seed, so a
  second shuffle would only break exact resume and data-parallel equivalence; it is paddlenlp's
  ``DistributedBatchSampler``, which the Trainer moves straight to ``consumed_samples`` on resume
  instead of reading and discarding every batch already trained on (evaluation keeps paddlenlp's own
  sampler: paddle's ``DistributedBatchSampler``, in order, its last partial global batch split evenly
  over the ranks, so every sample of the evaluation set counts once whatever the layout);
- checkpoints are atomic and verified (``pretrain.checkpoint``): marked complete (sizes and
  checksums) after every rank has written, with the loss history (and a mixture of experts' routing
  records, ``pretrain.routing``) inside, and old ones rotated only
  once every node has marked the new one; ``overwrite_output_dir`` first moves an earlier run's
  checkpoints aside; one process per output_dir does this (global rank 0 when the nodes share the
  folder, found with a probe file; else each node's local rank 0);
- a nan/inf loss or gradient stops the run or skips the step, checked once per optimizer step,
  and non-finite weights are never saved, nor any while a skipped step left them unconfirmed
  (``pretrain.nan_guard``); only applied steps count as trained (``applied_steps``); on the same
  per-step figures a loss or gradient-norm spike is skipped or rolled back to the last healthy checkpoint, which
  rotation keeps, its weights broadcast to every replica (``loss_spike_policy``, ``pretrain.recovery``);
  ``debug_inject_spike_at_step`` poisons one batch;
- a checkpoint saved over another sharding degree or stage (sharding stage1 x2 <-> data parallel, stage2 x2
  <-> stage1 x2) resumes with its optimizer shards merged (``pretrain.resume_layout``);
- a run resumed at ``max_steps`` trains nothing (paddlenlp would train one more batch when an
  epoch outlasts max_steps) and reuses the evaluation its checkpoint recorded at that step;
- each optimizer step's sample ids are taken off the batches and their rolling hash is kept in the
  loss history (``pretrain.sample_log``; ``step_sample_ids`` gives the step's ids so far);
- a stop request (SIGTERM, SIGUSR1, ``max_wall_time``) agreed by all ranks in the NaN guard's
  all-reduce saves ``checkpoint-<step>`` at the next step boundary and ends training
  (``pretrain.preemption``; the entry script then exits with ``EXIT_PREEMPTED``);
- a failure to read a sample ends the run with a UserError instead of a silent hang
  (``pretrain.data.CheckedDataset``);
- the weight-decay rule finds the parameters sharding stage3 slices (paddlenlp's misses them);
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
  twice (the final evaluation when ``max_steps`` is a multiple of ``eval_steps``);
- under a launcher, a ``pretrain.cluster.watchdog.Watchdog`` follows the step and phase of every rank (a
  rank stuck for ``hang_timeout`` ends the job with a report), and each training log record names
  the slowest rank when it lags the others by more than ``slow_rank_threshold``.

paddlenlp hook -> what changes -> the module that owns it:

- ``__init__`` -> the components, as callbacks; our progress output and board -> this module
- ``_get_train_sampler`` -> in order, moved to ``consumed_samples`` on resume -> this module
- ``get_train_dataloader``, ``get_eval_dataloader`` -> workers ignore the rank's stop signals -> ``preemption``
- ``create_optimizer`` -> weight decay on stage3 slices, the expert-parallel clip -> ``optimizer_chain``
- ``create_scheduler`` -> warm-up, then linear or cosine decay to ``min_learning_rate`` -> ``lr_schedule``
- ``train`` -> run states restored, the rollback loop, nothing past max_steps -> this module, ``checkpoint_manager``
- ``compute_loss`` -> the MoE load-balancing loss; an injected spike -> ``moe_training``, ``recovery``
- ``training_step`` -> sample ids off the batch; the loss to the NaN guard -> ``sample_log``, ``nan_guard``
- ``_check_loss_valid``, ``on_optimizer_begin`` -> the step's verdict (nan/inf, spike, stop) -> ``step_verdict``
- ``_maybe_log_save_evaluate`` -> skipped steps recorded; routing-bias balancing -> ``step_verdict``, ``moe_training``
- ``_save_checkpoint``, ``_rotate_checkpoints`` -> atomic, verified, marked, rotated -> ``checkpoint_manager``
- ``_load_from_checkpoint`` -> a rollback's weights reach every replica -> ``checkpoint_manager``
- ``_load_optimizer_and_scheduler`` -> shards merged over another sharding degree -> ``checkpoint_manager``
- ``save_model`` -> refused on nan/inf weights, timed -> ``nan_guard``
- ``evaluate``, ``prediction_step`` -> off the step clock, not twice at one step -> this module
- ``log``, ``_print_timer`` -> tokens/card/s, MFU, memory, time breakdown, slow rank -> ``metrics``, ``cluster``
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Optional

import paddle.distributed as dist
from paddle.distributed import fleet
from paddlenlp.trainer import PrinterCallback, ProgressCallback, Trainer, TrainerCallback
from paddlenlp.trainer.integrations import VisualDLCallback
from paddlenlp.utils.batch_sampler import DistributedBatchSampler

from pretrain import checkpoint
from pretrain.checkpoint_manager import CheckpointManager
from pretrain.cluster.watchdog import Watchdog
from pretrain.data import ReadErrorCheck, raise_read_error
from pretrain.log import logger
from pretrain.lr_schedule import create_lr_scheduler
from pretrain.metrics.board import BoardContent, VisualDLBoard
from pretrain.metrics.comm_volume import CommunicationVolume
from pretrain.metrics.loss_history import LossHistory
from pretrain.metrics.peak_memory import peak_memory_gib
from pretrain.metrics.progress import RunProgress
from pretrain.metrics.rank_figures import record_extremes
from pretrain.metrics.step_timer import StepTimer, StepWork
from pretrain.metrics.time_breakdown import TimeBreakdown
from pretrain.moe_training import MoETraining
from pretrain.nan_guard import NanGuard
from pretrain.optimizer_chain import adapt_created_optimizer, held_elements
from pretrain.preemption import SIGNALS, Preemption
from pretrain.recovery import INJECTED_SPIKE_FACTOR, RollbackRequested, SpikeWatch, pipeline_spike
from pretrain.resume_layout import install_single_process_unified_load
from pretrain.sample_log import SampleLog
from pretrain.step_verdict import StepVerdict


class _InitialCheckpoint(TrainerCallback):
    """At the start of a fresh run with ``loss_spike_policy rollback``: the trainer saves checkpoint-0."""

    def __init__(self, trainer: "PretrainingTrainer"):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if self.trainer._save_initial_weights and state.global_step == 0:
            self.trainer._save_initial_checkpoint()


class _OptimizerPhase(TrainerCallback):
    """Tells the watchdog when each rank runs its optimizer (paddlenlp's on_optimizer_begin/end hooks)."""

    def __init__(self, watchdog: Watchdog):
        self.watchdog = watchdog

    def on_train_begin(self, args, state, control, **kwargs):
        self.watchdog.enter("data", state.global_step + 1)

    def on_optimizer_begin(self, args, state, control, **kwargs):
        self.watchdog.enter("optimizer")

    def on_optimizer_end(self, args, state, control, **kwargs):
        self.watchdog.enter("collective")


class _HeldElements(TrainerCallback):
    """The most parameter and optimizer-state elements this rank held after any optimizer step of the run
    (``optimizer_chain.held_elements``; the run summary's ``per_rank``)."""

    def __init__(self, trainer: "PretrainingTrainer"):
        self.trainer, self.parameters, self.optimizer = trainer, 0, 0

    def on_step_end(self, args, state, control, **kwargs):
        parameters, optimizer = held_elements(self.trainer.model_wrapped, self.trainer.optimizer)
        self.parameters, self.optimizer = max(self.parameters, parameters), max(self.optimizer, optimizer)


class PretrainingTrainer(Trainer):
    """Trainer with in-order sampling, the pretraining LR schedule, atomic checkpoints, a NanGuard,
    a StepTimer, a LossHistory, progress output and our VisualDL board."""

    lr_scheduler: Any  # paddlenlp's Trainer holds it: None until create_scheduler
    train_dataset: Any  # paddlenlp's Trainer holds it (a dataset, or [] once nothing is left to train)

    def __init__(
        self,
        *args,
        step_work: Optional[StepWork] = None,
        board: Optional[BoardContent] = None,
        watchdog: Optional[Watchdog] = None,
        sample_ids_file: Optional[str] = None,
        **kwargs,
    ):
        """paddlenlp's Trainer arguments, plus

        Args:
            step_work: what one optimizer step processes (``pretrain.metrics.step_timer.step_work(plan)``), for
                tokens/card/s and MFU (None: no rates, e.g. a toy model).
            board: the hparams and settings of the VisualDL board (``pretrain.report.board_content(plan)``);
                with ``report_to visualdl`` and None, the board has scalars only.
            watchdog: this rank's started ``pretrain.cluster.watchdog.Watchdog`` (None: a single process, unwatched).
            sample_ids_file: where the sample log writes every step's ids (None: hashes only).
        """
        super().__init__(*args, **kwargs)
        run = self.args  # paddlenlp's TrainingArguments with ours (pretrain.arguments)
        if run.unified_checkpoint and run.world_size == 1:
            install_single_process_unified_load()  # a checkpoint of a TP/PP run resumed in one process
        self.step_timer = StepTimer(step_work, run.throughput_warmup_steps)
        self.time_breakdown = TimeBreakdown(output_dir=run.output_dir, overwrite_output_dir=run.overwrite_output_dir)
        self.timers = self.time_breakdown.timers  # paddlenlp's loop times its phases on these
        self.loss_history = LossHistory()
        self.spikes = SpikeWatch(run, run.train_batch_size * run.gradient_accumulation_steps * run.dataset_world_size)
        self.sample_log = SampleLog(self.loss_history, sample_ids_file, run.should_save)
        self.nan_guard = NanGuard(
            run.nan_policy,
            run.max_skipped_nan_steps,
            run.world_size,
            check_gradients=not self.do_grad_scaling,  # the fp16 loss scaler skips overflowing steps itself
            spikes=self.spikes,
            hcg=fleet.get_hybrid_communicate_group() if run.use_hybrid_parallel else None,
        )
        self.verdict = StepVerdict(self)
        self.preemption = Preemption(run.max_wall_time, run.world_size)
        # mixture of experts: the load-balancing loss, the routing figures, DeepSeek-V3's bias balancing
        self.moe = MoETraining.of(self.model, run.moe_bias_update_rate)
        self.router_watch = self.moe.router_watch if self.moe is not None else None
        states = [self.loss_history, self.sample_log, self.time_breakdown, self.spikes]
        self.checkpoints = CheckpointManager(self, states + ([self.moe] if self.moe is not None else []))
        self._last_evaluation: Optional[tuple] = None  # (global_step, metrics) of the last evaluate()
        self._user_skip_data_intervals = list(run.skip_data_intervals or [])
        self._last_train_log_step = 0
        self._save_initial_weights = False
        self.held_elements = _HeldElements(self)
        for callback in (
            self.step_timer,
            self.time_breakdown,
            CommunicationVolume(),
            self.loss_history,
            self.sample_log,
            self.verdict,  # before the NanGuard: its on_optimizer_begin applies the verdict
            self.nan_guard,
            self.spikes,
            self.preemption,
            ReadErrorCheck(),
            _InitialCheckpoint(self),
            self.held_elements,
        ):
            self.add_callback(callback)
        self.pop_callback(PrinterCallback)  # paddlenlp's printer and tqdm bar -> RunProgress; its VisualDL -> ours
        self.pop_callback(ProgressCallback)
        self.add_callback(RunProgress(self.step_timer, show_bar=not run.disable_tqdm))
        if self.pop_callback(VisualDLCallback) is not None:
            self.add_callback(VisualDLBoard(board or BoardContent({}, {})))
        self.watchdog = watchdog
        if watchdog is not None:
            self.add_callback(_OptimizerPhase(watchdog))

    def _enter(self, phase: str, step: Optional[int] = None) -> Optional[str]:
        """Tell the watchdog (if any) that this rank now works in ``phase``; return the phase it left."""
        if self.watchdog is None:
            return None
        left = self.watchdog.phase
        self.watchdog.enter(phase, step)
        return left

    def _get_train_sampler(self):
        return DistributedBatchSampler(
            self.train_dataset,
            batch_size=self.args.per_device_train_batch_size,
            shuffle=False,
            num_replicas=self.args.dataset_world_size,
            rank=self.args.dataset_rank,
            drop_last=self.args.dataloader_drop_last,
        )

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

    def create_optimizer(self, lr_scheduler=None):
        """paddlenlp's optimizer, with its weight-decay rule decided as in one process and, under expert
        parallelism, the clip over every rank's experts (``pretrain.optimizer_chain.adapt_created_optimizer``)."""
        created = self.optimizer is None
        optimizer = super().create_optimizer(lr_scheduler)
        if created:
            adapt_created_optimizer(optimizer, self.model, self.args.max_grad_norm)
        return optimizer

    def create_scheduler(self, num_training_steps: int):
        """The pretraining schedule of ``pretrain.lr_schedule`` (warm-up, then linear or cosine decay)."""
        if self.lr_scheduler is None:
            self.lr_scheduler = create_lr_scheduler(self.args)
        return self.lr_scheduler

    def train(self, resume_from_checkpoint: Optional[str] = None, **kwargs):
        """paddlenlp's training from ``resume_from_checkpoint`` (a checkpoint folder, None: from scratch),
        with the loss history, the loss-spike state and a mixture of experts' routing records restored from that
        checkpoint (and its evaluation at that step, if any, as the last evaluation: ``evaluate`` returns it
        instead of running it again).

        From scratch with ``overwrite_output_dir``, an earlier run's checkpoints are moved aside first;
        from scratch with ``loss_spike_policy rollback``, the initial weights are saved as checkpoint-0.
        A rollback (``pretrain.recovery``) moves the checkpoints after the healthy one it goes back to
        into ``output_dir/rolled-back-<step>/`` and trains on from it, in this process.

        Raises:
            UserError: a sample could not be read (``pretrain.data.ReadErrorCheck``).
            NonFiniteLossError: the loss, gradients or weights became nan/inf (``pretrain.nan_guard``).
            SpikeStopError: the loss spike policy gave up (``pretrain.recovery``).
        """
        self.checkpoints.find_shared_output_dir()  # a collective call
        if resume_from_checkpoint is None:
            self.checkpoints.retire_previous_run()
        self.checkpoints.barrier()
        while True:
            try:
                return self._train_from(resume_from_checkpoint, **kwargs)
            except RollbackRequested as rollback:
                resume_from_checkpoint = self._roll_back(rollback.checkpoint_step)

    def _train_from(self, resume_from_checkpoint: Optional[str], **kwargs):
        self.checkpoints.restore(resume_from_checkpoint)
        resumed_step = checkpoint.step_of(resume_from_checkpoint) if resume_from_checkpoint is not None else 0
        self.args.skip_data_intervals = self._user_skip_data_intervals + self.spikes.state.skip_windows or None
        self._save_initial_weights = resume_from_checkpoint is None and self.args.loss_spike_policy == "rollback"
        self._last_train_log_step = resumed_step
        last_eval = self.loss_history.eval[-1] if self.loss_history.eval else None
        if last_eval is not None and last_eval[0] == resumed_step:  # evaluated before that save: not again
            self._last_evaluation = (resumed_step, {"eval_loss": last_eval[1]})
        if resumed_step < self.args.max_steps:
            return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
        logger.info("%s is at max_steps %d: nothing is left to train", resume_from_checkpoint, self.args.max_steps)
        # paddlenlp would still train one batch when an epoch holds more than max_steps steps (fine-tuning
        # data): with no batch to read it loads the checkpoint and its loop has nothing to run.
        # (paddlenlp then lowers gradient_accumulation_steps to the 0 batches of that epoch: put it back)
        dataset, self.train_dataset = self.train_dataset, []
        accumulation = self.args.gradient_accumulation_steps
        try:
            return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
        finally:
            self.train_dataset = dataset
            self.args.gradient_accumulation_steps = accumulation

    def _roll_back(self, step: int) -> str:
        """Go back to checkpoint-``step`` (``CheckpointManager.roll_back``, on every rank), dropping what the
        abandoned step left: the NaN guard's figures, the gradients and running timers; return the folder.

        Raises:
            SpikeStopError: that checkpoint is no longer complete.
        """
        folder = self.checkpoints.roll_back(step)
        self.nan_guard.on_step_begin(self.args, self.state, self.control)  # drop the abandoned step's figures
        if self.optimizer is not None:
            self.optimizer.clear_grad()  # and its gradients; paddlenlp loads the optimizer and schedule in place
        for timer in self.timers.timers.values() if self.timers else []:
            if timer.started_:  # left running by the abandoned step: paddlenlp starts them again
                timer.stop()
        return folder

    def compute_loss(self, model, inputs, return_outputs=False):
        """paddlenlp's forward; its host time counts as this rank's own work (``cluster.watchdog.RankWork``).
        A mixture of experts in training adds ``aux_loss_coef`` x its load-balancing loss (``pretrain.routing``).
        The loss is multiplied by ``INJECTED_SPIKE_FACTOR`` for the batch of ``debug_inject_spike_at_step``, in
        training only (an evaluation at the step before it reported its losses x 1000 under pipeline parallelism)."""

        def forward():
            return super(PretrainingTrainer, self).compute_loss(model, inputs, return_outputs=return_outputs)

        result = self.moe.add_aux_loss(forward, return_outputs) if self.moe is not None else forward()
        if self.watchdog is not None:
            self.watchdog.forward_done()
        if not model.training or self.args.debug_inject_spike_at_step != self.state.global_step + 1:
            return result
        if return_outputs:
            return result[0] * INJECTED_SPIKE_FACTOR, result[1]
        return result * INJECTED_SPIKE_FACTOR

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
        left = self._enter("evaluate")
        with self.step_timer.excluded(), self.time_breakdown.timed("evaluation"):
            metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        if left is not None:
            self._enter(left)
        raise_read_error(self.eval_dataset)
        if own:
            self._last_evaluation = (self.state.global_step, dict(metrics))
        return metrics

    def training_step(self, model, inputs, *args, **kwargs):
        """paddlenlp's forward and backward; the batch's ``sample_ids`` go to the sample log, the loss
        to the NanGuard on the device (0 if not finite). Under pipeline parallelism the batch of
        ``debug_inject_spike_at_step`` gets its loss multiplied here (``pretrain.recovery.pipeline_spike``: the
        pipeline never calls ``compute_loss``)."""
        self._enter("forward/backward", self.state.global_step + 1)
        self.sample_log.add(inputs.pop("sample_ids", None))
        injected = self.args.debug_inject_spike_at_step == self.state.global_step + 1
        with pipeline_spike(model) if injected and self.args.pipeline_parallel_degree > 1 else nullcontext():
            loss = self.nan_guard.add_loss(super().training_step(model, inputs, *args, **kwargs))
        self._enter("data")  # waiting for the next micro batch, until the next call
        return loss

    def prediction_step(self, model, inputs, *args, **kwargs):
        """paddlenlp's evaluation step, without the batch's ``sample_ids`` (not a model input)."""
        inputs.pop("sample_ids", None)
        return super().prediction_step(model, inputs, *args, **kwargs)

    def step_sample_ids(self):
        """int64 ``[samples]``: this rank's sample ids (training dataset indices) of the optimizer step in
        progress, in reading order (``pretrain.sample_log.SampleLog.current_step_ids``)."""
        return self.sample_log.current_step_ids()

    def _check_loss_valid(self, loss):
        """Called by paddlenlp once per optimizer step, after the step's backward and before its gradients are
        reduced (fleet's data-parallel all-reduce, sharding stage1's reduce) and the optimizer runs: keeps
        ``loss`` (the logged sum) for the verdict, which waits for the reduced gradients (``pretrain.step_verdict``)."""
        self._enter("collective")  # the gradients' reduce, the verdict's all-reduce, until the optimizer
        self.verdict.keep_loss(loss)

    def save_model(self, output_dir: Optional[str] = None, *args, **kwargs):
        """paddlenlp's save_model, refused (NonFiniteLossError) when a weight is nan/inf. Call it on every rank.

        The final model (``output_dir`` None: the run's) logs ``saved the model to <output_dir> in X s``;
        a checkpoint's save is logged by ``_save_checkpoint``.
        """
        left = self._enter("save")
        self.nan_guard.check_weights(self.model.parameters(), self.state.global_step, self.args.output_dir)
        with self.time_breakdown.timed("checkpoint-save") as took:
            result = super().save_model(output_dir, *args, **kwargs)
        if left is not None:
            self._enter(left)
        if output_dir is None:
            logger.info("saved the model to %s in %.2f s", self.args.output_dir, took["seconds"])
        return result

    def _maybe_log_save_evaluate(self, tr_loss, model, epoch, ignore_keys_for_eval, **kwargs):
        """paddlenlp's log (a collective), save and evaluation after an optimizer step (or a step of a skipped
        data window), in the watchdog's phases; a step whose update was not applied is recorded in the loss
        history first, so that every checkpoint's history names the skipped steps up to its own."""
        self._enter("collective")
        skipped = self.verdict.applied_no_update(self.state.global_step)
        if skipped:
            self.loss_history.record_skipped(self.state.global_step)
        if self.moe is not None:  # the step's loads: a collective, every rank
            self.moe.after_step(not skipped, self.args.world_size)
        super()._maybe_log_save_evaluate(tr_loss, model, epoch, ignore_keys_for_eval, **kwargs)
        self._enter("data", self.state.global_step + 1)

    def _load_from_checkpoint(self, resume_from_checkpoint=None):
        """paddlenlp's load of the weights; a rollback's reach every replica (``CheckpointManager``)."""
        super()._load_from_checkpoint(resume_from_checkpoint)
        self.checkpoints.share_loaded_weights(resume_from_checkpoint)

    def _load_optimizer_and_scheduler(self, checkpoint):
        """paddlenlp's, or the optimizer shards merged over another sharding degree or stage
        (``CheckpointManager.load_optimizer_and_scheduler``; ``checkpoint``: the folder, as paddlenlp names it)."""
        return self.checkpoints.load_optimizer_and_scheduler(
            checkpoint, lambda: super(PretrainingTrainer, self)._load_optimizer_and_scheduler(checkpoint)
        )

    def _save_checkpoint(self, model, metrics=None):
        """paddlenlp's save, atomic, verified, marked and rotated, the run states inside (``CheckpointManager``)."""
        self.checkpoints.save(lambda: super(PretrainingTrainer, self)._save_checkpoint(model, metrics))

    def _print_timer(self):
        """Called by paddlenlp once a step's logging, evaluation and saving are done: instead of printing
        its timers (``pretrain.metrics.time_breakdown`` reads them), mark the wait for the next batch."""
        self.time_breakdown.step_complete()

    def _save_initial_checkpoint(self) -> None:
        """checkpoint-0, the initial weights (``CheckpointManager.save_initial``)."""
        self.checkpoints.save_initial(lambda: super(PretrainingTrainer, self)._save_checkpoint(self.model_wrapped))

    def _rotate_checkpoints(self, use_mtime=False, output_dir=None):
        """Disabled: paddlenlp rotates before the new checkpoint is complete (in one process never: it tests
        ``local_rank == 0``); ``CheckpointManager.save`` rotates once the new one is marked complete."""

    def applied_steps(self) -> int:
        """Optimizer steps of the whole run (resumed or not, up to ``global_step``) whose update was applied:
        ``global_step`` less the skipped steps of the loss history."""
        return self.state.global_step - len(self.loss_history.skipped)

    def log(self, logs: dict, **kwargs) -> None:
        """Replace paddlenlp's ``interval_*`` rates of a training log with the interval's throughput, MFU
        (when credible), peak memory and time breakdown (``time_<phase>``, seconds per step), and on
        several ranks the max over ranks (``pretrain.metrics.rank_figures``; a collective: every rank logs), then
        log it and update ``<output_dir>/time_history.json``. Under a launcher, the slowest rank is named when
        it lags the median by more than ``slow_rank_threshold`` (not in the ``throughput_warmup_steps``).

        Steps of the interval whose update was skipped (recorded in the loss history by
        ``_maybe_log_save_evaluate``) are counted in ``skipped_steps``; when every step was, the record has no
        ``loss`` (paddlenlp's would be 0.0).
        Evaluation logs (no ``loss`` key) pass through unchanged.
        """
        if "loss" in logs:
            first, self._last_train_log_step = self._last_train_log_step + 1, self.state.global_step
            logs = self.loss_history.mark_skipped(logs, first, self.state.global_step)
        if "loss" in logs or "skipped_steps" in logs:
            logs = {key: value for key, value in logs.items() if not key.startswith("interval_")}
            logs.update(self.step_timer.interval_rates())
            logs.update({key: value for key, value in peak_memory_gib().items() if isinstance(value, float)})
            logs.update(self.time_breakdown.interval_record())
            if self.moe is not None:  # a collective on several ranks, as below
                logs.update(self.moe.record(self.state.global_step, self.args.world_size))
            if self.args.world_size > 1:
                logs.update(record_extremes(logs, self.args.world_size))
            if self.args.should_save:
                self.time_breakdown.write_record(self.args.output_dir, self.state.global_step, durable=False)
            if self.watchdog is not None:  # a collective: every rank logs (not while the first steps warm up)
                warn = self.is_world_process_zero() and self.state.global_step > self.args.throughput_warmup_steps
                self.watchdog.name_slow_rank(dist.all_gather_object, self.args.slow_rank_threshold, warn)
        super().log(logs, **kwargs)
