"""Throughput the way benchmark tables report it: tokens/card/s, samples/s and MFU.

Timing: the wall-clock end of every optimizer step run in this process, on a clock that stops
during evaluation and checkpoint saving (the trainer wraps them in ``StepTimer.excluded()``).
The first ``throughput_warmup_steps`` steps (graph building, allocator growth) are left out.
Steps are counted in this process only, so a resumed run measures what it ran, never max_steps.

Counting: one optimizer step consumes, across all cards,

    global batch (samples) = micro batch x gradient accumulation x dataset_world_size
    global batch (tokens)  = global batch (samples) x seq_len

where dataset_world_size = data-parallel x sharding degree: tensor- and pipeline-parallel ranks
share their samples (``ParallelLayout.global_batch_samples``, computed once per run in
``RunPlan.global_batch_samples``). Per card = global / world_size (all cards, every parallel
dimension), the convention of the published tables (FlagPerf's case READMEs: tokens/card/s =
samples/s x seq_len / cards).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

from paddlenlp.trainer import TrainerCallback

from pretrain.metrics import flops
from pretrain.metrics.hardware import PeakFlops, achievable_peak_flops, resolve_peak_flops
from pretrain.precision import Precision


@dataclass(frozen=True)
class StepWork:
    """What one optimizer step processes and costs: the constants that turn steps/s into reported rates."""

    global_batch_samples: int  # samples per optimizer step, all cards
    seq_len: int  # tokens per sample
    world_size: int  # cards, every parallel dimension
    model_flops_per_token: float  # PaLM form, see pretrain.metrics.flops
    nominal_flops_per_token: Optional[float]  # 6 x nominal_params, None when that is unset
    peak: Optional[PeakFlops]  # peak FLOP/s per card that MFU divides by, None when unknown
    achievable: Optional[PeakFlops] = None  # measured matmul FLOP/s per card, reported beside the peak

    def rates(self, steps_per_sec: Optional[float]) -> dict:
        """Samples/s and tokens/s (all cards), tokens/card/s and both MFU forms; values None when unknown."""
        if steps_per_sec is None:
            tokens_per_card_per_sec = samples_per_sec = tokens_per_sec = None
        else:
            samples_per_sec = steps_per_sec * self.global_batch_samples
            tokens_per_sec = samples_per_sec * self.seq_len
            tokens_per_card_per_sec = tokens_per_sec / self.world_size
        peak = self.peak.flops_per_sec if self.peak else None
        return {
            "samples_per_sec": samples_per_sec,
            "tokens_per_sec": tokens_per_sec,
            "tokens_per_card_per_sec": tokens_per_card_per_sec,
            "mfu": flops.mfu_or_none(tokens_per_card_per_sec, self.model_flops_per_token, peak),
            "mfu_nominal": flops.mfu_or_none(tokens_per_card_per_sec, self.nominal_flops_per_token, peak),
        }


def step_work(plan, adapter_params: Optional[int] = None) -> StepWork:
    """The StepWork of a ``RunPlan``: its global batch and layout, FLOPs from its model config, and the
    peak FLOP/s from ``peak_flops_per_card`` or the hardware.

    Args:
        adapter_params: None when every weight is trained (pretraining: 6N forms); else the base
            weights are frozen and this many adapter parameters are trained (LoRA: 4N forms, see
            ``pretrain.metrics.flops``).

    The peak is ``pretrain.metrics.hardware.resolve_peak_flops``'s (override, datasheet, or the CPU's physical
    one); with ``measure_peak_flops`` the matmul microbenchmark runs too, for the achievable figure.
    """
    args = plan.training_args
    frozen = adapter_params is not None
    return StepWork(
        global_batch_samples=plan.global_batch_samples,
        seq_len=plan.seq_length,
        world_size=plan.layout.world_size,
        model_flops_per_token=flops.model_flops_per_token(plan.model_config, plan.seq_length, adapter_params),
        nominal_flops_per_token=(
            flops.nominal_flops_per_token(args.nominal_params, frozen) if args.nominal_params else None
        ),
        peak=resolve_peak_flops(args.peak_flops_per_card, Precision.from_arguments(args).half),
        achievable=achievable_peak_flops(args.measure_peak_flops),
    )


class StepTimer(TrainerCallback):
    """Records the end time of every optimizer step, on a clock that stops during excluded work.

    Args:
        work: the run's StepWork (``step_work(plan)``), so that ``interval_rates`` (for each log)
            and ``run_rates`` (for the summary) speak in tokens/card/s and MFU; None (a toy model
            in a test) reports no rates.
        warmup_steps: optimizer steps (>= 1) at the start of this process left out of the rates
            (``throughput_warmup_steps``; preflight checks it).
    """

    def __init__(self, work: Optional[StepWork] = None, warmup_steps: int = 1):
        self.step_end_times = []  # seconds, perf_counter minus excluded time
        self.work = work
        self.warmup_steps = warmup_steps
        self._excluded_seconds = 0.0
        self._steps_at_last_interval = 0

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

    def steps_per_second(self, first_step: int) -> Optional[float]:
        """Steps/s over the steps after the first ``first_step`` (>= 1) of this process; None if none ran.

        The window runs from the end of step ``first_step`` to the end of the last step, so it
        holds exactly ``steps_run - first_step`` steps.
        """
        if first_step < 1:
            raise ValueError(f"first_step must be >= 1 (the first step has no start mark), got {first_step}")
        if self.steps_run <= first_step:
            return None
        elapsed = self.step_end_times[-1] - self.step_end_times[first_step - 1]
        return (self.steps_run - first_step) / elapsed

    def run_rates(self) -> dict:
        """``StepWork.rates`` over every step of this process after the warm-up steps."""
        assert self.work is not None, "a StepTimer built without StepWork has no rates"
        return self.work.rates(self.steps_per_second(self.warmup_steps))

    def interval_rates(self) -> dict:
        """``StepWork.rates`` over the steps since the previous call, warm-up steps left out.

        Only the known values are returned (VisualDL records numbers only): an empty dict while
        the interval holds warm-up steps only, or without a StepWork.
        """
        first_step = max(self._steps_at_last_interval, self.warmup_steps)
        self._steps_at_last_interval = self.steps_run
        if self.work is None:
            return {}
        rates = self.work.rates(self.steps_per_second(first_step))
        return {key: value for key, value in rates.items() if value is not None}
