"""Where the time goes: the per-step breakdown against injected delays, goodput over a restart, the
physical CPU peak (load cannot change it), and the max over ranks of a 2-rank run."""

import json
import os
import re
import subprocess
import sys
import time
from unittest import mock

import pytest
from conftest import REPO, load_script, pretrain_log_records
from paddle.io.dataloader import dataloader_iter
from tiny_run import kill_on, launch_command, python_script, run, start, tiny_args

from pretrain import checkpoint
from pretrain.metrics import hardware, time_breakdown
from pretrain.metrics.board import stacked_time_lines
from pretrain.metrics.rank_figures import rank_extremes
from pretrain.metrics.time_breakdown import (
    PHASES,
    PRODUCTIVE_PHASES,
    TIME_HISTORY_FILE,
    RunTime,
    TimeBreakdown,
    previous_run_time,
)

# A 2-core Xeon with hyper-threads: processors 0 and 2 are hyper-threads of core 0, 1 and 3 of core 1.
XEON = "\n\n".join(
    f"processor\t: {cpu}\nmodel name\t: Intel(R) Xeon(R) Platinum 8358 CPU @ 2.60GHz\ncpu MHz\t\t: {mhz}\n"
    f"physical id\t: 0\ncore id\t\t: {cpu % 2}\nflags\t\t: fpu sse sse2 avx fma avx2 avx512f avx512bw"
    for cpu, mhz in ((0, "800.000"), (1, "3400.000"), (2, "1200.000"), (3, "2600.000"))
)
# A virtual machine's CPUs: no topology fields, no rated clock in the name, AVX2 and FMA.
VM = "\n\n".join(
    f"processor\t: {cpu}\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2596.150\nflags\t\t: sse2 avx2 fma" for cpu in (0, 1)
)


def test_physical_peak_from_a_fixed_cpuinfo():
    # 2 physical cores (4 hyper-threads) x 16 lanes x 2 FMA pipes x 2 FLOPs x 2.6 GHz rated in the model name:
    # the fluctuating "cpu MHz" values (800-3400) play no part
    peak = hardware.physical_cpu_peak(XEON, {0, 1, 2, 3})
    assert peak.flops_per_sec == 2 * 64 * 2.6e9
    assert peak.definition == "physical"
    assert "2 physical cores / 1 process(es) x 64 float32 FLOP/cycle (16 lanes, avx512f" in peak.source
    assert peak.source.endswith("x 2.600 GHz (model name)")
    # cpufreq's maximum comes first; two processes of the run on the node share the cores
    shared = hardware.physical_cpu_peak(XEON, {0, 1, 2, 3}, max_freq_khz=3.4e6, processes_sharing=2)
    assert shared.flops_per_sec == 1 * 64 * 3.4e9 and "(cpufreq cpuinfo_max_freq)" in shared.source
    # only the CPUs this process may use count: processors 0 and 2 are one core
    assert hardware.physical_cpu_peak(XEON, {0, 2}).flops_per_sec == 64 * 2.6e9
    # no topology: one core per logical CPU; avx2+fma: 8 lanes; the clock from "cpu MHz"
    vm = hardware.physical_cpu_peak(VM, {0, 1})
    assert vm.flops_per_sec == pytest.approx(2 * 32 * 2596.150e6)
    assert "2 logical CPUs" in vm.source and "avx2+fma" in vm.source and "(cpu MHz)" in vm.source
    assert hardware.physical_cpu_peak(VM, {7}) is None  # not a CPU the text describes


