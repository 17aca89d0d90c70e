"""Throughput the way benchmark tables report it: tokens/card/s, samples/s and MFU.

Timing: the wall-clock end of every optimizer step run in this process, on a clock that stops
during evaluation and checkpoint saving (the trainer wraps them in ``StepTimer.excluded()``).
The first ``throughput_warmup_steps`` steps (graph building, allocator growth) are left out.
Steps are counted in this process only, so a resumed run measures what it ran, never max_steps.

Counting: one optimizer step consumes, across all cards,

    global batch (samples) = micro batch x gradient accumulation x dataset_world_size
    global batch (tokens)  = global batch (samples) x seq_len

where dataset_world_size = data-parallel x sharding degree: tensor- and pipeline-parallel ranks
share their samples. Per card = global / world_size (all cards, every parallel dimension), the
convention of the published tables (REFERENCE.md: tokens/card/s = samples/s x seq_len / cards).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

from paddlenlp.trainer import TrainerCallback

from pretrain import flops
from pretrain.errors import UserError
from pretrain.hardware import PeakFlops, resolve_peak_flops


def global_batch_samples(per_device_batch_size: int, gradient_accumulation_steps: int, dataset_world_size: int) -> int:
    """Samples consumed by one optimizer step across all cards.

    = micro batch (samples) x gradient accumulation x dataset_world_size (data x sharding
    replicas; tensor and pipeline ranks share the same samples). Times seq_len for tokens.
    """
    return per_device_batch_size * gradient_accumulation_steps * dataset_world_size


def global_tokens_per_step(
    per_device_batch_size: int, gradient_accumulation_steps: int, dataset_world_size: int, seq_len: int
) -> int:
    """Tokens consumed by one optimizer step across all cards: global_batch_samples(...) x seq_len (tokens)."""
    return global_batch_samples(per_device_batch_size, gradient_accumulation_steps, dataset_world_size) * seq_len


@dataclass(frozen=True)
class StepWork:
    """What one optimizer step processes and costs: the constants that turn steps/s into reported rates."""

    global_batch_samples: int  # samples per optimizer step, all cards
    seq_len: int  # tokens per sample
    world_size: int  # cards, every parallel dimension
    model_flops_per_token: float  # PaLM form, see pretrain.flops
    nominal_flops_per_token: Optional[float]  # 6 x nominal_params, None when that is unset
    peak: Optional[PeakFlops]  # peak FLOP/s per card, None when unknown

    @property
    def global_batch_tokens(self) -> int:
        """Tokens per optimizer step, all cards."""
        return self.global_batch_samples * self.seq_len

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


def step_work(args, model) -> StepWork:
    """The StepWork of a run: batch shape from ``args``, FLOPs from ``model.config``, peak from args or the hardware.

    ``model.config.seq_length`` is the training sequence length (pretrain.modeling sets it from
    ``max_seq_length``). May run the peak-FLOP/s microbenchmark (about 0.5 s) when
    ``args.measure_peak_flops`` is set and the hardware has no datasheet entry.
    """
    seq_len = model.config.seq_length
    return StepWork(
        global_batch_samples=global_batch_samples(
            args.per_device_train_batch_size, args.gradient_accumulation_steps, args.dataset_world_size
        ),
        seq_len=seq_len,
        world_size=args.world_size,
        model_flops_per_token=flops.model_flops_per_token(model.config, seq_len),
        nominal_flops_per_token=flops.nominal_flops_per_token(args.nominal_params) if args.nominal_params else None,
        peak=resolve_peak_flops(args.peak_flops_per_card, args.measure_peak_flops),
    )


class StepTimer(TrainerCallback):
    """Records the end time of every optimizer step, on a clock that stops during excluded work.

    At train begin it also fixes the run's StepWork (``self.work``; None for a model without a
    paddlenlp config), so that ``interval_rates`` (for each log) and ``run_rates`` (for the
    summary) speak in tokens/card/s and MFU.
    """

    def __init__(self):
        self.step_end_times = []  # seconds, perf_counter minus excluded time
        self.work: Optional[StepWork] = None
        self.warmup_steps = 1
        self._excluded_seconds = 0.0
        self._steps_at_last_interval = 0

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if args.throughput_warmup_steps < 1:
            raise UserError(
                f"throughput_warmup_steps = {args.throughput_warmup_steps}: it must be >= 1 "
                "(the first step has no start mark and includes graph building)"
            )
        self.warmup_steps = args.throughput_warmup_steps
        # a model without a paddlenlp config (a toy model in a test) has no tokens to count
        self.work = step_work(args, model) if hasattr(model, "config") else None

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
