"""Step timing for tokens/card/s: wall-clock time of the optimizer steps run in this process.

Time spent in evaluation and checkpoint saving is excluded (the trainer wraps them in
``StepTimer.excluded()``), and so are the first ``warmup_steps`` steps (graph building, allocator
growth). Steps are counted in this process only, so a resumed run measures what it ran.
"""

import time
from contextlib import contextmanager
from typing import Optional

from paddlenlp.trainer import TrainerCallback


def global_tokens_per_step(per_device_batch_size: int, gradient_accumulation_steps: int,
                           dataset_world_size: int, seq_len: int) -> int:
    """Tokens consumed by one optimizer step across all cards.

    = micro batch (samples) x gradient accumulation x data-parallel degree (data x sharding
    replicas; tensor and pipeline ranks share the same samples) x sequence length (tokens).
    """
    return per_device_batch_size * gradient_accumulation_steps * dataset_world_size * seq_len


class StepTimer(TrainerCallback):
    """Records the end time of every optimizer step, on a clock that stops during excluded work."""

    def __init__(self):
        self.step_end_times = []  # seconds, perf_counter minus excluded time
        self._excluded_seconds = 0.0

    def on_step_end(self, args, state, control, **kwargs):
        self.step_end_times.append(time.perf_counter() - self._excluded_seconds)

    @contextmanager
    def excluded(self):
        """Context manager: time spent inside does not count towards any step."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._excluded_seconds += time.perf_counter() - start

    @property
    def steps_run(self) -> int:
        """Optimizer steps completed in this process."""
        return len(self.step_end_times)

    def steps_per_second(self, warmup_steps: int = 1) -> Optional[float]:
        """Steps/s over the steps after the first ``warmup_steps``; None if too few steps ran.

        The window runs from the end of step ``warmup_steps`` to the end of the last step, so it
        holds exactly ``steps_run - warmup_steps`` steps.
        """
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1 (the first step has no start mark), got {warmup_steps}")
        if self.steps_run <= warmup_steps:
            return None
        elapsed = self.step_end_times[-1] - self.step_end_times[warmup_steps - 1]
        return (self.steps_run - warmup_steps) / elapsed
