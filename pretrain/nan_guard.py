"""Divergence guard: a non-finite loss or gradient stops the run, or skips the optimizer step up to K times.

paddlenlp's Trainer checks the accumulated loss once per optimizer step (``_check_loss_valid``)
and raises a bare ``ValueError``; a diverged model can keep a finite loss, though (paddle's CPU
cross-entropy returns ln(vocabulary) for non-finite logits), while its gradients and then its
weights turn to nan. Under fp16 paddlenlp relies on the loss scaler, which skips the optimizer
update when it finds inf/nan gradients (paddle's optimizer skips every parameter and moment update
while its auxiliary variable ``found_inf`` is true). This guard builds on the same mechanism for
every dtype, with one collective and one host sync per optimizer step, none per micro-batch:

- each micro-batch loss is checked on the device (``add_loss``): a non-finite one sets the step's
  flag and contributes 0 to the logged loss;
- once per optimizer step (``verdict``, once the gradients are reduced, before the optimizer runs) the
  flag is joined by the squared global norm of the gradients (``global_squared_norm``: under hybrid
  parallelism paddle's global-norm reduction adds up to 4 scalar all-reduces; unless the fp16 loss scaler
  owns the gradients; non-finite when a gradient is), the step's mean loss (and a caller's request code),
  all-reduced (MAX, one vector) over all ranks and read once,
  so every rank stops, skips or rolls back the same step and none waits in a collective; the
  agreed mean loss and gradient norm go to the ``pretrain.recovery.SpikeWatch`` (loss_spike_policy,
  checkpoint health), which may skip the step or request a rollback itself;
- ``nan_policy="stop"``: raise ``NonFiniteLossError`` naming the step and the last healthy
  checkpoint (or that none is known: see ``pretrain.recovery``); nothing is saved after the bad step;
- ``nan_policy="skip"``: set ``found_inf`` on the optimizer for that step (weights, Adam moments
  and beta powers stay as they were; the batch is dropped; the LR schedule moves on), remove the
  step from the logged loss average, and stop as above on the ``max_skipped_nan_steps + 1``-th bad step;
  under fp16 the loss scaler sets ``found_inf`` itself, so the guard's skip goes through it
  (``ScalerSkip``; the LR schedule then waits, as paddlenlp does for an overflowing step);
- a skipped step (either policy) leaves the weights it was computed on *unconfirmed* until a later step
  on them is applied: a bad batch is followed by a good step, a diverged model never is (every step
  after it is skipped). Meanwhile no checkpoint is saved (``may_save``: a checkpoint due then is saved
  at the first applied step, a stop request saves none) and the run cannot end: a skipped last step
  stops it as above, without saving the final model;
- before any weights are saved (``check_weights``) they are checked too: a checkpoint with
  non-finite weights is never written, let alone marked complete.
"""

from __future__ import annotations

import math
from typing import Optional

import paddle
import paddle.distributed as dist
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.hybrid_parallel_optimizer import HybridParallelClipGrad
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage3 import GroupShardedStage3
from paddlenlp.trainer import TrainerCallback

from pretrain import checkpoint
from pretrain.errors import UserError
from pretrain.log import logger
from pretrain.recovery import RollbackRequested, SpikeStopError, SpikeWatch
from pretrain.upstream import verified

NAN_POLICIES = ("stop", "skip")


def _gradient(parameter: paddle.Tensor) -> Optional[paddle.Tensor]:
    """The gradient the optimizer will apply, as far as this rank holds it: under sharding stage3 this rank's
    slice of a sliced parameter's reduced gradient (``bw_storage``: paddle's ``GroupShardedStage3`` clears
    ``grad``), else ``main_grad`` (fp32, under AMP master grads) or ``grad``."""
    for held in (getattr(parameter, "bw_storage", None), getattr(parameter, "main_grad", None)):
        if held is not None:
            return held
    return parameter.grad


def _weights(parameter: paddle.Tensor) -> paddle.Tensor:
    """The weights of ``parameter`` this rank holds: under sharding stage3 its slice of a sliced parameter
    (``fw_storage``: ``GroupShardedStage3`` frees the parameter itself outside forward and backward), else
    the parameter."""
    held = getattr(parameter, "fw_storage", None)
    return held if held is not None else parameter


