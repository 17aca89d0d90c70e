"""Token counting and step timing behind tokens/card/s: accumulation, parallel degrees, warm-up, resume."""

import glob
import json
import os
from types import SimpleNamespace

import pytest
from tiny_run import python_script, run, tiny_args

from pretrain.layout import ParallelLayout
from pretrain.metrics import flops, step_timer
from pretrain.metrics.hardware import PeakFlops
from pretrain.metrics.loss_curves import load_train_losses
from pretrain.metrics.step_timer import StepTimer, StepWork, step_work
from pretrain.registry import find_model_size
from pretrain.resolve import RunPlan

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)


@pytest.mark.parametrize(
    "micro_batch, accumulation, layout",
    [
        (4, 64, ParallelLayout(8, 1, sharding_stage=2, sharding_parallel_degree=8)),  # LLaMA-7B TP1PP1SH2SP8
        # LLaMA-7B TP2PP1SH1SP4: the 2 tensor-parallel ranks share samples
        (4, 128, ParallelLayout(8, 1, tensor_parallel_degree=2, sharding_stage=1, sharding_parallel_degree=4)),
        # LLaMA-7B TP2PP4SH1SP1: 8 cards, one data replica
        (4, 512, ParallelLayout(8, 1, tensor_parallel_degree=2, pipeline_parallel_degree=4, sharding_stage=1)),
        (2, 128, ParallelLayout(8, 1, sharding_stage=2, sharding_parallel_degree=8)),  # LLaMA-13B TP1PP1SH2SP8
    ],
)
def test_published_cases_are_4m_token_batches(micro_batch, accumulation, layout):
    # FlagPerf's LLaMA cases train on a 4M-token global batch of 2048-token samples.
    assert layout.global_batch_samples(micro_batch, accumulation) * 2048 == 4 * 2**20


def make_work(**overrides) -> StepWork:
    fields = dict(
        global_batch_samples=2048,
        seq_len=2048,
        world_size=8,
        model_flops_per_token=42e9,
        nominal_flops_per_token=6 * 7e9,
        peak=PeakFlops(312e12, "datasheet: A100 bf16/fp16 dense"),
    )
    fields.update(overrides)
    return StepWork(**fields)


def test_rates_reproduce_the_published_llama_7b_sharding_case():
    # FlagPerf training/nvidia/llama1_7B-paddle: TP1PP1SH2SP8 on 8 x A100-80G: 4267 tokens/card/s (16.67 samples/s).
    rates = make_work().rates(steps_per_sec=16.67 / 2048)
    assert rates["samples_per_sec"] == pytest.approx(16.67)
    assert rates["tokens_per_sec"] == pytest.approx(16.67 * 2048)
    assert rates["tokens_per_card_per_sec"] == pytest.approx(4267, abs=1)  # = samples/s x seq_len / cards
    assert rates["mfu_nominal"] == pytest.approx(4267.52 * 42e9 / 312e12)
    assert rates["mfu"] == pytest.approx(rates["mfu_nominal"])  # same FLOPs per token in this example


def test_no_logged_or_summarized_mfu_above_one(clock):
    # a peak measured on a busy machine: 1 step/s x 2048 x 2048 tokens / 8 cards x 42 GFLOPs = 22 PFLOP/s per card
    work = make_work(peak=PeakFlops(1e15, "measured: float32 matmul on cpu"))
    assert work.rates(1.0)["mfu"] is None and work.rates(1.0)["mfu_nominal"] is None
    assert 0 < work.rates(1e-3)["mfu"] <= 1  # a thousand times slower: credible
    timer = StepTimer(work)
    run_steps(timer, clock, [1.0, 1.0, 1.0])
    logged = timer.interval_rates()
    assert logged["tokens_per_card_per_sec"] == 2048 * 2048 / 8
    assert "mfu" not in logged and "mfu_nominal" not in logged  # never logged, so never on the board
    assert timer.run_rates()["mfu"] is None


def test_rates_unknown():
    assert set(make_work().rates(None).values()) == {None}
    rates = make_work(peak=None, nominal_flops_per_token=None).rates(1.0)
    assert rates["tokens_per_card_per_sec"] == 2048 * 2048 / 8
    assert rates["mfu"] is None and rates["mfu_nominal"] is None


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(step_timer.time, "perf_counter", fake)
    return fake


def run_steps(timer: StepTimer, clock: FakeClock, durations: list) -> None:
    for seconds in durations:
        clock.now += seconds
        timer.on_step_end(None, None, None)


def test_warmup_steps_are_left_out(clock):
    timer = StepTimer()
    run_steps(timer, clock, [30.0, 2.0, 2.0, 2.0, 2.0])  # the first step builds graphs
    assert timer.steps_run == 5
    assert timer.steps_per_second(first_step=1) == 0.5  # steps 2..5: 4 steps in 8 s
    assert timer.steps_per_second(first_step=3) == 0.5  # steps 4..5
    assert timer.steps_per_second(first_step=5) is None
    with pytest.raises(ValueError):
        timer.steps_per_second(first_step=0)


def test_excluded_time_does_not_count(clock):
    timer = StepTimer()
    run_steps(timer, clock, [1.0, 1.0])
    with timer.excluded():  # an evaluation or checkpoint save between steps
        clock.now += 100.0
    run_steps(timer, clock, [1.0, 1.0])
    assert timer.steps_per_second(first_step=1) == 1.0


