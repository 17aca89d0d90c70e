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
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from typing import Any, Optional

import paddle
import paddle.distributed as dist
from paddle.distributed import fleet
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_optimizer_stage2 import GroupShardedOptimizerStage2
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage2 import GroupShardedStage2
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage3 import GroupShardedStage3
from paddle.distributed.fleet.utils.hybrid_parallel_util import broadcast_dp_parameters, broadcast_sharding_parameters
from paddle.distributed.parallel import sync_params_buffers
from paddlenlp.trainer import PrinterCallback, ProgressCallback, Trainer, TrainerCallback
from paddlenlp.trainer.integrations import VisualDLCallback
from paddlenlp.trainer.trainer import SCALER_NAME, SCHEDULER_NAME
from paddlenlp.trainer.trainer_utils import PREFIX_CHECKPOINT_DIR
from paddlenlp.trainer.utils.helper import broadcast_dp_optimizer
from paddlenlp.utils.batch_sampler import DistributedBatchSampler

from pretrain import checkpoint
from pretrain.bias_balancing import BiasBalancer, routing_biases, update_rate
from pretrain.cluster.shared_folder import folder_seen_by
from pretrain.cluster.watchdog import Watchdog, slow_rank_message
from pretrain.compat import moe as moe_compat
from pretrain.data import ReadErrorCheck, raise_read_error
from pretrain.errors import UserError
from pretrain.layout import ParallelLayout
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
from pretrain.model import pipeline_weight_decay
from pretrain.nan_guard import NanGuard
from pretrain.preemption import SIGNALS, Preemption
from pretrain.recovery import (
    INJECTED_SPIKE_FACTOR,
    RollbackRequested,
    SpikeStopError,
    SpikeWatch,
    clear_pending_rollback,
    pipeline_spike,
)
from pretrain.registry import implementation_for
from pretrain.resume_layout import install_single_process_unified_load, optimizer_state
from pretrain.routing import RouterWatch
from pretrain.sample_log import SampleLog

STAGE3_SLICE_PREFIX = "slice@"  # paddle's GroupShardedStage3 names a parameter's slice "slice@<name>"


def _wrapped_optimizers(optimizer) -> list:
    """``optimizer`` and the optimizers it wraps, outermost first, through fleet's ``_inner_opt`` and the
    group-sharded ``_optim`` links (paddlenlp's ``unwrap_optimizer`` walk). Stops at a self-link: paddle 3.3.1's
    sharding stage3 marks the optimizer it wraps with ``optimizer._optim = optimizer`` (``_OptimizerWrapper``),
    on which paddlenlp 3.0.0b4's ``unwrap_optimizer`` loops for ever."""
    chain = [optimizer]
    while True:
        current = chain[-1]
        inner = getattr(current, "_inner_opt", None) or getattr(current, "_optim", None)
        if inner is None or any(inner is seen for seen in chain):
            return chain
        chain.append(inner)


SHARDING_WRAPPERS = (GroupShardedStage2, GroupShardedStage3)  # the model wrappers whose step finishes the reduce


def _expert_parallel_clip(optimizer) -> Optional[moe_compat.ExpertParallelClip]:
    """The innermost optimizer's clip when it is ``create_optimizer``'s ``ExpertParallelClip``, else None."""
    clip = getattr(_wrapped_optimizers(optimizer)[-1], "_grad_clip", None)
    return clip if isinstance(clip, moe_compat.ExpertParallelClip) else None


def own_parameters(optimizer) -> list:
    """The parameters whose Adam moments (and master weights) this rank's optimizer creates, updates and saves.

    The innermost optimizer's list: every parameter without sharding, this rank's part under sharding stage1
    (paddle's ``DygraphShardingOptimizer`` narrows that list) and stage3 (its slices). Under stage2, paddle's
    ``GroupShardedOptimizerStage2`` leaves every parameter there and updates only those its ``param2rank``
    assigns to its rank in the sharding group (``_rank``): those.

    Args:
        optimizer: the trainer's optimizer, as wrapped for its layout.
    Returns:
        The parameters (paddle Parameters), in the innermost optimizer's order.
    """
    chain = _wrapped_optimizers(optimizer)
    parameters = list(chain[-1]._parameter_list)
    stage2 = next((o for o in chain if isinstance(o, GroupShardedOptimizerStage2)), None)
    if stage2 is None:
        return parameters
    return [p for p in parameters if stage2.param2rank[p.name] == stage2._rank]


