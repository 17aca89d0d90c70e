"""The pretraining trainer's checkpoints: save, verify, mark, rotate, discard, roll back and load over another
sharding degree, around paddlenlp's own save and load, with the run's state kept inside each checkpoint.

The run's state beside the weights and optimizer is held by objects of one protocol (``RunState``): the loss
history, the sample log, the time breakdown, the spike watch and a mixture of experts' routing records. The
manager restores each from the checkpoint a run starts from and writes each into every checkpoint it saves,
before the checkpoint is marked complete (``pretrain.checkpoint``: sizes and checksums, after every rank has
written; one writer per output_dir, ``writes_markers``). Old checkpoints are rotated only once every node has
marked the new one; the last healthy one (``pretrain.recovery``) is always kept.
"""

from __future__ import annotations

import os
from typing import Callable, Optional, Protocol

import paddle
import paddle.distributed as dist
from paddle.distributed import fleet
from paddle.distributed.fleet.utils.hybrid_parallel_util import broadcast_dp_parameters, broadcast_sharding_parameters
from paddle.distributed.parallel import sync_params_buffers
from paddlenlp.trainer.trainer import SCALER_NAME, SCHEDULER_NAME
from paddlenlp.trainer.trainer_utils import PREFIX_CHECKPOINT_DIR
from paddlenlp.trainer.utils.helper import broadcast_dp_optimizer

from pretrain import checkpoint
from pretrain.cluster.shared_folder import folder_seen_by
from pretrain.errors import UserError
from pretrain.layout import ParallelLayout
from pretrain.log import logger
from pretrain.optimizer_chain import create_own_moments, own_parameters, restore_stage2_views
from pretrain.recovery import SpikeStopError, clear_pending_rollback
from pretrain.resume_layout import optimizer_state, reshards_optimizer


class RunState(Protocol):
    """A part of the run's state kept inside every checkpoint, beside paddlenlp's."""

    def restore(self, checkpoint_folder: Optional[str]) -> None:
        """Start from ``checkpoint_folder`` (None: a run from scratch). Called again after a rollback."""

    def write(self, folder: str) -> None:
        """Write this part into ``folder`` (a checkpoint being saved; the process that saves, rank 0)."""


