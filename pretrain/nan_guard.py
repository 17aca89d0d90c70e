"""Non-finite loss guard: stop the run, or skip the optimizer step up to K times.

paddlenlp's Trainer checks the accumulated loss once per optimizer step (``_check_loss_valid``)
and raises a bare ``ValueError`` after the non-finite gradients have already been computed; under
fp16 it relies on the loss scaler, which skips the optimizer update when it finds inf/nan
gradients (paddle's optimizer skips every parameter and moment update while its auxiliary
variable ``found_inf`` is true). This guard builds on the same mechanism for every dtype:

- each micro-batch loss is checked right after forward/backward; the verdict is all-reduced (MAX)
  over all ranks, so every rank stops or skips the same step and none waits in a collective;
- ``nan_policy="stop"``: raise ``NonFiniteLossError`` naming the step and the last complete
  checkpoint; nothing is saved after the bad step;
- ``nan_policy="skip"``: set ``found_inf`` on the optimizer for that step (weights, Adam moments
  and beta powers stay as they were; the batch is dropped; the LR schedule moves on), remove the
  step from the logged loss average, and stop as above on the ``max_skipped_nan_steps + 1``-th bad step.
"""

from __future__ import annotations

import math

import paddle
import paddle.distributed as dist
from paddlenlp.trainer import TrainerCallback

from pretrain import checkpoint
from pretrain.errors import UserError
from pretrain.log import logger

NAN_POLICIES = ("stop", "skip")


class NonFiniteLossError(UserError):
    """The loss became nan/inf and the policy says stop."""


class NanGuard(TrainerCallback):
    """Checks micro-batch losses; tells the optimizer to skip a bad step or stops the run.

    Args:
        policy: one of NAN_POLICIES ("stop" or "skip"; the argument parser enforces it).
        max_skipped_steps: bad optimizer steps skipped before the run stops (policy "skip").
        world_size: processes that must agree on the verdict (all-reduce when > 1).
    """

    def __init__(self, policy: str, max_skipped_steps: int, world_size: int):
        self.policy = policy
        self.max_skipped_steps = max_skipped_steps
        self.world_size = world_size
        self.skipped_steps = []  # global steps whose update was skipped
        self._step_is_bad = False
        self._step_loss_sum = 0.0  # finite losses already returned in this optimizer step (a tensor once added to)

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_is_bad = False
        self._step_loss_sum = 0.0

    def on_optimizer_begin(self, args, state, control, optimizer=None, **kwargs):
        # Read by paddle's Optimizer.step (also through HybridParallelOptimizer and the sharding
        # optimizers, which forward attributes to the inner optimizer): True skips the update.
        optimizer._set_auxiliary_var("found_inf", self._step_is_bad)

    def _any_rank_non_finite(self, loss: paddle.Tensor) -> bool:
        bad = paddle.logical_not(paddle.isfinite(loss)).astype("int32").reshape([1])
        if self.world_size > 1:
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        return bool(bad.item())

    def check(self, loss: paddle.Tensor, step: int, output_dir: str) -> tuple:
        """Check one micro-batch loss (a scalar tensor) of optimizer step ``step`` (1-based).

        Returns:
            ``(loss to accumulate, newly_skipped)``: the loss itself when the step is good; when
            it is skipped, values that make the step's accumulated loss 0, and ``newly_skipped``
            True for the first micro-batch that made it bad.

        Raises:
            NonFiniteLossError: a rank's loss is nan/inf and the policy is stop, or more than
                ``max_skipped_steps`` steps were skipped.
        """
        if self._step_is_bad:
            return paddle.zeros_like(loss), False
        if not self._any_rank_non_finite(loss):
            self._step_loss_sum = loss.detach() + self._step_loss_sum  # on device: no second host sync
            return loss, False
        value = float(loss.item())
        if self.policy == "stop" or len(self.skipped_steps) >= self.max_skipped_steps:
            raise NonFiniteLossError(self._stop_message(value, step, output_dir))
        self.skipped_steps.append(step)
        logger.warning(
            "non-finite loss at step %d (%s on this rank): skipping its update (%d of at most %d, nan_policy skip)",
            step,
            value,
            len(self.skipped_steps),
            self.max_skipped_steps,
        )
        self._step_is_bad = True
        return paddle.zeros_like(loss) - self._step_loss_sum, True

    def _stop_message(self, value: float, step: int, output_dir: str) -> str:
        shown = value if not math.isfinite(value) else "finite here, non-finite on another rank"
        last = checkpoint.latest_complete_checkpoint(output_dir)
        kept = f"the last complete checkpoint is {last}" if last else "no complete checkpoint was saved yet"
        skipped = f" after skipping steps {self.skipped_steps}" if self.skipped_steps else ""
        return (
            f"non-finite loss ({shown}) at step {step}{skipped}; stopped without saving, {kept}. "
            "Lower learning_rate or raise warmup_steps and restart (it resumes from that checkpoint), "
            "or set nan_policy skip with max_skipped_nan_steps to skip bad steps"
        )