class _InitialCheckpoint(TrainerCallback):
    """At the start of a fresh run with ``loss_spike_policy rollback``: the trainer saves checkpoint-0."""

    def __init__(self, trainer: "PretrainingTrainer"):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if self.trainer._save_initial_weights and state.global_step == 0:
            self.trainer._save_initial_checkpoint()


class _StepVerdict(TrainerCallback):
    """At paddlenlp's on_optimizer_begin, once the step's gradients are reduced: the trainer's verdict on it."""

    def __init__(self, trainer: "PretrainingTrainer"):
        self.trainer = trainer

    def on_optimizer_begin(self, args, state, control, **kwargs):
        self.trainer._judge_step()


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
        if self.args.unified_checkpoint and self.args.world_size == 1:
            install_single_process_unified_load()  # a checkpoint of a TP/PP run resumed in one process
        self.step_timer = StepTimer(step_work, self.args.throughput_warmup_steps)
        self.time_breakdown = TimeBreakdown()
        self.timers = self.time_breakdown.timers  # paddlenlp's loop times its phases on these
        self.loss_history = LossHistory()
        self.spikes = SpikeWatch(
            self.args, self.args.train_batch_size * self.args.gradient_accumulation_steps * self.args.dataset_world_size
        )
        self.sample_log = SampleLog(self.loss_history, sample_ids_file)
        self.nan_guard = NanGuard(
            self.args.nan_policy,
            self.args.max_skipped_nan_steps,
            self.args.world_size,
            check_gradients=not self.do_grad_scaling,  # the fp16 loss scaler skips overflowing steps itself
            spikes=self.spikes,
            hcg=fleet.get_hybrid_communicate_group() if self.args.use_hybrid_parallel else None,
        )
        self._step_loss: Any = None  # paddlenlp's logged loss sum, from _check_loss_valid to the verdict
        self.preemption = Preemption(self.args.max_wall_time, self.args.world_size)
        self._last_evaluation: Optional[tuple] = None  # (global_step, metrics) of the last evaluate()
        self._output_dir_shared = False  # every rank sees the same output_dir (set by train())
        self._user_skip_data_intervals = list(self.args.skip_data_intervals or [])
        self._last_train_log_step = 0
        self._save_initial_weights = False
        for callback in (
            self.step_timer,
            self.time_breakdown,
            CommunicationVolume(),
            self.loss_history,
            self.sample_log,
            _StepVerdict(self),  # before the NanGuard: its on_optimizer_begin applies the verdict
            self.nan_guard,
            self.spikes,
            self.preemption,
            ReadErrorCheck(),
            _InitialCheckpoint(self),
        ):
            self.add_callback(callback)
        self._replace_output_callbacks(board or BoardContent({}, {}))
        self.watchdog = watchdog
        if watchdog is not None:
            self.add_callback(_OptimizerPhase(watchdog))
        config = getattr(self.model, "config", None)
        routing = implementation_for(config.model_type).routing if config is not None else None
        # mixture of experts: the load-balancing loss and the routing figures (None: a dense model)
        self.router_watch = RouterWatch(self.model, routing, config) if routing is not None else None
        # DeepSeek-V3: its routing biases move toward balance after each applied step (None: no bias or rate 0)
        self.bias_balancer = None
        if self.router_watch is not None:
            biases = routing_biases(self.router_watch.routers)
            rate = update_rate(self.args.moe_bias_update_rate, bool(biases))
            if biases and rate > 0:
                self.bias_balancer = BiasBalancer(biases, rate)
                self.router_watch.bias_update_rate = rate

    def _enter(self, phase: str, step: Optional[int] = None) -> Optional[str]:
        """Tell the watchdog (if any) that this rank now works in ``phase``; return the phase it left."""
        if self.watchdog is None:
            return None
        left = self.watchdog.phase
        self.watchdog.enter(phase, step)
        return left

    def _replace_output_callbacks(self, board: BoardContent) -> None:
        """Swap paddlenlp's log printer / tqdm bar for RunProgress, and its VisualDL callback for VisualDLBoard."""
        self.pop_callback(PrinterCallback)
        self.pop_callback(ProgressCallback)
        self.add_callback(RunProgress(self.step_timer, show_bar=not self.args.disable_tqdm))
        if self.pop_callback(VisualDLCallback) is not None:
            self.add_callback(VisualDLBoard(board))

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
        """paddlenlp's optimizer, with its weight-decay rule decided as in one process; under expert
        parallelism its gradients clipped by the norm over every rank's experts and shards
        (``pretrain.compat.moe.expert_parallel_clip``).

        - A pipeline model: on the single-model parameter names (``pretrain.model.pipeline_weight_decay``).
        - Sharding stage3: paddle 3.3.1's ``GroupShardedStage3`` hands the optimizer each sliced parameter
          (those above its ``segment_size``, 2**20 elements: the embeddings and LM head first) as a new tensor
          named ``slice@<name>`` (``_TensorWrapper``); paddlenlp 3.0.0b4's rule (``name in decay_parameters``,
          ``Trainer.create_optimizer``) does not find those names, so they trained without weight decay.
        """
        created = self.optimizer is None
        optimizer = super().create_optimizer(lr_scheduler)
        if created:
            inner = _wrapped_optimizers(optimizer)[-1]  # inside fleet's wrappers
            decays = pipeline_weight_decay(self.model) or inner._apply_decay_param_fun
            if decays is not None:
                inner._apply_decay_param_fun = lambda name: decays(name.removeprefix(STAGE3_SLICE_PREFIX))
            expert_clip = moe_compat.expert_parallel_clip(self.model, self.args.max_grad_norm)
            if expert_clip is not None:
                inner._grad_clip = expert_clip
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
        if self.args.world_size > 1:  # a collective call
            seen = folder_seen_by(self.args.output_dir, self.args.hang_timeout)
            self._output_dir_shared = all(sees for _, _, _, sees in seen)
        if resume_from_checkpoint is None and self.args.overwrite_output_dir and self._writes_markers():
            checkpoint.retire_previous_run(self.args.output_dir)
        self._barrier()
        while True:
            try:
                return self._train_from(resume_from_checkpoint, **kwargs)
            except RollbackRequested as rollback:
                resume_from_checkpoint = self._roll_back(rollback.checkpoint_step)

    def _train_from(self, resume_from_checkpoint: Optional[str], **kwargs):
        self.loss_history.restore(resume_from_checkpoint)
        resumed_step = checkpoint.step_of(resume_from_checkpoint) if resume_from_checkpoint is not None else 0
        self.sample_log.restore(resumed_step if resume_from_checkpoint is not None else None, self.args.should_save)
        fresh = resume_from_checkpoint is None and self.args.overwrite_output_dir
        self.time_breakdown.restore(resume_from_checkpoint, self.args.output_dir, fresh)
        self.spikes.restore(resume_from_checkpoint)
        if self.router_watch is not None:
            self.router_watch.restore(resume_from_checkpoint)
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
        """Go back to checkpoint-``step`` (called on every rank): record the decision in output_dir, move the
        later (suspect) checkpoints aside, and return the folder to resume from.

        Raises:
            SpikeStopError: that checkpoint is no longer complete.
        """
        folder = os.path.join(self.args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        problem = checkpoint.checkpoint_problem(folder, verify_checksums=False)
        if problem is not None:
            raise SpikeStopError(
                f"loss_spike_policy rollback: the healthy checkpoint {folder} cannot be used ({problem}); "
                "lower learning_rate and restart"
            )
        if self.is_local_process_zero():
            self.spikes.record_rollback(step)
            spiked = self.spikes.state.events[-1]["step"]
            name = f"rolled-back-{self.spikes.state.rollbacks}-at-step-{spiked}"
            checkpoint.move_aside(self.args.output_dir, after_step=step, name=name)
        self._barrier()
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
        The loss is multiplied by ``INJECTED_SPIKE_FACTOR`` for the batch of ``debug_inject_spike_at_step``."""
        if self.router_watch is not None:
            self.router_watch.begin()
        result = super().compute_loss(model, inputs, return_outputs=return_outputs)
        aux = self.router_watch.take(result[0] if return_outputs else result) if self.router_watch else None
        if aux is not None:
            loss = (result[0] if return_outputs else result) + self.router_watch.aux_loss_coef * aux
            result = (loss, result[1]) if return_outputs else loss
        if self.watchdog is not None:
            self.watchdog.forward_done()
        if self.args.debug_inject_spike_at_step != self.state.global_step + 1:
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
        ``loss`` (the logged sum) for the verdict, which waits for the reduced gradients (``_judge_step``)."""
        self._enter("collective")  # the gradients' reduce, the verdict's all-reduce, until the optimizer
        self._step_loss = loss

    def _judge_step(self) -> None:
        """At paddlenlp's on_optimizer_begin (gradients reduced, optimizer not run): the NanGuard's verdict on
        the step's losses and the global norm of the gradients this rank's optimizer applies
        (``own_parameters``). A skipped step's losses leave the logged sum kept by ``_check_loss_valid`` and
        the logged average (paddlenlp divides by the steps since the last log, less the skipped ones). The
        step's mean loss is what it added to that sum: paddlenlp divides each micro-batch's loss by
        gradient_accumulation_steps, or with delayed loss scaling (``enable_delay_scale_loss`` in
        tensor_parallel_config, no pipeline) their sum, just before ``_check_loss_valid``; the pipeline returns
        the mean once. The same all-reduce agrees on a stop request (``pretrain.preemption``)."""
        step = self.state.global_step + 1
        self._wait_for_gradient_reduce()
        divisor = 1
        if self.args.pipeline_parallel_degree <= 1 and self._enable_delay_scale_loss():
            divisor = self.args.gradient_accumulation_steps
        skipped_step = self.nan_guard.verdict(
            own_parameters(self.optimizer),
            step,
            self.args.output_dir,
            requests=self.preemption.local_request(),
            loss_divisor=divisor,
            sharded=self.model_wrapped if isinstance(self.model_wrapped, SHARDING_WRAPPERS) else None,
            expert_clip=_expert_parallel_clip(self.optimizer),
        )
        self.preemption.agreed(self.nan_guard.agreed_requests, step)
        if skipped_step:
            if self.nan_guard.step_loss_sum is not None:
                self._step_loss.subtract_(self.nan_guard.step_loss_sum / divisor)
            self._skip_steps_since_last_logged += 1

    def _wait_for_gradient_reduce(self) -> None:
        """Under sharding stage2 with ``enable_stage2_overlap`` the last gradient bucket's reduce is still in
        flight at paddlenlp's on_optimizer_begin: paddle waits for it only inside the optimizer's
        step (``GroupShardedStage2._redefine_opt_step``: ``self._comm_task.wait()``). Wait for it here,
        so that the NaN guard reads reduced gradients (paddle's wait then returns at once)."""
        if getattr(self.optimizer, "_reduce_overlap", False) and getattr(self.optimizer, "_comm_task", None):
            self.optimizer._comm_task.wait()

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
        skipped = self._update_skipped(self.state.global_step)
        if skipped:
            self.loss_history.record_skipped(self.state.global_step)
        if self.bias_balancer is not None:  # the step's loads: a collective, every rank
            loads = self.router_watch.step_loads(self.args.world_size)
            if not skipped:
                self.bias_balancer.update(loads)
        super()._maybe_log_save_evaluate(tr_loss, model, epoch, ignore_keys_for_eval, **kwargs)
        self._enter("data", self.state.global_step + 1)

    def _writes_markers(self) -> bool:
        """Whether this process marks, rotates and moves aside the checkpoints of output_dir: global rank 0
        alone when every node sees the same output_dir (shared storage), else each node's local rank 0
        (node-local folders, each holding its node's copy)."""
        return self.is_world_process_zero() if self._output_dir_shared else self.is_local_process_zero()

    def _barrier(self):
        if self.args.world_size > 1:
            dist.barrier()

    def _load_from_checkpoint(self, resume_from_checkpoint=None):
        """paddlenlp's load of the weights, by data-parallel rank 0 of each model part; the other replicas get
        them when the model is wrapped for parallel training. Once it is wrapped (a rollback within the run)
        they get them here, as the wrapping does (paddle's ``sync_params_buffers`` over the data-parallel,
        then the sharding group): else they would train on with the weights the rollback abandoned."""
        super()._load_from_checkpoint(resume_from_checkpoint)
        if resume_from_checkpoint is None or self.args.world_size == 1 or self.model_wrapped is self.model:
            return
        if not self.args.use_hybrid_parallel:  # paddle.DataParallel: one replica group, the world
            sync_params_buffers(self.model, src_rank=0)
            return
        hcg = fleet.get_hybrid_communicate_group()
        if hcg.get_data_parallel_world_size() > 1:
            broadcast_dp_parameters(self.model, hcg)
        if hcg.get_sharding_parallel_world_size() > 1:
            broadcast_sharding_parameters(self.model, hcg)

    def _load_optimizer_and_scheduler(self, checkpoint):
        """paddlenlp's, except for a checkpoint saved over another sharding degree or stage
        (``pretrain.resume_layout``): data-parallel rank 0 reads the entries of its own parameters
        (``own_parameters``: under sharding, its part) from the union of its optimizer shards and broadcasts them
        over its data-parallel group (as paddlenlp does with one file), every rank's optimizer takes them, then
        the schedule.

        Raises:
            UserError: the sharding degree changed and the nodes keep output_dir in folders of their own
                (no rank sees every shard), or the shards cannot be merged (``resume_layout.optimizer_state``).
        """
        # ``checkpoint``: the folder, as paddlenlp names it (the module of that name is not used here)
        args = self.args
        state, problem = None, None
        if checkpoint is not None and not (args.should_load_sharding_stage1_model or args.ignore_load_lr_and_optim):
            layout = ParallelLayout.from_arguments(args, nnodes=1)
            trained = [p.name for p in own_parameters(self.optimizer) if not p.stop_gradient]
            try:
                state = optimizer_state(
                    checkpoint, layout, args.tensor_parallel_rank, args.pipeline_parallel_rank, trained
                )
            except UserError as error:
                problem = str(error)
        verdicts = [(state is not None, problem)]
        if args.world_size > 1:  # a collective call: every rank takes the same path
            verdicts = []
            dist.all_gather_object(verdicts, (state is not None, problem))
        if not any(resharded or problem for resharded, problem in verdicts):  # saved with this sharding degree
            return super()._load_optimizer_and_scheduler(checkpoint)
        if not self._output_dir_shared and args.world_size > 1:
            raise UserError(
                f"resume: {checkpoint} was saved over another sharding degree or stage, and the nodes keep output_dir "
                "in folders of their own, so no rank reads every optimizer shard; resume with the sharding degree "
                "that saved it, or copy every node's checkpoint files into one shared output_dir"
            )
        problems = [problem for _, problem in verdicts if problem is not None]
        if problems:
            raise UserError(problems[0])
        logger.info(
            "%s was saved over another sharding degree or stage: loading its optimizer shards merged", checkpoint
        )
        self.optimizer.set_state_dict(broadcast_dp_optimizer(state if args.data_parallel_rank == 0 else None))
        self.lr_scheduler.set_state_dict(paddle.load(os.path.join(checkpoint, SCHEDULER_NAME)))
        if self.do_grad_scaling:
            self.scaler.load_state_dict(paddle.load(os.path.join(checkpoint, SCALER_NAME), return_numpy=True))

    def _save_checkpoint(self, model, metrics=None):
        """paddlenlp's save plus the loss history; after every rank has written, the completion marker
        (one writer per output_dir, ``_writes_markers``); after every node has marked, rotation. Nothing while
        the NaN guard holds the weights unconfirmed (``NanGuard.may_save``: saved after the next applied step)."""
        if not self.nan_guard.may_save(self.state.global_step):  # a skipped step left the weights unconfirmed
            return
        left = self._enter("save")
        with self.step_timer.excluded(), self.time_breakdown.timed("checkpoint-save") as took:
            folder = os.path.join(self.args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            if self._writes_markers():
                checkpoint.discard_before_save(folder)
            self._barrier()
            super()._save_checkpoint(model, metrics)
            self.spikes.on_checkpoint(self.state.global_step)
            if self.args.should_save:
                self.loss_history.write(folder)
                self.spikes.write(folder)
                if self.router_watch is not None:
                    self.router_watch.write(folder)
                self.time_breakdown.write(folder, self.state.global_step)
            self._barrier()
            # One writer per output_dir: with node-local folders each node marks its own files.
            if self._writes_markers() and os.path.isdir(folder):
                checkpoint.mark_complete(folder, self.state.global_step)
                clear_pending_rollback(self.args.output_dir)  # this checkpoint holds the rollback's state
            self._barrier()  # every node has marked the new checkpoint: old ones may go
            if self._writes_markers():
                checkpoint.rotate(
                    self.args.output_dir,
                    self.args.save_total_limit,
                    self.state.global_step,
                    (self.state.best_model_checkpoint, self.spikes.healthy_checkpoint()),
                )
        if left is not None:
            self._enter(left)
        logger.info("saved %s in %.2f s", os.path.basename(folder), took["seconds"])
        if self.args.should_save:
            self.time_breakdown.write(self.args.output_dir, self.state.global_step)

    def _print_timer(self):
        """Called by paddlenlp once a step's logging, evaluation and saving are done: instead of printing
        its timers (``pretrain.metrics.time_breakdown`` reads them), mark the wait for the next batch."""
        self.time_breakdown.step_complete()

    def _save_initial_checkpoint(self) -> None:
        """checkpoint-0, the initial weights: what ``loss_spike_policy rollback`` goes back to when no later
        checkpoint is healthy."""
        # paddle creates Adam's moments and beta powers (and master weights) at the first step; created now, at
        # their initial values and with the names later checkpoints use, they are in checkpoint-0 for a rollback
        # to load. Only for the parameters this rank's optimizer updates (``own_parameters``), or a rollback's load
        # would miss the others and each shard would hold them all, never freed.
        trained = [p for p in own_parameters(self.optimizer) if not p.stop_gradient]
        _wrapped_optimizers(self.optimizer)[-1]._create_accumulators(
            paddle.static.default_main_program().global_block(), trained
        )
        self._save_checkpoint(self.model_wrapped)
        self.spikes.mark_initial_checkpoint()

    def _rotate_checkpoints(self, use_mtime=False, output_dir=None):
        """Disabled: paddlenlp rotates inside ``_save_checkpoint``, before the new checkpoint is complete
        (and, in a single process, never: it tests ``local_rank == 0`` where that is -1);
        ``_save_checkpoint`` above calls ``checkpoint.rotate`` once the new one is marked complete."""

    def _update_skipped(self, step: int) -> bool:
        """Whether step ``step`` (this process's latest) applied no update: skipped by nan_policy or
        loss_spike_policy, or inside a skipped data window (``skip_data_intervals``, a rollback's)."""
        windows = self.args.skip_data_intervals or []
        guarded = step in self.nan_guard.skipped_steps or step in self.spikes.state.skipped_steps
        return guarded or any(first <= step <= last for first, last in windows)

    def applied_steps(self) -> int:
        """Optimizer steps of the whole run (resumed or not, up to ``global_step``) whose update was applied:
        ``global_step`` less the skipped steps of the loss history."""
        return self.state.global_step - len(self.loss_history.skipped)

    def log(self, logs: dict, **kwargs) -> None:
        """Replace paddlenlp's ``interval_*`` rates of a training log with the interval's throughput, MFU
        (when credible), peak memory and time breakdown (``time_<phase>``, seconds per step), and on
        several ranks the max over ranks (``pretrain.metrics.rank_figures``; a collective: every rank logs), then
        log it and update ``<output_dir>/time_history.json``.

        Steps of the interval whose update was skipped (recorded in the loss history by
        ``_maybe_log_save_evaluate``) are counted in ``skipped_steps``; when every step was, the record has no
        ``loss`` (paddlenlp's would be 0.0).
        Evaluation logs (no ``loss`` key) pass through unchanged.
        """
        if "loss" in logs:
            first, self._last_train_log_step = self._last_train_log_step + 1, self.state.global_step
            skipped = [step for step in self.loss_history.skipped if step >= first]
            if skipped:
                logs = {**logs, "skipped_steps": len(skipped)}
            if len(skipped) == self.state.global_step - first + 1:
                logs = {key: value for key, value in logs.items() if key != "loss"}
        if "loss" in logs or "skipped_steps" in logs:
            logs = {key: value for key, value in logs.items() if not key.startswith("interval_")}
            logs.update(self.step_timer.interval_rates())
            logs.update({key: value for key, value in peak_memory_gib().items() if isinstance(value, float)})
            logs.update(self.time_breakdown.interval_record())
            if self.router_watch is not None:  # a collective on several ranks, as below
                logs.update(self.router_watch.record(self.state.global_step, self.args.world_size))
            if self.args.world_size > 1:
                logs.update(record_extremes(logs, self.args.world_size))
            if self.args.should_save:
                self.time_breakdown.write(self.args.output_dir, self.state.global_step, durable=False)
            self._name_slow_rank()
        super().log(logs, **kwargs)

    def _name_slow_rank(self) -> None:
        """Gather every rank's own seconds per step since the last record (a collective: every rank logs) and
        warn, on rank 0, when the slowest lags the median by more than ``slow_rank_threshold`` (not in the
        ``throughput_warmup_steps``, where the first steps' graph building and loads dominate)."""
        if self.watchdog is None:
            return
        warming_up = self.state.global_step <= self.args.throughput_warmup_steps  # graph building, first loads
        mine = (self.watchdog.work.take(), self.watchdog.node, self.watchdog.host)
        gathered = []
        dist.all_gather_object(gathered, mine)
        message = slow_rank_message(
            [seconds for seconds, _, _ in gathered],
            self.args.slow_rank_threshold,
            [(node, host) for _, node, host in gathered],
        )
        if message is not None and not warming_up and self.is_world_process_zero():
            logger.warning(message)