class CheckpointManager:
    """The checkpoints of one run, on every rank (each method is called on every rank unless it says otherwise).

    Args:
        trainer: the ``PretrainingTrainer`` (read: ``args``, ``state``, ``optimizer``, ``model``,
            ``model_wrapped``, ``lr_scheduler``, ``scaler``, ``do_grad_scaling``, ``is_world_process_zero()``,
            ``is_local_process_zero()``, ``nan_guard``, ``spikes``, ``step_timer``, ``time_breakdown``).
        states: the run's ``RunState`` parts, restored and written in this order.
    """

    def __init__(self, trainer, states: list):
        self.trainer = trainer
        self.states = states
        self.output_dir_shared = False  # every rank sees the same output_dir (``find_shared_output_dir``)

    @property
    def args(self):
        return self.trainer.args

    def find_shared_output_dir(self) -> None:
        """Whether every rank sees the same output_dir (a collective on several ranks: a probe file)."""
        if self.args.world_size > 1:
            seen = folder_seen_by(self.args.output_dir, self.args.hang_timeout)
            self.output_dir_shared = all(sees for _, _, _, sees in seen)

    def writes_markers(self) -> bool:
        """Whether this process marks, rotates and moves aside the checkpoints of output_dir: global rank 0
        alone when every node sees the same output_dir (shared storage), else each node's local rank 0
        (node-local folders, each holding its node's copy)."""
        trainer = self.trainer
        return trainer.is_world_process_zero() if self.output_dir_shared else trainer.is_local_process_zero()

    def barrier(self) -> None:
        if self.args.world_size > 1:
            dist.barrier()

    def retire_previous_run(self) -> None:
        """A run from scratch with ``overwrite_output_dir``: move an earlier run's checkpoints aside."""
        if self.args.overwrite_output_dir and self.writes_markers():
            checkpoint.retire_previous_run(self.args.output_dir)

    def restore(self, checkpoint_folder: Optional[str]) -> None:
        """Every ``RunState`` from ``checkpoint_folder`` (None: from scratch)."""
        for state in self.states:
            state.restore(checkpoint_folder)

    def save(self, paddlenlp_save: Callable[[], None]) -> None:
        """Save ``checkpoint-<global_step>``: discard an incomplete folder of that name, run ``paddlenlp_save``
        (paddlenlp's ``_save_checkpoint``) on every rank, write the run's states (rank 0), mark it complete once
        every rank has written, then rotate once every node has marked it. Nothing while the NaN guard holds
        the weights unconfirmed (``NanGuard.may_save``: saved after the next applied step)."""
        trainer, args = self.trainer, self.args
        step = trainer.state.global_step
        if not trainer.nan_guard.may_save(step):  # a skipped step left the weights unconfirmed
            return
        left = trainer._enter("save")
        with trainer.step_timer.excluded(), trainer.time_breakdown.timed("checkpoint-save") as took:
            folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
            if self.writes_markers():
                checkpoint.discard_before_save(folder)
            self.barrier()
            paddlenlp_save()
            trainer.spikes.on_checkpoint(step)
            if args.should_save:
                for state in self.states:
                    state.write(folder)
            self.barrier()
            # One writer per output_dir: with node-local folders each node marks its own files.
            if self.writes_markers() and os.path.isdir(folder):
                checkpoint.mark_complete(folder, step)
                clear_pending_rollback(args.output_dir)  # this checkpoint holds the rollback's state
            self.barrier()  # every node has marked the new checkpoint: old ones may go
            if self.writes_markers():
                checkpoint.rotate(
                    args.output_dir,
                    args.save_total_limit,
                    step,
                    (trainer.state.best_model_checkpoint, trainer.spikes.healthy_checkpoint()),
                )
        if left is not None:
            trainer._enter(left)
        logger.info("saved %s in %.2f s", os.path.basename(folder), took["seconds"])
        if args.should_save:
            trainer.time_breakdown.write(args.output_dir)

    def save_initial(self, paddlenlp_save: Callable[[], None]) -> None:
        """checkpoint-0, the initial weights with Adam's moments at their initial values
        (``optimizer_chain.create_own_moments``): what ``loss_spike_policy rollback`` goes back to when no later
        checkpoint is healthy."""
        create_own_moments(self.trainer.optimizer)
        self.save(paddlenlp_save)
        self.trainer.spikes.mark_initial_checkpoint()

    def roll_back(self, step: int) -> str:
        """Go back to checkpoint-``step``: record the decision in output_dir, move the later (suspect)
        checkpoints into ``output_dir/rolled-back-<n>-at-step-<spike>/``, and return the folder to resume from.

        Raises:
            SpikeStopError: that checkpoint is no longer complete.
        """
        trainer = self.trainer
        folder = os.path.join(self.args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        problem = checkpoint.checkpoint_problem(folder, verify_checksums=False)
        if problem is not None:
            raise SpikeStopError(
                f"loss_spike_policy rollback: the healthy checkpoint {folder} cannot be used ({problem}); "
                "lower learning_rate and restart"
            )
        if trainer.is_local_process_zero():
            trainer.spikes.record_rollback(step)
            spiked = trainer.spikes.state.events[-1]["step"]
            name = f"rolled-back-{trainer.spikes.state.rollbacks}-at-step-{spiked}"
            checkpoint.move_aside(self.args.output_dir, after_step=step, name=name)
        self.barrier()
        return folder

    def share_loaded_weights(self, checkpoint_folder: Optional[str]) -> None:
        """After paddlenlp's load of the weights (by data-parallel rank 0 of each model part): once the model is
        wrapped for parallel training (a rollback within the run), the other replicas get them here, as the
        wrapping does (paddle's ``sync_params_buffers`` over the data-parallel, then the sharding group); else
        they would train on with the weights the rollback abandoned. Under sharding stage2 the parameters first
        become views of stage2's buffers again (``optimizer_chain.restore_stage2_views``)."""
        trainer = self.trainer
        if checkpoint_folder is None or self.args.world_size == 1 or trainer.model_wrapped is trainer.model:
            return
        restore_stage2_views(trainer.optimizer)
        if not self.args.use_hybrid_parallel:  # paddle.DataParallel: one replica group, the world
            sync_params_buffers(trainer.model, src_rank=0)
            return
        hcg = fleet.get_hybrid_communicate_group()
        if hcg.get_data_parallel_world_size() > 1:
            broadcast_dp_parameters(trainer.model, hcg)
        if hcg.get_sharding_parallel_world_size() > 1:
            broadcast_sharding_parameters(trainer.model, hcg)

    def load_optimizer_and_scheduler(self, checkpoint_folder: Optional[str], paddlenlp_load: Callable[[], None]):
        """paddlenlp's load (``paddlenlp_load``), except for a checkpoint saved over another sharding degree or
        stage (``pretrain.resume_layout``): data-parallel rank 0 alone reads the entries of its own parameters
        (``own_parameters``: under sharding, its part) from the union of its optimizer shards and broadcasts them
        over its data-parallel group (as paddlenlp does with one file: the other replicas hold only what the
        broadcast brings, never a copy of their own besides), every rank's optimizer takes them, then the
        schedule.

        Raises:
            UserError: the sharding degree changed and the nodes keep output_dir in folders of their own
                (no rank sees every shard), or the shards cannot be merged (``resume_layout.optimizer_state``).
        """
        trainer, args = self.trainer, self.args
        if checkpoint_folder is None:  # from scratch, on every rank
            return paddlenlp_load()
        state, problem, resharded = None, None, False
        if not (args.should_load_sharding_stage1_model or args.ignore_load_lr_and_optim):
            layout = ParallelLayout.from_arguments(args, nnodes=1)
            resharded = reshards_optimizer(checkpoint_folder, layout)
            trained = [p.name for p in own_parameters(trainer.optimizer) if not p.stop_gradient]
            try:
                if resharded and args.data_parallel_rank == 0:  # the replicas get it by the broadcast below
                    state = optimizer_state(
                        checkpoint_folder, layout, args.tensor_parallel_rank, args.pipeline_parallel_rank, trained
                    )
            except UserError as error:
                problem = str(error)
        verdicts = [(resharded, problem)]
        if args.world_size > 1:  # a collective call: every rank takes the same path
            verdicts = []
            dist.all_gather_object(verdicts, (resharded, problem))
        if not any(resharded or problem for resharded, problem in verdicts):  # saved with this sharding degree
            return paddlenlp_load()
        if not self.output_dir_shared and args.world_size > 1:
            raise UserError(
                f"resume: {checkpoint_folder} was saved over another sharding degree or stage, and the nodes keep "
                "output_dir in folders of their own, so no rank reads every optimizer shard; resume with the "
                "sharding degree that saved it, or copy every node's checkpoint files into one shared output_dir"
            )
        problems = [problem for _, problem in verdicts if problem is not None]
        if problems:
            raise UserError(problems[0])
        logger.info(
            "%s was saved over another sharding degree or stage: loading its optimizer shards merged",
            checkpoint_folder,
        )
        trainer.optimizer.set_state_dict(broadcast_dp_optimizer(state if args.data_parallel_rank == 0 else None))
        trainer.lr_scheduler.set_state_dict(paddle.load(os.path.join(checkpoint_folder, SCHEDULER_NAME)))
        if trainer.do_grad_scaling:
            trainer.scaler.load_state_dict(paddle.load(os.path.join(checkpoint_folder, SCALER_NAME), return_numpy=True))
        return None