def _whole_under_stage3(parameter: paddle.Tensor, sharded) -> bool:
    """Whether ``parameter`` is one sharding stage3 keeps whole on every rank (paddle's ``_UnsliceParam``: at most
    ``segment_size`` elements), whose reduced gradient every rank then holds alike."""
    return isinstance(sharded, GroupShardedStage3) and getattr(parameter, "unslice", False)


def _applied_gradient(parameter: paddle.Tensor, sharded=None) -> Optional[paddle.Tensor]:
    """``_gradient`` as the optimizer will apply it, given the model's sharding wrapper ``sharded`` (paddle's
    ``GroupShardedStage2`` or ``GroupShardedStage3``, else None); paddle 3.3.1 finishes reducing some gradients
    inside the optimizer's step, after paddlenlp's on_optimizer_begin, and this does the same on a copy:

    - stage2: the owner's gradient is the sum over the sharding group and, over a data-parallel group, not yet
      reduced: paddle scales it by 1/N (``_world_size_scaling``, in the step when ``scale_in_opt``: every
      gradient but fp16 ones without ``main_grad``) and 1/dp, then all-reduces it over the data-parallel group
      (``group_sharded_stage2.py`` ``_redefine_opt_step``: ``_grad_scale``, ``_dp_allreduce``);
    - stage3: a whole (unsliced) tensor's gradient is still this rank's own: paddle scales it by 1/N and
      all-reduces it over the sharding group, then by 1/dp over the data-parallel one (``group_sharded_stage3.py``
      ``_update_params``, step 2); a sliced one's slice (``bw_storage``) was reduced during backward.
    """
    grad = _gradient(parameter)
    if grad is None or sharded is None:
        return grad
    data_parallel = sharded._dp_group
    if isinstance(sharded, GroupShardedStage3):
        if not _whole_under_stage3(parameter, sharded):
            return grad
        grad = grad.clone()
        grad.scale_(scale=sharded._world_size_scaling)
        dist.all_reduce(grad, group=sharded._group)
        if data_parallel is not None and data_parallel.nranks > 1:
            grad.scale_(scale=1.0 / data_parallel.nranks)
            dist.all_reduce(grad, group=data_parallel)
        return grad
    scale = sharded._world_size_scaling if sharded.scale_in_opt else 1.0
    if data_parallel is not None and data_parallel.nranks > 1:
        grad = grad.clone()
        dist.all_reduce(grad, group=data_parallel)
        scale /= data_parallel.nranks
    return grad * scale if scale != 1.0 else grad


def global_squared_norm(parameters, hcg=None, sharded=None, expert_clip=None) -> paddle.Tensor:
    """The squared L2 norm of the whole model's gradient, reduced the way paddle's ``HybridParallelClipGrad``
    (the global-norm clip paddlenlp runs under fleet) reduces it: this rank's sum of squares of its
    tensor-parallel (``is_distributed``) gradients and of the others (a pipeline parameter shared between
    stages counted where ``is_firstly_shared``), then its ``_global_norm``: each all-reduced (SUM) over the
    sharding group, the distributed one over the model-parallel group, both over the pipeline group. Without
    ``hcg`` (one process, or paddle's ``DataParallel``, whose gradients are averaged during backward) the
    local sums are the whole.

    Args:
        parameters: the parameters whose gradients this rank's optimizer applies (``optimizer_chain.own_parameters``),
            once their gradients are reduced over the data-parallel and sharding groups (paddlenlp's
            ``on_optimizer_begin``); under sharding stage3 the model's trainable parameters are taken instead (the
            slices of the sliced ones, ``bw_storage``, and the whole ones).
        hcg: fleet's hybrid communicate group under hybrid parallelism, else None.
        sharded: under sharding stage2 or stage3 the model's ``GroupShardedStage2``/``GroupShardedStage3``
            wrapper, whose deferred reductions are applied first (``_applied_gradient``); stage3's whole tensors,
            then alike on every rank, count once, beside the sliced ones' sum over the ranks. Without this the
            norm was 2.0000 x the clipped one under stage2 on 2 ranks (N x on N), 1.78-1.97 x under stage3.
        expert_clip: under expert parallelism the optimizer's ``pretrain.compat.moe.ExpertParallelClip``, whose
            norm (each rank's experts summed over the expert group, then the shards) is the one taken (without
            it the other ranks' experts were left out: 0.998 x the clipped norm on 2 ranks), else None.
    Returns:
        float32 ``[]``: the same on every rank; non-finite when a gradient is.
    """
    if expert_clip is not None:
        return expert_clip.squared_norm([(param, _applied_gradient(param, sharded)) for param in parameters])
    if isinstance(sharded, GroupShardedStage3):
        # from the first step on, the optimizer's list holds paddle's slice wrappers (``_update_params``:
        # ``_TensorWrapper``), whose gradients are the last step's: the model's own parameters hold this step's
        parameters = [param for param in sharded._layer.parameters() if param.trainable]
    squares: dict = {True: [], False: [], "whole": []}  # is_distributed (or stage3's whole tensors) -> sums
    for parameter in parameters:
        grad = _applied_gradient(parameter, sharded)
        if grad is not None and getattr(parameter, "is_firstly_shared", True):
            key = "whole" if _whole_under_stage3(parameter, sharded) else bool(parameter.is_distributed)
            squares[key].append(paddle.square(grad.astype("float32")).sum())
    dist, not_dist, whole = (
        paddle.add_n(squares[key]).reshape([1]) if squares[key] else paddle.zeros([1], dtype="float32")
        for key in (True, False, "whole")
    )
    if hcg is not None:
        HybridParallelClipGrad(None, hcg)._global_norm(dist, not_dist)  # in place, paddle's collectives
    return (dist + not_dist + whole).reshape([])


