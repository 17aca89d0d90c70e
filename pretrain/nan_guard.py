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
- once per optimizer step (``verdict``, before the optimizer runs) the flag is joined by a check
  of every gradient (unless the fp16 loss scaler owns that), all-reduced (MAX) over all ranks and
  read once, so every rank stops or skips the same step and none waits in a collective;
- ``nan_policy="stop"``: raise ``NonFiniteLossError`` naming the step and the last complete
  checkpoint; nothing is saved after the bad step;
- ``nan_policy="skip"``: set ``found_inf`` on the optimizer for that step (weights, Adam moments
  and beta powers stay as they were; the batch is dropped; the LR schedule moves on), remove the
  step from the logged loss average, and stop as above on the ``max_skipped_nan_steps + 1``-th bad step;
- before any weights are saved (``check_weights``) they are checked too: a checkpoint with
  non-finite weights is never written, let alone marked complete.
"""

from __future__ import annotations

from typing import Optional

import paddle
import paddle.distributed as dist
from paddlenlp.trainer import TrainerCallback

from pretrain import checkpoint
from pretrain.errors import UserError
from pretrain.log import logger

NAN_POLICIES = ("stop", "skip")
BAD_LOSS, BAD_GRADIENTS = 1, 2  # bits of a step's verdict code


def _gradient(parameter: paddle.Tensor) -> Optional[paddle.Tensor]:
    """The gradient the optimizer will apply: ``main_grad`` (fp32, under AMP master grads) or ``grad``."""
    main_grad = getattr(parameter, "main_grad", None)
    return main_grad if main_grad is not None else parameter.grad


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
    """

    def __init__(self, policy: str, max_skipped_steps: int, world_size: int, check_gradients: bool = True):
        self.policy = policy
        self.max_skipped_steps = max_skipped_steps
        self.world_size = world_size
        self.check_gradients = check_gradients
        self.skipped_steps = []  # global steps whose update was skipped
        self._step_is_bad = False  # this optimizer step's verdict, for on_optimizer_begin
        self._loss_is_bad = None  # [] bool tensor: a micro-batch loss of this step was non-finite
        self.step_loss_sum = None  # [] tensor: the finite micro-batch losses of this step, summed
        self.agreed_requests = 0  # the last verdict's request code, the maximum over all ranks

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_is_bad = False
        self._loss_is_bad = None
        self.step_loss_sum = None

    def on_optimizer_begin(self, args, state, control, optimizer=None, **kwargs):
        # Read by paddle's Optimizer.step (also through HybridParallelOptimizer and the sharding
        # optimizers, which forward attributes to the inner optimizer): True skips the update.
        optimizer._set_auxiliary_var("found_inf", self._step_is_bad)

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

    def verdict(self, parameters, step: int, output_dir: str, requests: int = 0) -> bool:
        """Judge optimizer step ``step`` (1-based) once its gradients are computed, before the optimizer runs.

        Args:
            parameters: the model's parameters (their ``main_grad`` or ``grad`` is checked).
            requests: a code (int >= 0) this rank's caller wants agreed in the same all-reduce (e.g.
                ``pretrain.preemption``'s stop request): its maximum over all ranks is left in
                ``agreed_requests``.

        Returns:
            True when the step is skipped (policy skip); False when it is good.

        Raises:
            NonFiniteLossError: a rank's loss or gradients are nan/inf and the policy is stop, or
                more than ``max_skipped_steps`` steps were skipped.
        """
        code = paddle.zeros([], dtype="int32")
        if self._loss_is_bad is not None:
            code = code + self._loss_is_bad.astype("int32") * BAD_LOSS
        if self.check_gradients:
            grads = [_gradient(p) for p in parameters if _gradient(p) is not None]
            if grads:
                finite = paddle.stack([paddle.isfinite(g).all() for g in grads]).all()
                code = code + paddle.logical_not(finite).astype("int32") * BAD_GRADIENTS
        code, self.agreed_requests = self._max_over_ranks(paddle.stack([code, paddle.full([], requests, "int32")]))
        if not code:
            return False
        what = "loss" if code & BAD_LOSS else "gradients (the loss stayed finite: the weights are diverging)"
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
        self._step_is_bad = True
        return True

    def check_weights(self, parameters, step: int, output_dir: str) -> None:
        """Refuse to save non-finite weights (one all-reduce, one host sync; call it on every rank).

        Raises:
            NonFiniteLossError: a rank holds a nan/inf weight.
        """
        finite = paddle.stack([paddle.isfinite(p).all() for p in parameters]).all()
        if self._any_rank(paddle.logical_not(finite)):
            raise NonFiniteLossError(self._stop_message("non-finite weights", step, output_dir))

    def _stop_message(self, what: str, step: int, output_dir: str) -> str:
        last = checkpoint.latest_complete_checkpoint(output_dir)
        kept = f"the last complete checkpoint is {last}" if last else "no complete checkpoint was saved yet"
        skipped = f" after skipping steps {self.skipped_steps}" if self.skipped_steps else ""
        return (
            f"{what} at step {step}{skipped}; stopped without saving, {kept}. "
            "Lower learning_rate or raise warmup_steps and restart (it resumes from that checkpoint), "
            "or set nan_policy skip with max_skipped_nan_steps to skip bad steps"
        )