@pytest.mark.skipif(hardware.gpu_name() is not None, reason="the CPU's peak: on a GPU the datasheet's is used")
def test_the_cpu_peak_is_the_same_under_load_and_above_the_measured_one():
    idle = hardware.resolve_peak_flops(None)
    assert idle == hardware.read_physical_cpu_peak() and idle.definition == "physical"
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        time.sleep(1.0)
        loaded = hardware.resolve_peak_flops(None)
        achievable = hardware.measure_matmul_flops(sizes=(256, 512), repeats=2, min_seconds=0.1)
    finally:
        for process in burners:
            process.kill()
            process.wait()
    assert loaded == idle  # the figure and its source, to the bit
    assert achievable < idle.flops_per_sec  # MFU against the physical peak is below MFU against the measured one
    assert hardware.resolve_peak_flops(5e9) == (5e9, "override: peak_flops_per_card")


def test_goodput_counts_the_step_time_past_the_resumed_checkpoint_as_lost(tmp_path):
    def write(folder, run_time):
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, TIME_HISTORY_FILE), "w") as f:
            json.dump(run_time.__dict__, f)

    phases = dict.fromkeys(PHASES, 1.0)
    write(tmp_path / "checkpoint-3", RunTime(1, 3, 30.0, 6.0, 0.0, phases))
    latest = RunTime(1, 5, 50.0, 10.0, 0.0, {**phases, "forward_backward": 9.0})
    before = previous_run_time(str(tmp_path / "checkpoint-3"), latest)
    assert (before.attempts, before.global_step, before.wall_seconds) == (1, 3, 50.0)
    assert before.productive_seconds == 6.0 and before.lost_seconds == 4.0  # steps 4 and 5 are redone
    assert before.phase_seconds["forward_backward"] == 9.0
    # no later record (it was lost): the checkpoint's own; from scratch: everything the last attempt did is lost
    assert previous_run_time(str(tmp_path / "checkpoint-3"), None).wall_seconds == 30.0
    assert previous_run_time(None, latest).lost_seconds == 10.0
    assert RunTime(wall_seconds=50.0, productive_seconds=10.0).goodput == 0.2 and RunTime().goodput is None


def test_the_board_stacks_the_phases_and_ranks_have_extremes():
    record = {"loss": 1.0, "time_data_wait": 0.5, "time_forward_backward": 2.0, "time_other": 0.25}
    assert stacked_time_lines(record) == {"1 data_wait": 0.5, "2 +forward_backward": 2.5, "3 +other": 2.75}
    nan = float("nan")
    figures = {"peak_memory_gib": [1.0, 3.0, 2.0], "step_seconds": [0.5, 0.75, nan], "data_wait_seconds": [nan] * 3}
    assert rank_extremes(figures) == {
        "peak_memory_gib_max": 3.0,
        "peak_memory_max_rank": 1,
        "step_seconds_max": 0.75,
        "slowest_rank": 1,
        "slowest_rank_lag_seconds": 0.25,
    }


def test_waits_between_micro_batches_are_not_compute():
    # paddlenlp's loop with 2 micro-batches: its forward-backward timer runs from the first batch's
    # forward to the last one's backward, across the wait for the second batch
    breakdown = TimeBreakdown(start_time=time.time())
    breakdown.on_train_begin(None, None, None)
    breakdown.on_epoch_begin(None, None, None)
    time.sleep(0.1)  # the first batch
    breakdown.on_load_data_end(None, None, None)
    breakdown.timers("forward-backward").start()
    time.sleep(0.05)  # its forward and backward
    breakdown.on_substep_end(None, None, None)
    time.sleep(0.2)  # the second batch
    breakdown.on_load_data_end(None, None, None)
    time.sleep(0.05)
    breakdown.timers("forward-backward").stop()
    for name in ("all-reduce", "optimizer-step"):
        breakdown.timers(name).start()
        breakdown.timers(name).stop()
    breakdown.on_step_end(None, None, None)
    record = breakdown.interval_record()
    assert record["time_data_wait"] == pytest.approx(0.3, abs=0.05)
    assert record["time_forward_backward"] == pytest.approx(0.1, abs=0.05)
    assert sum(record.values()) == pytest.approx(0.4, abs=0.05)  # the step's wall time