class ScalerSkip:
    """Makes the fp16 loss scaler's next ``step`` skip the optimizer update, leaving its loss scale alone.

    paddle 3.3.1's ``GradScaler.step`` sets the optimizer's ``found_inf`` to its own overflow check
    (``self._found_inf``, computed by ``self._unscale``, which fleet's distributed, sharded and master-grad
    scalers replace per instance) over any value set before, and paddlenlp 3.0.0b4 calls it right after
    ``on_optimizer_begin``: a step the guard skipped was applied. Created in ``on_optimizer_begin``, this
    follows the scaler's own ``_unscale`` with ``_found_inf = True`` for that step: the optimizer skips the
    update and paddlenlp, seeing that it did not run (``_cache_found_inf``), leaves the LR schedule where it
    was. ``end`` (in ``on_optimizer_end``, after paddlenlp's ``scaler.update()``) removes the hook and, unless
    the gradients overflowed too, puts back the loss scale and its counters (``update`` counted the skip as
    an overflow, and halves the scale after ``decr_every_n_nan_or_inf`` of them).

    Args:
        scaler: paddlenlp's ``Trainer.scaler`` (a ``paddle.amp.GradScaler``, possibly patched by fleet).
    """

    def __init__(self, scaler):
        verified("fp16-unscale-verdict")  # applied on any version: at most a warning
        self.scaler = scaler
        self.own_unscale = vars(scaler).get("_unscale")  # fleet's per-instance replacement; None: the class's
        self.unscale = scaler._unscale
        self.saved = (scaler._scale, scaler._incr_count, scaler._decr_count)
        self.overflowed = False
        scaler._unscale = self._unscale_and_skip

    def _unscale_and_skip(self, optimizer) -> None:
        self.unscale(optimizer)
        self.overflowed = bool(self.scaler._found_inf)  # the scaler's own verdict (a host sync, skipped steps only)
        self.scaler._found_inf = True

    def end(self) -> None:
        """Called after the scaler's ``step`` and ``update``: the scaler is as before, but for a real overflow."""
        if self.own_unscale is None:
            del self.scaler._unscale
        else:
            self.scaler._unscale = self.own_unscale
        if not self.overflowed:
            self.scaler._scale, self.scaler._incr_count, self.scaler._decr_count = self.saved


class NonFiniteLossError(UserError):
    """The loss, the gradients or the weights became nan/inf and the policy says stop."""


