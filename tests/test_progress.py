"""The progress output: one line per record, the ETA, and the bar's place (pretrain.metrics.progress)."""

import logging
from types import SimpleNamespace

import pytest
from test_throughput import FakeClock, make_work, run_steps

from pretrain.log import logger
from pretrain.metrics import progress, step_timer
from pretrain.metrics.progress import RunProgress, format_eval_record, format_train_record
from pretrain.metrics.step_timer import StepTimer


def test_a_training_record_is_one_line_of_rounded_figures():
    logs = {
        "loss": 5.245123456,
        "learning_rate": 0.0008219,
        "global_step": 15,
        "tokens_per_card_per_sec": 878.3456,
        "mfu": 0.30149,
        "peak_memory_gib": 1.8765,
    }
    line = format_train_record(logs, 15, 120, elapsed_seconds=61.2, eta_seconds=3725.0)
    assert line == (
        "step 15/120 | loss 5.2451 | lr 0.000822 | 878 tokens/card/s | MFU 30.1% | mem 1.88 GiB | "
        "01:01 elapsed, ETA 1:02:05"
    )
    # warm-up: no rate yet; no credible MFU: none shown
    assert format_train_record({"loss": 9.0, "learning_rate": 2e-3}, 1, 120, 4.0, None) == (
        "step 1/120 | loss 9.0000 | lr 0.002 | 00:04 elapsed, ETA ?"
    )
    nominal = format_train_record({**logs, "mfu_nominal": 0.28}, 15, 120, 1.0, 1.0)
    assert "MFU 30.1% (nominal 28.0%)" in nominal


def test_an_evaluation_record():
    assert format_eval_record({"eval_loss": 6.22698, "eval_runtime": 12.529}, 20, 20) == (
        "eval at step 20/20 | loss 6.2270 | perplexity 506.2 | 12.5 s"
    )
    assert "perplexity" not in format_eval_record({"eval_loss": 800.0, "eval_runtime": 1.0}, 1, 2)  # exp overflows


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(step_timer.time, "perf_counter", fake)
    monkeypatch.setattr(progress.time, "perf_counter", fake)
    return fake


def test_eta_extrapolates_the_recent_steps_without_evaluation_time(clock):
    timer = StepTimer(make_work(), warmup_steps=1)
    reporter = RunProgress(timer, show_bar=False)
    reporter._train_start = clock.now
    assert reporter.eta_seconds(100) is None  # nothing ran yet
    run_steps(timer, clock, [30.0])  # the first step builds the graph
    assert reporter.eta_seconds(10) == pytest.approx(300.0)  # only the wall clock so far
    run_steps(timer, clock, [2.0] * 30)
    with timer.excluded():  # an evaluation: not a training step's time
        clock.now += 500.0
    run_steps(timer, clock, [4.0] * 10)
    # the last ETA_WINDOW_STEPS (20) steps: 10 of 2 s and 10 of 4 s -> 3 s a step
    assert reporter.eta_seconds(100) == pytest.approx(300.0)


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_records_are_routed_by_kind_on_rank_zero_only(clock):
    handler = _Lines()
    logger.addHandler(handler)
    try:
        timer = StepTimer(make_work(peak=None), warmup_steps=1)
        reporter = RunProgress(timer, show_bar=False)
        state = SimpleNamespace(global_step=0, max_steps=20, is_world_process_zero=True)
        reporter.on_train_begin(None, state, None)
        run_steps(timer, clock, [3.0, 2.0])
        state.global_step = 2
        reporter.on_log(None, state, None, logs={"loss": 8.5, "learning_rate": 1e-3, "tokens_per_card_per_sec": 9.0})
        reporter.on_log(None, state, None, logs={"eval_loss": 7.0, "eval_runtime": 3.0})
        reporter.on_log(None, state, None, logs={"train_runtime": 65.0, "train_loss": 8.0})
        reporter.on_log(
            None,
            SimpleNamespace(global_step=2, max_steps=20, is_world_process_zero=False),
            None,
            logs={"loss": 1.0, "learning_rate": 1.0},
        )
        reporter.on_train_end(None, state, None)
    finally:
        logger.removeHandler(handler)
    assert handler.lines == [
        "MFU: 42.0G FLOPs per token (PaLM) against no peak FLOP/s: not reported (set peak_flops_per_card)",
        "step 2/20 | loss 8.5000 | lr 0.001 | 9 tokens/card/s | 00:05 elapsed, ETA 00:36",
        "eval at step 2/20 | loss 7.0000 | perplexity 1,096.6 | 3.0 s",
        "training done: step 2/20 in 01:05",
    ]
