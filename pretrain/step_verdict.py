"""The verdict on each optimizer step: applied, skipped (nan/inf or a loss spike) or the run stopped, judged
once the step's gradients are reduced and before the optimizer runs, and which steps applied no update.

paddlenlp's loop calls the trainer's ``_check_loss_valid`` once a step's backward is done (the logged loss sum
is kept, ``keep_loss``) and then ``on_optimizer_begin`` (this callback: ``judge``). The judgement itself is
the ``pretrain.nan_guard.NanGuard``'s (with the ``pretrain.recovery.SpikeWatch`` it holds); this module hands
it what paddle's wrappers hold at that moment and takes a skipped step's losses back out of the logged sum.
"""

from __future__ import annotations

from typing import Any

from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage2 import GroupShardedStage2
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage3 import GroupShardedStage3
from paddlenlp.trainer import TrainerCallback

from pretrain.optimizer_chain import expert_parallel_clip_of, own_parameters

SHARDING_WRAPPERS = (GroupShardedStage2, GroupShardedStage3)  # the model wrappers whose step finishes the reduce


class StepVerdict(TrainerCallback):
    """Judges each optimizer step at paddlenlp's ``on_optimizer_begin`` (gradients reduced, optimizer not run).

    Args:
        trainer: the ``PretrainingTrainer`` (read: ``args``, ``state``, ``optimizer``, ``model_wrapped``,
            ``nan_guard``, ``preemption``, ``spikes``, ``_enable_delay_scale_loss()``; written: paddlenlp's
            ``_skip_steps_since_last_logged``).
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self._step_loss: Any = None  # paddlenlp's logged loss sum, from keep_loss to the verdict

    def keep_loss(self, loss) -> None:
        """Keep ``loss`` (paddlenlp's logged sum, a 0-D tensor) for the verdict, which may take a skipped step's
        losses back out of it."""
        self._step_loss = loss

    def on_optimizer_begin(self, args, state, control, **kwargs):
        self.judge()

    def wait_for_gradient_reduce(self) -> None:
        """Under sharding stage2 with ``enable_stage2_overlap`` the last gradient bucket's reduce is still in
        flight at paddlenlp's on_optimizer_begin: paddle waits for it only inside the optimizer's
        step (``GroupShardedStage2._redefine_opt_step``: ``self._comm_task.wait()``). Wait for it here,
        so that the NaN guard reads reduced gradients (paddle's wait then returns at once)."""
        optimizer = self.trainer.optimizer
        if getattr(optimizer, "_reduce_overlap", False) and getattr(optimizer, "_comm_task", None):
            optimizer._comm_task.wait()

    def judge(self) -> None:
        """The NanGuard's verdict on the step's losses and the global norm of the gradients this rank's optimizer
        applies (``own_parameters``). A skipped step's losses leave the logged sum kept by ``keep_loss`` and the
        logged average (paddlenlp divides by the steps since the last log, less the skipped ones). The step's
        mean loss is what it added to that sum: paddlenlp divides each micro-batch's loss by
        gradient_accumulation_steps, or with delayed loss scaling (``enable_delay_scale_loss`` in
        tensor_parallel_config, no pipeline) their sum, just before ``_check_loss_valid``; the pipeline returns
        the mean once. The same all-reduce agrees on a stop request (``pretrain.preemption``).

        Raises:
            NonFiniteLossError: nan_policy stop, or too many skipped steps (``pretrain.nan_guard``).
            SpikeStopError, RollbackRequested: the loss spike policy's decision (``pretrain.recovery``).
        """
        trainer = self.trainer
        step = trainer.state.global_step + 1
        self.wait_for_gradient_reduce()
        divisor = 1
        if trainer.args.pipeline_parallel_degree <= 1 and trainer._enable_delay_scale_loss():
            divisor = trainer.args.gradient_accumulation_steps
        guard = trainer.nan_guard
        skipped_step = guard.verdict(
            own_parameters(trainer.optimizer),
            step,
            trainer.args.output_dir,
            requests=trainer.preemption.local_request(),
            loss_divisor=divisor,
            sharded=trainer.model_wrapped if isinstance(trainer.model_wrapped, SHARDING_WRAPPERS) else None,
            expert_clip=expert_parallel_clip_of(trainer.optimizer),
        )
        trainer.preemption.agreed(guard.agreed_requests, step)
        if skipped_step:
            if guard.step_loss_sum is not None:
                self._step_loss.subtract_(guard.step_loss_sum / divisor)
            trainer._skip_steps_since_last_logged += 1

    def applied_no_update(self, step: int) -> bool:
        """Whether step ``step`` (this process's latest) applied no update: skipped by nan_policy or
        loss_spike_policy, or inside a skipped data window (``skip_data_intervals``, a rollback's)."""
        trainer = self.trainer
        windows = trainer.args.skip_data_intervals or []
        guarded = step in trainer.nan_guard.skipped_steps or step in trainer.spikes.state.skipped_steps
        return guarded or any(first <= step <= last for first, last in windows)
