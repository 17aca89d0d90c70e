"""What a user sees while a run trains: a progress bar, and one line per log record with the ETA.

In an interactive terminal a tqdm bar (step/max_steps, elapsed, ETA, last loss) stays at the bottom
and log records scroll above it (tqdm's logging redirection, for this application's logger and
paddlenlp's). Where output goes to a file or a pipe, tqdm draws no bar and every training record
carries the same figures, so a log file shows progress too::

    step 10/120 | loss 7.4179 | lr 0.00196 | 1,097 tokens/card/s | MFU 11.5% | mem 1.73 GiB | 3.73 s/step,
    data wait 0% | 0:41 elapsed, ETA 7:20     (one line)

Figures per record: the mean loss over the logging interval, the learning rate of its last step,
tokens/card/s and MFU over the interval (``pretrain.metrics.step_timer``; MFU only when credible), the peak
memory so far (on several ranks: the max over ranks and its rank), the wall time per step over the
interval and the share of it spent waiting for data (``pretrain.metrics.time_breakdown``), wall-clock time
since training started in this process, and the ETA of the remaining training steps at the rate of
the last ``ETA_WINDOW_STEPS`` steps (evaluation and checkpoint time are left out of that rate, so
they come on top).
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Optional

from paddlenlp.trainer import TrainerCallback
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from pretrain.log import console_loggers, logger
from pretrain.metrics.step_timer import StepTimer

ETA_WINDOW_STEPS = 20  # the ETA extrapolates the rate of this many most recent steps


def format_duration(seconds: Optional[float]) -> str:
    """``[H:]MM:SS`` (tqdm's format), or ``?`` when unknown."""
    return "?" if seconds is None else tqdm.format_interval(seconds)


def format_train_record(logs: dict, step: int, max_steps: int, elapsed_seconds: float, eta_seconds) -> str:
    """One line for a training log record (the keys ``PretrainingTrainer.log`` provides)."""
    parts = [f"step {step}/{max_steps}", f"loss {logs['loss']:.4f}", f"lr {logs['learning_rate']:.3g}"]
    if "tokens_per_card_per_sec" in logs:
        parts.append(f"{logs['tokens_per_card_per_sec']:,.0f} tokens/card/s")
    if "mfu" in logs:
        nominal = f" (nominal {100 * logs['mfu_nominal']:.1f}%)" if "mfu_nominal" in logs else ""
        parts.append(f"MFU {100 * logs['mfu']:.1f}%{nominal}")
    if "peak_memory_gib" in logs:
        most = logs.get("peak_memory_gib_max")
        ranks = f" (max {most:.2f} on rank {logs['peak_memory_max_rank']})" if most is not None else ""
        parts.append(f"mem {logs['peak_memory_gib']:.2f} GiB{ranks}")
    if "aux_loss" in logs:  # a mixture of experts (pretrain.routing): the loss's parts and the routing balance
        parts.append(
            f"lm {logs['lm_loss']:.4f}, aux {logs['aux_loss']:.4f}, z {logs['z_loss']:.3g}, "
            f"imbalance {logs['expert_imbalance']:.2f}"
            + (f", bias spread {logs['routing_bias_spread']:.4g}" if "routing_bias_spread" in logs else "")
        )
    times = {key: value for key, value in logs.items() if key.startswith("time_")}
    if times:
        step = sum(times.values())
        waiting = f", data wait {times['time_data_wait'] / step:.0%}" if step > 0 else ""
        parts.append(f"{step:.2f} s/step{waiting}")
    parts.append(f"{format_duration(elapsed_seconds)} elapsed, ETA {format_duration(eta_seconds)}")
    return " | ".join(parts)


def format_eval_record(logs: dict, step: int, max_steps: int) -> str:
    """One line for an evaluation record: loss, perplexity, time taken."""
    loss = logs["eval_loss"]
    perplexity = f" | perplexity {math.exp(loss):,.1f}" if loss < 50 else ""  # exp overflows a float past ~709
    return f"eval at step {step}/{max_steps} | loss {loss:.4f}{perplexity} | {logs['eval_runtime']:.1f} s"


class RunProgress(TrainerCallback):
    """Prints the progress bar and the log records of the Trainer, on global rank 0.

    Args:
        step_timer: the run's StepTimer (its clock leaves evaluation and checkpoint time out), for the ETA.
        show_bar: draw the bar (``not disable_tqdm``); tqdm still draws none where the output is not a terminal.
    """

    def __init__(self, step_timer: StepTimer, show_bar: bool):
        self.step_timer = step_timer
        self.show_bar = show_bar
        self.bar = None
        self._redirect = contextlib.ExitStack()
        self._train_start = 0.0  # perf_counter at on_train_begin

    def on_train_begin(self, args, state, control, **kwargs):
        self._train_start = time.perf_counter()
        if not state.is_world_process_zero:
            return
        # disable=None: tqdm draws only on a terminal
        self.bar = tqdm(
            total=state.max_steps,
            initial=state.global_step,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            disable=None if self.show_bar else True,
        )
        if not self.bar.disable:  # log records go through tqdm.write, above the bar (only where one is drawn:
            # tqdm.write also redraws other bars, e.g. paddlenlp's "Skipping the first batches" on resume)
            self._redirect.enter_context(logging_redirect_tqdm(loggers=console_loggers()))
        work = self.step_timer.work
        if work is not None:
            peak = f"{work.peak.flops_per_sec / 1e12:.3g} TFLOP/s per card ({work.peak.source})" if work.peak else None
            achievable = work.achievable
            logger.info(
                "MFU: %s FLOPs per token (PaLM) against %s%s",
                tqdm.format_sizeof(work.model_flops_per_token),
                peak or "no peak FLOP/s: not reported (set peak_flops_per_card)",
                f"; achievable {achievable.flops_per_sec / 1e12:.3g} TFLOP/s ({achievable.source})"
                if achievable
                else "",
            )

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def eta_seconds(self, remaining_steps: int) -> Optional[float]:
        """Seconds for ``remaining_steps`` more training steps at the recent rate; None before any timed step."""
        timer = self.step_timer
        steps_per_second = timer.steps_per_second(max(timer.warmup_steps, timer.steps_run - ETA_WINDOW_STEPS))
        if steps_per_second is None and timer.steps_run > 0:  # still in the warm-up: the wall clock is all we have
            steps_per_second = timer.steps_run / (time.perf_counter() - self._train_start)
        return None if steps_per_second is None else remaining_steps / steps_per_second

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or not state.is_world_process_zero:
            return
        step, max_steps = state.global_step, state.max_steps
        if "loss" in logs:
            elapsed = time.perf_counter() - self._train_start
            logger.info(format_train_record(logs, step, max_steps, elapsed, self.eta_seconds(max_steps - step)))
            if self.bar is not None:
                self.bar.set_postfix_str(f"loss {logs['loss']:.4f}", refresh=False)
        elif "skipped_steps" in logs:
            logger.info("step %d/%d | skipped: no update applied (%d step(s))", step, max_steps, logs["skipped_steps"])
        elif "eval_loss" in logs:
            logger.info(format_eval_record(logs, step, max_steps))
        elif "train_runtime" in logs:
            logger.info("training done: step %d/%d in %s", step, max_steps, format_duration(logs["train_runtime"]))

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self._redirect.close()