def test_interval_rates_cover_the_steps_since_the_last_log(clock):
    timer = StepTimer(make_work(global_batch_samples=4, seq_len=64, world_size=2, peak=None), warmup_steps=2)
    run_steps(timer, clock, [10.0, 10.0])
    assert timer.interval_rates() == {}  # only warm-up steps so far: nothing to log
    run_steps(timer, clock, [1.0, 1.0])
    assert timer.interval_rates()["samples_per_sec"] == 4.0  # steps 3..4, 1 step/s
    run_steps(timer, clock, [2.0, 2.0])
    rates = timer.interval_rates()  # steps 5..6 only
    assert rates["samples_per_sec"] == 2.0
    assert rates["tokens_per_card_per_sec"] == 2.0 * 64 / 2
    assert "mfu" not in rates  # no peak: left out rather than logged as None


def tiny_plan(**overrides) -> RunPlan:
    """A RunPlan of llama-debug at seq 128 on 8 cards: 2 data replicas x 4 tensor-parallel ranks."""
    config = find_model_size("llama-debug").model_config()
    config.seq_length = 128
    fields = dict(
        per_device_train_batch_size=2,
        gradient_accumulation_steps=8,
        nominal_params=None,
        peak_flops_per_card=100e12,
        measure_peak_flops=False,
        bf16=True,
        fp16=False,
        fp16_opt_level="O2",
        amp_master_grad=False,
    )
    fields.update(overrides)
    layout = ParallelLayout(world_size=8, nnodes=1, tensor_parallel_degree=4, data_parallel_degree=2)
    data_args = SimpleNamespace(max_seq_length=128)
    return RunPlan(None, data_args, SimpleNamespace(**fields), layout, model_config=config)


def test_step_work_with_accumulation_and_model_parallel_cards():
    # 8 cards: 2 data replicas x 4 tensor ranks; every card counts in tokens/card/s.
    plan = tiny_plan(nominal_params=7e6)
    work = step_work(plan)
    assert work.global_batch_samples == plan.global_batch_samples == 2 * 8 * 2
    assert plan.global_batch_tokens == 32 * 128
    assert work.world_size == 8
    assert work.nominal_flops_per_token == 6 * 7e6
    assert work.model_flops_per_token == flops.model_flops_per_token(plan.model_config, 128)
    assert work.peak == (100e12, "override: peak_flops_per_card")
    assert work.rates(1.0)["tokens_per_card_per_sec"] == 32 * 128 / 8


def test_a_timer_without_work_logs_no_rates(clock):
    timer = StepTimer()  # e.g. a toy regression in a test
    run_steps(timer, clock, [1.0, 1.0, 1.0])
    assert timer.work is None and timer.interval_rates() == {}


def pretrain(output_dir: str, cache: str, *extra: str) -> tuple:
    """A tiny 6-step run saving at steps 3 and 6; (run_summary.json, [(step, loss)])."""
    command = python_script(*tiny_args(output_dir, cache, *extra, steps=6, save_steps=3))
    assert run(command, log_path=output_dir + ".log") == 0, f"see {output_dir}.log"
    with open(os.path.join(output_dir, "run_summary.json")) as f:
        return json.load(f), load_train_losses(output_dir)


@pytest.mark.slow
def test_resumed_run_counts_its_own_steps_and_keeps_the_loss_history(tmp_path, demo_dir):
    out, cache = str(tmp_path / "run"), str(tmp_path / "cache")
    full, full_losses = pretrain(out, cache, "--measure_peak_flops", "true")
    assert full["steps_run_this_process"] == 6 and full["train_tokens"] == 6 * 4 * 64
    assert full["mfu"] > 0 and full["peak_flops_definition"] == "physical"  # the CPU's, whatever the load
    assert full["achievable_flops_source"].startswith("measured")  # the demo measures it, beside the peak
    # MFU against the physical peak is below the run's share of the measured rate: that rate is below the peak
    # (the probe runs at start; on a busy machine it may measure less than training then achieves, and
    # mfu_of_achievable, above 1, is null)
    assert full["achievable_flops_per_card"] < full["peak_flops_per_card"]
    if full["mfu_of_achievable"] is not None:
        assert full["mfu"] < full["mfu_of_achievable"]
    assert full["peak_memory_gib"] > 0 and full["peak_memory_kind"] == "cpu_peak_rss"

    # the demo config reports to VisualDL: throughput, MFU and memory are scalars next to the loss
    from visualdl import LogReader

    (record,) = glob.glob(os.path.join(out, "runs", "*", "vdlrecords.*.log"))
    scalars = LogReader(file_path=record).get_tags()["scalar"]
    assert sorted(scalars) == [
        "train/learning_rate",
        "train/loss",
        "train/mfu",
        "train/peak_memory_gib",
        "train/tokens_per_card_per_sec",
    ]  # one throughput family: no paddlenlp interval_* rates, no global_step or progress_or_epoch

    resumed, resumed_losses = pretrain(
        out, cache, "--resume_from_checkpoint", os.path.join(out, "checkpoint-3"), "--report_to", "none"
    )
    assert resumed["global_step"] == 6
    assert resumed["steps_run_this_process"] == 3  # never max_steps
    assert resumed["train_tokens"] == 6 * 4 * 64  # the whole run's, steps before the resume included
    assert [step for step, _ in resumed_losses] == [1, 2, 3, 4, 5, 6]
    assert [loss for _, loss in resumed_losses] == pytest.approx([loss for _, loss in full_losses], rel=1e-5)