def _train(tmp_path, name, *extra):
    """A 6-step tiny run in this process, 2 micro-batches of 2 samples per step, checkpoints at 3 and 6.

    Its wall time counts from this call, as a run's own process would (not from pytest's start: the in-process
    runs' goodputs would then shrink with the age of the test session, not with their own waits)."""
    out = str(tmp_path / name)
    argv = tiny_args(out, str(tmp_path / "cache"), "--per_device_train_batch_size", "2", *extra, steps=6)
    started = time.time()
    with pretrain_log_records() as messages, mock.patch.object(time_breakdown, "process_start_time", lambda: started):
        summary = load_script("run_pretrain.py").main(argv + ["--gradient_accumulation_steps", "2"])
    return summary, messages


DELAY = 0.5  # seconds per micro-batch
SLOW_SAVE = 0.6  # seconds added to each checkpoint save


@pytest.mark.slow
def test_an_injected_data_delay_shows_as_data_wait_and_a_slow_save_as_save_time(tmp_path, demo_dir, monkeypatch):
    base, _ = _train(tmp_path, "base")
    # paddle's DataLoader reads ahead in a thread, which hides a slow dataset or collate behind compute:
    # the delay goes where the loop takes each batch, as a loader that cannot keep up makes it wait
    single_process = dataloader_iter._DataLoaderIterSingleProcess
    next_batch = single_process.__next__

    def slow_next(self):
        time.sleep(DELAY)
        return next_batch(self)

    mark_complete = checkpoint.mark_complete

    def slow_mark(*args, **kwargs):
        time.sleep(SLOW_SAVE)
        return mark_complete(*args, **kwargs)

    monkeypatch.setattr(single_process, "__next__", slow_next)
    monkeypatch.setattr(checkpoint, "mark_complete", slow_mark)
    slow, messages = _train(tmp_path, "slow")

    def per_step(summary, phase):
        return summary["time_breakdown"][phase] / summary["steps_run_this_process"]

    # 2 micro-batches per step: 2 x DELAY more waiting per step, and none of it counted as compute
    added_wait = per_step(slow, "data_wait") - per_step(base, "data_wait")
    assert added_wait == pytest.approx(2 * DELAY, rel=0.1)
    assert slow["per_rank"]["data_wait_seconds"][0] == pytest.approx(per_step(slow, "data_wait"))
    # compute stays: not the delay of the second micro-batch, which paddlenlp's forward-backward timer spans
    # (to the millisecond in test_waits_between_micro_batches_are_not_compute; here under other jobs' noise)
    assert per_step(slow, "forward_backward") - per_step(base, "forward_backward") < 2 * DELAY
    # each save logs its duration, which covers the injected delay; the summary counts both saves
    saves = [float(m.split(" in ")[1].split(" s")[0]) for m in messages if m.startswith("saved checkpoint-")]
    assert len(saves) == 2 and all(seconds >= SLOW_SAVE for seconds in saves)
    # the log prints each duration to 0.01 s, so their sum may round up past the exact total by up to 0.005 s each
    assert slow["time_breakdown"]["checkpoint_save"] >= sum(saves) - 0.005 * len(saves)
    assert slow["time_breakdown"]["checkpoint_save"] >= 2 * SLOW_SAVE
    # the phases add up to the wall time; goodput is the productive share
    assert sum(slow["time_breakdown"].values()) == pytest.approx(slow["wall_seconds"], rel=1e-6)
    productive = sum(slow["time_breakdown"][phase] for phase in PRODUCTIVE_PHASES)
    assert slow["goodput"] == pytest.approx(productive / slow["wall_seconds"])
    assert slow["goodput"] < base["goodput"]


def _read(path):
    with open(path) as f:
        return json.load(f)