class NanGuard(TrainerCallback):
    """Checks losses and gradients once per optimizer step; tells the optimizer to skip a bad step or stops the run.

    Args:
        policy: one of NAN_POLICIES ("stop" or "skip"; the argument parser enforces it).
        max_skipped_steps: bad optimizer steps skipped before the run stops (policy "skip").
        world_size: processes that must agree on the verdict (all-reduce when > 1).
        check_gradients: check the gradients too (False when the fp16 loss scaler skips
            overflowing steps itself, as it must).
        spikes: the run's ``SpikeWatch``, which judges the agreed loss and gradient norm (None: not judged).
        hcg: fleet's hybrid communicate group under hybrid parallelism (the gradient norm is reduced over it,
            ``global_squared_norm``), else None.
    """

    def __init__(
        self,
        policy: str,
        max_skipped_steps: int,
        world_size: int,
        check_gradients: bool = True,
        spikes: Optional[SpikeWatch] = None,
        hcg=None,
    ):
        self.policy = policy
        self.hcg = hcg
        self.spikes = spikes
        self.max_skipped_steps = max_skipped_steps
        self.world_size = world_size
        self.check_gradients = check_gradients
        self.skipped_steps = []  # global steps whose update was skipped
        self.unconfirmed_since: Optional[int] = None  # first skipped step since the last applied one
        self.checkpoint_due = False  # a checkpoint was due while the weights were unconfirmed
        self._max_steps: Optional[int] = None  # the run's last step (on_train_begin; None: not known)
        self._step_is_bad = False  # this optimizer step's verdict, for on_optimizer_begin
        self._scaler_skip: Optional[ScalerSkip] = None  # fp16: this skipped step's hook on the loss scaler
        self.keep_lr_schedule = False  # a loss_spike_policy skip: the LR schedule does not move either
        self.agreed_requests = 0  # the last verdict's request code, the maximum over all ranks
        self._loss_is_bad = None  # [] bool tensor: a micro-batch loss of this step was non-finite
        self.step_loss_sum = None  # [] tensor: the finite micro-batch losses of this step, summed

    def on_train_begin(self, args, state, control, **kwargs):
        # a fresh start, a resumed checkpoint or a rollback's: weights no skipped step has judged
        self.unconfirmed_since, self.checkpoint_due, self._max_steps = None, False, state.max_steps

    def on_step_end(self, args, state, control, **kwargs):
        if self.checkpoint_due and self.unconfirmed_since is None:  # an update confirmed the weights
            control.should_save = True
            self.checkpoint_due = False

    def may_save(self, step: int) -> bool:
        """Whether a checkpoint of ``step`` may be saved: not while the weights are unconfirmed (the updates
        since the last applied step were skipped); it is then due at the first applied step, said in one line."""
        if self.unconfirmed_since is None:
            return True
        self.checkpoint_due = True
        logger.warning(
            "checkpoint-%d not saved: %s; it is saved after the next applied step", step, self._unconfirmed(step)
        )
        return False

    def _unconfirmed(self, step: int) -> str:
        """Why the weights are unconfirmed at ``step``: e.g. "the updates of steps 3-8 were skipped, so no applied
        step confirmed the weights of step 2"."""
        since = self.unconfirmed_since
        assert since is not None  # a step was skipped
        updates = f"the updates of steps {since}-{step} were" if since < step else f"the update of step {step} was"
        return f"{updates} skipped, so no applied step confirmed the weights of step {since - 1}"

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_is_bad = self.keep_lr_schedule = False
        self._loss_is_bad = None
        self.step_loss_sum = None

    def on_optimizer_begin(self, args, state, control, optimizer=None, scaler=None, **kwargs):
        # Read by paddle's Optimizer.step (also through HybridParallelOptimizer and the sharding
        # optimizers, which forward attributes to the inner optimizer): True skips the update.
        # Under fp16 the loss scaler sets it itself: see ScalerSkip.
        if scaler is None:
            optimizer._set_auxiliary_var("found_inf", self._step_is_bad)
        elif self._step_is_bad:
            self._scaler_skip = ScalerSkip(scaler)

    def on_optimizer_end(self, args, state, control, lr_scheduler=None, scaler=None, **kwargs):
        if self._scaler_skip is not None:
            self._scaler_skip.end()
            self._scaler_skip = None
        # paddlenlp stepped the schedule after the (skipped) optimizer step: a spike skip takes it back.
        # Under fp16 it steps it only when the scaler ran the optimizer, which a skipped step never does.
        if self.keep_lr_schedule and lr_scheduler is not None and scaler is None:
            lr_scheduler.step(lr_scheduler.last_epoch - 1)

    def add_loss(self, loss: paddle.Tensor) -> paddle.Tensor:
        """Record one micro-batch loss (a scalar tensor) on the device, without a host sync.

        Returns:
            The loss to accumulate: the loss itself, or 0 when it is not finite.
        """
        finite = paddle.isfinite(loss)
        kept = paddle.where(finite, loss, paddle.zeros_like(loss))
        bad = paddle.logical_not(finite)
        self._loss_is_bad = bad if self._loss_is_bad is None else paddle.logical_or(self._loss_is_bad, bad)
        self.step_loss_sum = kept if self.step_loss_sum is None else self.step_loss_sum + kept
        return kept

    def _max_over_ranks(self, codes: paddle.Tensor) -> list:
        """The element-wise maximum of ``codes`` (a [n] int tensor) over all ranks (one all-reduce, one host sync)."""
        codes = codes.astype("int32").reshape([-1])
        if self.world_size > 1:
            dist.all_reduce(codes, op=dist.ReduceOp.MAX)
        return codes.numpy().tolist()

    def _any_rank(self, code: paddle.Tensor) -> int:
        """The largest verdict code of all ranks (one all-reduce, one host sync)."""
        return self._max_over_ranks(code)[0]

    def _step_figures(self, parameters, requests: int, loss_divisor: int, sharded=None, expert_clip=None) -> tuple:
        """(bad loss, bad gradients, loss, gradient norm, request code) of this step, the same on every rank:
        one all-reduce (MAX) of [bad loss, bad gradients, this rank's mean micro-batch loss, the squared global
        gradient norm (``global_squared_norm``: equal on every rank), ``requests``] and one host sync. The loss
        is thus the largest rank's mean (the step's losses summed as paddlenlp's loop sums them, over
        ``loss_divisor``), the norm the global one (None when the gradients are not checked)."""
        zero = paddle.zeros([], dtype="float32")
        bad_loss = self._loss_is_bad.astype("float32") if self._loss_is_bad is not None else zero
        loss_sum = self.step_loss_sum.astype("float32") if self.step_loss_sum is not None else zero
        mean_loss = loss_sum.reshape([]) / loss_divisor
        grad_sq = global_squared_norm(parameters, self.hcg, sharded, expert_clip) if self.check_gradients else zero
        bad_grad = paddle.logical_not(paddle.isfinite(grad_sq)).astype("float32")
        request = paddle.full([], float(requests), dtype="float32")
        figures = paddle.stack([bad_loss.reshape([]), bad_grad, mean_loss, grad_sq, request])
        if self.world_size > 1:
            dist.all_reduce(figures, op=dist.ReduceOp.MAX)
        bad_losses, bad_grads, loss, total_sq, agreed = figures.numpy().tolist()
        grad_norm = None
        if self.check_gradients:
            grad_norm = math.sqrt(total_sq) if math.isfinite(total_sq) else total_sq
        return bad_losses > 0, bad_grads > 0, loss, grad_norm, int(agreed)

    def verdict(
        self,
        parameters,
        step: int,
        output_dir: str,
        requests: int = 0,
        loss_divisor: int = 1,
        sharded=None,
        expert_clip=None,
    ) -> bool:
        """Judge optimizer step ``step`` (1-based) once its gradients are computed and reduced, before the
        optimizer runs.

        With a ``SpikeWatch`` the step's agreed loss and gradient norm are judged too (``loss_spike_policy``).

        Args:
            parameters: the parameters this rank's optimizer applies gradients to (their ``main_grad`` or
                ``grad`` is checked; under sharding stage3 this rank's slice of a sliced parameter's gradient,
                the other ranks checking theirs; ``global_squared_norm``).
            requests: a code (int >= 0) this rank's caller wants agreed in the same all-reduce (e.g.
                ``pretrain.preemption``'s stop request): its maximum over all ranks is left in
                ``agreed_requests``.
            loss_divisor: the step's mean loss is the sum of its ``add_loss`` values over this (paddlenlp's
                loop has divided each micro-batch's loss by the accumulation steps, or divides their sum, or,
                under pipeline parallelism, returns the mean once: see ``PretrainingTrainer``).
            sharded: under sharding stage2 or stage3 the model's wrapper (``global_squared_norm``).
            expert_clip: under expert parallelism the optimizer's ``ExpertParallelClip`` (``global_squared_norm``).

        Returns:
            True when the step is skipped (nan_policy skip, or loss_spike_policy skip); False when it is applied.

        Raises:
            NonFiniteLossError: a rank's loss or gradients are nan/inf and the policy is stop, or
                more than ``max_skipped_steps`` steps were skipped, or the last step is skipped.
            SpikeStopError: the loss spike policy gives up (``pretrain.recovery``), or skips the last step.
            RollbackRequested: loss_spike_policy rollback decided to go back to a checkpoint.
        """
        bad_loss, bad_grads, loss, grad_norm, self.agreed_requests = self._step_figures(
            parameters, requests, loss_divisor, sharded, expert_clip
        )
        what = None
        if bad_loss:
            what = "loss"
        elif bad_grads:
            what = "gradients (the loss stayed finite: the weights are diverging)"
        action = (
            "none" if self.spikes is None else self.spikes.judge(step, loss, grad_norm, what and f"non-finite {what}")
        )
        if action == "rollback":
            assert self.spikes is not None  # only the SpikeWatch decides a rollback
            raise RollbackRequested(self.spikes.state.skip_windows[-1][0] - 1)
        if action == "skip":
            self.keep_lr_schedule = True
            assert self.spikes is not None  # only the SpikeWatch decides a spike skip
            return self._skip(step, output_dir, f"loss spike ({self.spikes.state.events[-1]['reason']})")
        if what is None:
            self.unconfirmed_since = None
            return False
        if self.policy == "stop" or len(self.skipped_steps) >= self.max_skipped_steps:
            raise NonFiniteLossError(self._stop_message(f"non-finite {what}", step, output_dir))
        self.skipped_steps.append(step)
        logger.warning(
            "non-finite %s at step %d: skipping its update (%d of at most %d, nan_policy skip)",
            what,
            step,
            len(self.skipped_steps),
            self.max_skipped_steps,
        )
        return self._skip(step, output_dir, f"non-finite {what}")

    def _skip(self, step: int, output_dir: str, what: str) -> bool:
        """Skip step ``step``'s update (True), or stop the run when it is the last: the run would end on weights
        no applied step has confirmed (SpikeStopError for a spike, else NonFiniteLossError)."""
        self.unconfirmed_since = self.unconfirmed_since or step
        if self._max_steps is not None and step >= self._max_steps:
            error = NonFiniteLossError if what.startswith("non-finite") else SpikeStopError
            raise error(self._stop_message(what, step, output_dir, self._unconfirmed(step)))
        self._step_is_bad = True
        return True

    def check_weights(self, parameters, step: int, output_dir: str) -> None:
        """Refuse to save non-finite weights (one all-reduce, one host sync; call it on every rank). Each rank
        checks the weights it holds (under sharding stage3 its slices: every weight is some rank's).

        Raises:
            NonFiniteLossError: a rank holds a nan/inf weight.
        """
        finite = paddle.stack([paddle.isfinite(_weights(p)).all() for p in parameters]).all()
        if self._any_rank(paddle.logical_not(finite)):
            raise NonFiniteLossError(self._stop_message("non-finite weights", step, output_dir))

    def _stop_message(self, what: str, step: int, output_dir: str, last_step_skipped: str = "") -> str:
        """The one-line stop: what went wrong at ``step``, the checkpoint to restart from, and how; with
        ``last_step_skipped`` (why a skipped last step ends the run) the advice starts with a bad batch's."""
        if self.spikes is None:
            last = checkpoint.latest_complete_checkpoint(output_dir)
            kept = f"the last complete checkpoint is {last}" if last else "no complete checkpoint was saved yet"
            restart = "restart (it resumes from that checkpoint)"
        else:
            kept, restart = self.spikes.healthy_checkpoint_text(), self.spikes.restart_advice()
        if last_step_skipped:
            return (
                f"{what} at step {step}, the last: {last_step_skipped}, and a run does not end on unconfirmed "
                f"weights; stopped without saving, {kept}. "
                f"If one bad batch caused it, raise max_steps to train past it; else lower learning_rate or raise "
                f"warmup_steps and {restart}"
            )
        skipped = f" after skipping steps {self.skipped_steps}" if self.skipped_steps else ""
        return (
            f"{what} at step {step}{skipped}; stopped without saving, {kept}. "
            f"Lower learning_rate or raise warmup_steps and {restart}, "
            "or set nan_policy skip with max_skipped_nan_steps, or loss_spike_policy rollback"
        )
