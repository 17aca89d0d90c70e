"""Where the time goes: the per-step breakdown against injected delays, goodput over a restart, the
physical CPU peak (load cannot change it), and the max over ranks of a 2-rank run."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from unittest import mock

import pytest
from conftest import REPO, load_script, pretrain_log_records
from paddle.io.dataloader import dataloader_iter
from tiny_run import launch_command, python_script, run, tiny_args

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
from pretrain.trainer import PretrainingTrainer

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

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
    idle = hardware.resolve_peak_flops(None, half=False)
    assert idle == hardware.read_physical_cpu_peak() and idle.definition == "physical"
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        time.sleep(1.0)
        loaded = hardware.resolve_peak_flops(None, half=False)
        achievable = hardware.measure_matmul_flops(sizes=(256, 512), repeats=2, min_seconds=0.1)
    finally:
        for process in burners:
            process.kill()
            process.wait()
    assert loaded == idle  # the figure and its source, to the bit
    assert achievable < idle.flops_per_sec  # MFU against the physical peak is below MFU against the measured one
    assert hardware.resolve_peak_flops(5e9, half=False) == (5e9, "override: peak_flops_per_card")


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


def test_a_rollback_in_the_process_counts_the_redone_steps_as_lost_and_this_process_once(tmp_path):
    # loss_spike_policy rollback: the process goes back to checkpoint-1 after step 3 and trains on
    started = time.time()
    breakdown = TimeBreakdown(start_time=started, output_dir=str(tmp_path))
    no_state = (None, None, None)

    def step(seconds):
        breakdown.timers("forward-backward").start()
        time.sleep(seconds)
        breakdown.timers("forward-backward").stop()
        breakdown.on_step_end(*no_state)

    breakdown.on_train_begin(*no_state)
    step(0.01)
    breakdown.write_record(str(tmp_path / "checkpoint-1"), 1)
    step(0.02)
    step(0.02)
    breakdown.write_record(str(tmp_path), 3, durable=False)  # output_dir's record at step 3: this process's time so far
    at_rollback = breakdown.run_time(3)
    breakdown.restore(str(tmp_path / "checkpoint-1"))
    breakdown.on_train_begin(*no_state)  # paddlenlp's loop starts again from checkpoint-1
    step(0.01)
    ended = _call(breakdown.run_time, 2)
    run_time = ended[2]
    saved = time_breakdown.read_run_time(str(tmp_path / "checkpoint-1"))
    assert run_time.attempts == 1  # one process, its wall time once
    assert ended[0][1] - started <= run_time.wall_seconds <= ended[1][1] - started
    assert sum(run_time.phase_seconds.values()) == pytest.approx(run_time.wall_seconds)
    lost = at_rollback.productive_seconds - saved.productive_seconds  # steps 2 and 3
    assert lost >= 0.04 and run_time.lost_seconds == pytest.approx(lost)
    assert run_time.productive_seconds == pytest.approx(breakdown.totals["forward_backward"] - lost)


def test_the_board_stacks_the_phases_and_ranks_have_extremes():
    record = {"loss": 1.0, "time_data_wait": 0.5, "time_forward_backward": 2.0, "time_other": 0.25}
    assert stacked_time_lines(record) == {"1 data_wait": 0.5, "2 +forward_backward": 2.5, "3 +other": 2.75}
    nan = float("nan")
    figures = {"peak_memory_gib": [1.0, 3.0, 2.0], "step_seconds": [0.5, 0.75, nan], "data_wait_seconds": [nan] * 3}
    figures["tokens_per_card_per_sec"] = [900.0, 800.0, 950.0]
    assert rank_extremes(figures) == {
        "tokens_per_card_per_sec_max": 950.0,
        "tokens_per_card_per_sec_max_rank": 2,
        "peak_memory_gib_max": 3.0,
        "peak_memory_max_rank": 1,
        "step_seconds_max": 0.75,
        "slowest_rank": 1,
        "slowest_rank_lag_seconds": 0.25,
    }


def _call(function, *args):
    """Call ``function(*args)``; return ((perf_counter, time.time) just before, the same just after, its result).
    What ``function`` reads from a clock lies between the two readings, however loaded the machine."""
    before = (time.perf_counter(), time.time())
    result = function(*args)
    return before, (time.perf_counter(), time.time()), result


def _bounds(start, stop, clock: int) -> tuple:
    """(least, most) seconds a clock (0: perf_counter, 1: time.time) read inside the ``_call`` ``start`` and
    again inside the ``_call`` ``stop`` can have measured."""
    return stop[0][clock] - start[1][clock], stop[1][clock] - start[0][clock]


CLOCKS_APART = 1e-3  # s: paddlenlp's timers read time.time, ours perf_counter; the two may drift this much apart


def test_waits_between_micro_batches_are_not_compute():
    # paddlenlp's loop with 2 micro-batches: its forward-backward timer runs from the first batch's forward to
    # the last one's backward, across the wait for the second batch. The sleeps stand for the batches and the
    # compute; each figure is checked against the clocks read around the calls that start and stop it, so a
    # late wake-up on a busy machine moves both sides alike.
    breakdown = TimeBreakdown(start_time=time.time())
    forward_backward = breakdown.timers("forward-backward")
    no_state = (None, None, None)  # args, state, control: TimeBreakdown reads none of them
    began = _call(breakdown.on_train_begin, *no_state)
    wait_1 = _call(breakdown.on_epoch_begin, *no_state)
    time.sleep(0.1)  # the first batch
    got_1 = _call(breakdown.on_load_data_end, *no_state)
    computing = _call(forward_backward.start)
    time.sleep(0.05)  # its forward and backward
    wait_2 = _call(breakdown.on_substep_end, *no_state)
    time.sleep(0.2)  # the second batch
    got_2 = _call(breakdown.on_load_data_end, *no_state)
    time.sleep(0.05)  # its forward and backward
    computed = _call(forward_backward.stop)
    for name in ("all-reduce", "optimizer-step"):
        breakdown.timers(name).start()
        breakdown.timers(name).stop()
    breakdown.on_step_end(*no_state)
    recorded = _call(breakdown.interval_record)
    record = recorded[2]
    waits = [_bounds(wait_1, got_1, 0), _bounds(wait_2, got_2, 0)]
    assert sum(low for low, _ in waits) <= record["time_data_wait"] <= sum(high for _, high in waits)
    assert record["time_data_wait"] >= 0.3  # both sleeps
    # the timer's span less the second wait: what the loop spent computing, about 0.1 s, not 0.3 s
    span_low, span_high = _bounds(computing, computed, 1)
    compute = (span_low - waits[1][1] - CLOCKS_APART, span_high - waits[1][0] + CLOCKS_APART)
    assert compute[0] <= record["time_forward_backward"] <= compute[1]
    wall_low, wall_high = _bounds(began, recorded, 0)
    assert wall_low <= sum(record.values()) <= wall_high + CLOCKS_APART  # the step's wall time


def test_paddlenlp_may_start_its_read_data_timer_while_it_runs_and_no_other_timer():
    # paddlenlp 3.0.0b4 starts "read-data" after each micro-batch a skipped window drops and never stops it
    # (without ignore_data_skip): a second start must be harmless; every other timer keeps paddlenlp's assertion.
    timers = TimeBreakdown(start_time=time.time()).timers
    for _ in range(3):
        timers("read-data").start()
    assert timers("read-data").started_ and timers("read-data") is timers.timers["read-data"]
    timers("forward-backward").start()
    with pytest.raises(AssertionError, match="forward-backward timer has already started"):
        timers("forward-backward").start()


def _train(tmp_path, name, *extra):
    """A 6-step tiny run in this process, 2 micro-batches of 2 samples per step, checkpoints at 3 and 6:
    its summary, its log messages, and the seconds its forward and backward took per step, timed around each
    ``PretrainingTrainer.training_step`` call (one micro-batch's forward, backward and loss check).

    Its wall time counts from this call, as a run's own process would (not from pytest's start: the in-process
    runs' goodputs would then shrink with the age of the test session, not with their own waits)."""
    out = str(tmp_path / name)
    argv = tiny_args(out, str(tmp_path / "cache"), "--per_device_train_batch_size", "2", *extra, steps=6)
    training_step, computing = PretrainingTrainer.training_step, []

    def timed_training_step(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return training_step(self, *args, **kwargs)
        finally:
            computing.append(time.perf_counter() - start)

    started = time.time()
    with (
        pretrain_log_records() as messages,
        mock.patch.object(time_breakdown, "process_start_time", lambda: started),
        mock.patch.object(PretrainingTrainer, "training_step", timed_training_step),
    ):
        summary = load_script("run_pretrain.py").main(argv + ["--gradient_accumulation_steps", "2"])
    return summary, messages, sum(computing) / summary["steps_run_this_process"]


DELAY = 0.5  # seconds per micro-batch
SLOW_SAVE = 0.6  # seconds added to each checkpoint save


def _per_step(summary: dict, phase: str) -> float:
    return summary["time_breakdown"][phase] / summary["steps_run_this_process"]


@pytest.mark.slow
def test_an_injected_data_delay_shows_as_data_wait_and_a_slow_save_as_save_time(tmp_path, demo_dir, monkeypatch):
    base, _, base_compute = _train(tmp_path, "base")
    # paddle's DataLoader reads ahead in a thread, which hides a slow dataset or collate behind compute:
    # the delay goes where the loop takes each batch, as a loader that cannot keep up makes it wait.
    # What each sleep took is timed: on a busy machine a sleep wakes late, and the loop waited that long.
    single_process = dataloader_iter._DataLoaderIterSingleProcess
    next_batch, slept = single_process.__next__, []

    def slow_next(self):
        start = time.perf_counter()
        time.sleep(DELAY)
        slept.append(time.perf_counter() - start)
        return next_batch(self)

    mark_complete = checkpoint.mark_complete

    def slow_mark(*args, **kwargs):
        time.sleep(SLOW_SAVE)
        return mark_complete(*args, **kwargs)

    monkeypatch.setattr(single_process, "__next__", slow_next)
    monkeypatch.setattr(checkpoint, "mark_complete", slow_mark)
    slow, messages, slow_compute = _train(tmp_path, "slow")

    # 2 micro-batches per step: about 2 x DELAY more waiting per step, and none of it counted as compute
    assert len(slept) == 2 * slow["steps_run_this_process"]  # one delay per micro-batch, no batch fetched beyond
    injected = sum(slept) / slow["steps_run_this_process"]
    added_wait = _per_step(slow, "data_wait") - _per_step(base, "data_wait")
    assert added_wait == pytest.approx(injected, rel=0.1), (added_wait, injected)
    assert slow["per_rank"]["data_wait_seconds"][0] == pytest.approx(_per_step(slow, "data_wait"))
    # compute stays: forward_backward is the time of the training steps themselves, in either run; the delay of
    # the second micro-batch, which paddlenlp's forward-backward timer spans, would add DELAY per step
    for summary, compute in ((base, base_compute), (slow, slow_compute)):
        phases = summary["time_breakdown"]
        assert _per_step(summary, "forward_backward") == pytest.approx(compute, abs=DELAY / 4), phases
    # each save logs its duration, which covers the injected delay; the summary counts both saves
    saves = [float(m.split(" in ")[1].split(" s")[0]) for m in messages if m.startswith("saved checkpoint-")]
    assert len(saves) == 2 and all(seconds >= SLOW_SAVE for seconds in saves), saves
    # the log prints each duration to 0.01 s, so their sum may round up past the exact total by up to 0.005 s each
    assert slow["time_breakdown"]["checkpoint_save"] >= sum(saves) - 0.005 * len(saves)
    assert slow["time_breakdown"]["checkpoint_save"] >= 2 * SLOW_SAVE
    # the phases add up to the wall time; goodput is the productive share
    assert sum(slow["time_breakdown"].values()) == pytest.approx(slow["wall_seconds"], rel=1e-6)
    productive = sum(slow["time_breakdown"][phase] for phase in PRODUCTIVE_PHASES)
    assert slow["goodput"] == pytest.approx(productive / slow["wall_seconds"])


def _read(path):
    with open(path) as f:
        return json.load(f)


def _patched_run_pretrain(path, patch: str) -> str:
    """Write a script to ``path`` that runs ``patch`` (Python source; ``os``, ``sys`` and ``time`` imported) and
    then run_pretrain.py with the script's arguments, as its own process would; return the script's path."""
    path.write_text(
        f"import os, runpy, sys, time\nsys.path.insert(0, {REPO!r})\n{patch}\n"
        f"sys.argv = [os.path.join({REPO!r}, 'run_pretrain.py'), *sys.argv[1:]]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    return str(path)


CRASH_AT = 5  # the first attempt dies (SIGKILL) right after writing its log record of this step
CRASH = f"""
import signal
from pretrain.metrics.time_breakdown import TimeBreakdown
write = TimeBreakdown.write_record
def write_then_crash(self, folder, global_step, durable=True):
    write(self, folder, global_step, durable)
    if global_step == {CRASH_AT} and not durable:  # output_dir's copy at the step's log record
        os.kill(os.getpid(), signal.SIGKILL)
TimeBreakdown.write_record = write_then_crash
"""


@pytest.mark.slow
def test_goodput_over_a_run_with_one_restart_counts_the_lost_steps(tmp_path, demo_dir):
    # the crash comes from inside the run at a fixed step: a kill from outside, polling for a step, could land a
    # step or two late on a busy machine, past the next checkpoint
    out, cache = str(tmp_path / "run"), str(tmp_path / "cache")
    args = tiny_args(out, cache, steps=8, save_steps=3)
    crashing = [sys.executable, _patched_run_pretrain(tmp_path / "crash.py", CRASH), *args]
    assert run(crashing, log_path=out + ".1.log") == -signal.SIGKILL, f"see {out}.1.log"
    crashed = _read(os.path.join(out, TIME_HISTORY_FILE))
    saved = _read(os.path.join(out, "checkpoint-3", TIME_HISTORY_FILE))
    assert (crashed["global_step"], saved["global_step"]) == (CRASH_AT, 3)
    assert run(python_script(*args), log_path=out + ".2.log") == 0, f"see {out}.2.log"
    summary = _read(os.path.join(out, "run_summary.json"))
    assert summary["attempts"] == 2 and summary["steps_run_this_process"] == 5  # steps 4-8 again
    lost = crashed["productive_seconds"] - saved["productive_seconds"]  # the first attempt's steps 4 and 5
    assert lost > 0 and summary["lost_seconds"] == pytest.approx(lost)
    productive = sum(summary["time_breakdown"][phase] for phase in PRODUCTIVE_PHASES)
    assert summary["productive_seconds"] == pytest.approx(productive - lost)
    assert summary["goodput"] == pytest.approx((productive - lost) / summary["wall_seconds"])
    assert summary["wall_seconds"] > crashed["wall_seconds"]  # both attempts
    assert sum(summary["time_breakdown"].values()) == pytest.approx(summary["wall_seconds"], rel=1e-6)


RANK_DELAY = 0.25  # seconds per batch, rank 1 only (where the loop takes it, as in the in-process test above)


def _slow_rank_1(slept_log: str) -> str:
    """A ``_patched_run_pretrain`` patch: rank 1's loop waits RANK_DELAY for each batch; what each wait took
    (a busy machine wakes a sleep late) is appended to ``slept_log``, one line of seconds per batch."""
    return f"""
from paddle.io.dataloader import dataloader_iter
single_process = dataloader_iter._DataLoaderIterSingleProcess
next_batch = single_process.__next__
def slow_next(self):
    if os.environ.get("PADDLE_TRAINER_ID") == "1":
        start = time.perf_counter()
        time.sleep({RANK_DELAY})
        with open({slept_log!r}, "a") as f:
            f.write(f"{{time.perf_counter() - start}}\\n")
    return next_batch(self)
single_process.__next__ = slow_next
"""


@pytest.mark.slow
def test_two_ranks_report_the_max_over_ranks_and_which_rank(tmp_path, demo_dir):
    out, logs, slept_log = str(tmp_path / "run"), str(tmp_path / "logs"), str(tmp_path / "slept.rank1")
    wrapper = _patched_run_pretrain(tmp_path / "slow_rank_1.py", _slow_rank_1(slept_log))
    command = launch_command(2, logs)[:-1] + [wrapper, *tiny_args(out, str(tmp_path / "cache"), steps=5)]
    assert run(command, log_path=str(tmp_path / "launch.log"), timeout=420) == 0, f"see {logs}/workerlog.*"
    summary = _read(os.path.join(out, "run_summary.json"))
    per_rank = summary["per_rank"]
    assert len(per_rank["peak_memory_gib"]) == 2 and all(value > 0 for value in per_rank["peak_memory_gib"])
    top = max(range(2), key=lambda rank: per_rank["peak_memory_gib"][rank])
    assert (summary["peak_memory_max_rank"], summary["peak_memory_gib_max"]) == (top, per_rank["peak_memory_gib"][top])
    # rank 1's loader is slow: it waits for data, rank 0 waits for it in the gradient all-reduce
    assert summary["data_wait_max_rank"] == 1
    with open(slept_log) as f:
        slept = [float(line) for line in f]
    assert len(slept) == summary["steps_run_this_process"]  # one batch per step
    waits = per_rank["data_wait_seconds"]
    assert waits[1] - waits[0] == pytest.approx(sum(slept) / len(slept), rel=0.25), (waits, slept)
    assert summary["slowest_rank"] in (0, 1) and summary["slowest_rank_lag_seconds"] >= 0
    with open(os.path.join(logs, "workerlog.0"), errors="replace") as f:
        log = f.read()
    assert re.search(r"\| mem [\d.]+ GiB \(max [\d.]+ on rank [01]\) \|", log)  # each record names the max rank