@pytest.mark.slow
def test_goodput_over_a_run_with_one_restart_counts_the_lost_steps(tmp_path, demo_dir):
    out, cache = str(tmp_path / "run"), str(tmp_path / "cache")
    command = python_script(*tiny_args(out, cache, steps=8, save_steps=3))
    latest = os.path.join(out, TIME_HISTORY_FILE)

    def past_step_4():
        try:
            return _read(latest)["global_step"] >= 4
        except (OSError, ValueError):  # not written yet
            return False

    assert kill_on(start(command, log_path=out + ".1.log"), past_step_4), f"see {out}.1.log"
    crashed, saved = _read(latest), _read(os.path.join(out, "checkpoint-3", TIME_HISTORY_FILE))
    assert crashed["global_step"] in (4, 5) and saved["global_step"] == 3
    assert run(command, log_path=out + ".2.log") == 0, f"see {out}.2.log"
    summary = _read(os.path.join(out, "run_summary.json"))
    assert summary["attempts"] == 2 and summary["steps_run_this_process"] == 5  # steps 4-8 again
    lost = crashed["productive_seconds"] - saved["productive_seconds"]
    assert lost > 0 and summary["lost_seconds"] == pytest.approx(lost)
    productive = sum(summary["time_breakdown"][phase] for phase in PRODUCTIVE_PHASES)
    assert summary["productive_seconds"] == pytest.approx(productive - lost)
    assert summary["goodput"] == pytest.approx((productive - lost) / summary["wall_seconds"])
    assert summary["wall_seconds"] > crashed["wall_seconds"]  # both attempts
    assert sum(summary["time_breakdown"].values()) == pytest.approx(summary["wall_seconds"], rel=1e-6)


RANK_DELAY = 0.25  # seconds per batch, rank 1 only (where the loop takes it, as in the test above)
SLOW_RANK = f"""
import os, runpy, sys, time
sys.path.insert(0, {REPO!r})
from paddle.io.dataloader import dataloader_iter
single_process = dataloader_iter._DataLoaderIterSingleProcess
next_batch = single_process.__next__
def slow_next(self):
    if os.environ.get("PADDLE_TRAINER_ID") == "1":
        time.sleep({RANK_DELAY})
    return next_batch(self)
single_process.__next__ = slow_next
sys.argv = [os.path.join({REPO!r}, "run_pretrain.py"), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_two_ranks_report_the_max_over_ranks_and_which_rank(tmp_path, demo_dir):
    out, logs = str(tmp_path / "run"), str(tmp_path / "logs")
    wrapper = tmp_path / "slow_rank_1.py"
    wrapper.write_text(SLOW_RANK)
    command = launch_command(2, logs)[:-1] + [str(wrapper), *tiny_args(out, str(tmp_path / "cache"), steps=5)]
    assert run(command, log_path=str(tmp_path / "launch.log"), timeout=420) == 0, f"see {logs}/workerlog.*"
    summary = _read(os.path.join(out, "run_summary.json"))
    per_rank = summary["per_rank"]
    assert len(per_rank["peak_memory_gib"]) == 2 and all(value > 0 for value in per_rank["peak_memory_gib"])
    top = max(range(2), key=lambda rank: per_rank["peak_memory_gib"][rank])
    assert (summary["peak_memory_max_rank"], summary["peak_memory_gib_max"]) == (top, per_rank["peak_memory_gib"][top])
    # rank 1's loader is slow: it waits for data, rank 0 waits for it in the gradient all-reduce
    assert summary["data_wait_max_rank"] == 1
    waits = per_rank["data_wait_seconds"]
    assert waits[1] - waits[0] == pytest.approx(RANK_DELAY, rel=0.25)
    assert summary["slowest_rank"] in (0, 1) and summary["slowest_rank_lag_seconds"] >= 0
    with open(os.path.join(logs, "workerlog.0"), errors="replace") as f:
        log = f.read()
    assert re.search(r"\| mem [\d.]+ GiB \(max [\d.]+ on rank [01]\) \|", log)  # each record names the max rank
