"""Where a run's time goes: a per-step breakdown by phase, and goodput over the whole run, restarts included.

Phases (seconds of wall-clock time, this process, global rank 0's in the files):

  startup           process start -> training begins: imports, data build, model build, checkpoint load
  data_wait         the training loop waiting for its next batch (between micro-batches too); loading
                    that paddle's DataLoader does ahead in its thread while the step computes is no wait
  forward_backward  forward and backward of a step's micro-batches (paddlenlp's ``forward-backward``
                    timer, less the data waits between micro-batches that it spans), the loss check included
  communication     gradient all-reduce / sharding reduce outside backward (paddlenlp's ``all-reduce``
                    timer: recompute, master-grad data parallel, hybrid parallel). On CPU processes
                    (gloo) also the time inside every collective and pipeline transfer that runs
                    within forward_backward or optimizer (tensor/sequence-parallel all-reduces,
                    pipeline send/recv, sharding reduce and broadcast), moved out of those phases
                    (``pretrain.metrics.comm_volume`` times each call). On a GPU those run on the compute
                    stream inside the other phases and stay there: NCCL calls return before the
                    transfer ends, so a host clock cannot separate them. Plain data parallelism
                    all-reduces inside backward (paddle's C++ reducer, not timed), so there it is part
                    of forward_backward
  optimizer         the optimizer step (paddlenlp's ``optimizer-step`` timer)
  evaluation        ``PretrainingTrainer.evaluate``
  checkpoint_save   ``PretrainingTrainer._save_checkpoint`` (barriers, marker, rotation) and the final save
  other             the rest: logging, callbacks, the log records' collectives, the end of the run

The step phases are paddlenlp's own ``Timers`` (``paddlenlp.trainer.plugins.timer``, which the
Trainer starts and stops around each phase of its loop; this module enables them as
``skip_profile_timer: false`` would, in a group of its own, ``LoopTimers``, and reads them instead of
paddlenlp printing them every step).
On a GPU their ``_Timer`` synchronizes the device at start and stop, so a phase holds the device's
time. ``data_wait`` is a host clock (``time.perf_counter``), started when a (micro-)step ends and
stopped when its batch arrives (``on_load_data_end``): a device synchronization per micro-batch
would stall the pipeline it measures.

Each training log record holds the interval since the previous one as seconds per optimizer step:
``time_<phase>`` for every phase but startup, summing to the interval's wall time per step
(evaluation and saving spread over the interval's steps). The run summary's ``time_breakdown`` holds
seconds over the whole run, every attempt (restart) included, summing to ``wall_seconds``.

Goodput (the share of wall time in productive training steps, as in Google's "ML Goodput"):

    goodput = (forward_backward + communication + optimizer - lost) / wall

where ``lost`` is the step time of work a restart redid: the steps an attempt ran after the
checkpoint the next attempt resumed from, or after the checkpoint a rollback (``loss_spike_policy
rollback``, in the same process) went back to. Startup, data waits, evaluation, saving and other time
are not productive. The history travels with the checkpoints: ``time_history.json`` (``RunTime``)
is written into each checkpoint and, after each log record and save, into ``output_dir``
(the latest state of the attempt that may crash next). A resumed run adds the previous attempts'
wall time from ``output_dir``'s copy (up to its last log record: the seconds between that and a
crash are not known to the run, nor is time with no process of the run alive) and counts the step
time beyond its checkpoint as lost.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from paddlenlp.trainer import TrainerCallback
from paddlenlp.trainer.plugins.timer import Timers, _Timer

from pretrain.atomic import partial_path, write_json
from pretrain.errors import UserError
from pretrain.metrics.comm_volume import COUNTER

TIME_HISTORY_FILE = "time_history.json"
PHASES = (
    "startup",
    "data_wait",
    "forward_backward",
    "communication",
    "optimizer",
    "evaluation",
    "checkpoint_save",
    "other",
)
STEP_PHASES = ("data_wait", "forward_backward", "communication", "optimizer")  # within a training step
PRODUCTIVE_PHASES = ("forward_backward", "communication", "optimizer")
# paddlenlp's timer name (trainer.py's training loop) -> phase
PADDLENLP_TIMERS = {
    "forward-backward": "forward_backward",
    "all-reduce": "communication",
    "optimizer-step": "optimizer",
}
OWN_TIMERS = {"evaluation": "evaluation", "checkpoint-save": "checkpoint_save"}  # started by PretrainingTrainer
READ_DATA_TIMER = "read-data"  # paddlenlp's, never read here (data_wait is a host clock): see LoopTimers


class _RestartableTimer(_Timer):
    """paddlenlp's ``_Timer``, whose ``start`` while running keeps it running instead of asserting."""

    def start(self):
        if not self.started_:
            super().start()


class LoopTimers(Timers):
    """paddlenlp's timer group for its training loop, except that its ``read-data`` timer may be started
    while it runs.

    paddlenlp 3.0.0b4's loop (``Trainer._inner_training_loop``) starts ``read-data`` after every
    micro-batch that ``skip_data_intervals`` drops, but stops it (when the next batch arrives) only with
    ``ignore_data_skip``: with ``gradient_accumulation_steps`` > 1, or two dropped steps in a row, the next
    start failed with ``AssertionError: read-data timer has already started`` (every skipped window and
    rollback of an accumulating run, and its restart). Nothing reads that timer (``data_wait`` is measured
    by ``TimeBreakdown`` itself), so a start while running is simply a no-op.
    """

    def __call__(self, name, use_event=False):
        if name == READ_DATA_TIMER:
            return self.timers.setdefault(name, _RestartableTimer(name))
        return super().__call__(name, use_event)


@dataclass
class RunTime:
    """The time of a whole run up to a moment, every attempt included (the ``time_history.json`` format).

    ``phase_seconds`` sum to ``wall_seconds``; ``productive_seconds`` are the step seconds
    (PRODUCTIVE_PHASES) of the steps that count, ``lost_seconds`` those of the steps redone after a restart
    or a rollback.
    """

    attempts: int = 0  # processes that trained this run, this one included
    global_step: int = 0
    wall_seconds: float = 0.0
    productive_seconds: float = 0.0
    lost_seconds: float = 0.0
    phase_seconds: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    @property
    def goodput(self) -> Optional[float]:
        """productive / wall, a fraction in [0, 1]; None before any wall time."""
        return self.productive_seconds / self.wall_seconds if self.wall_seconds > 0 else None


def read_run_time(folder: Optional[str]) -> Optional[RunTime]:
    """The RunTime in ``folder/time_history.json``; None when ``folder`` is None or holds none.

    Raises:
        UserError: the file is not in this format.
    """
    path = os.path.join(folder, TIME_HISTORY_FILE) if folder else None
    if path is None or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        return RunTime(**{**record, "phase_seconds": {**dict.fromkeys(PHASES, 0.0), **record["phase_seconds"]}})
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a time history ({e!r}); delete it (the run's time then starts anew)") from e


def previous_run_time(checkpoint_folder: Optional[str], latest: Optional[RunTime]) -> RunTime:
    """The time of the attempts before this one, resuming from ``checkpoint_folder`` (None: from scratch).

    Args:
        latest: the previous attempts' latest record (``output_dir``'s time_history.json), None if none.

    The productive seconds are the checkpoint's (the steps after it will be redone): the previous
    attempt's productive seconds beyond them are added to the lost ones. The wall and phase seconds
    are the latest record's (or the checkpoint's, if that is later).
    """
    saved = read_run_time(checkpoint_folder) or RunTime()
    if latest is None or latest.wall_seconds < saved.wall_seconds:
        latest = saved
    lost = latest.lost_seconds + max(0.0, latest.productive_seconds - saved.productive_seconds)
    return RunTime(
        latest.attempts, saved.global_step, latest.wall_seconds, saved.productive_seconds, lost, latest.phase_seconds
    )


_IMPORTED_AT = time.time()


def process_start_time() -> float:
    """When this process started (seconds since the epoch, to the second): Linux's boot time (``btime``
    of /proc/stat) plus the process's ``starttime`` (field 22 of /proc/self/stat, clock ticks after
    boot; proc(5)); where /proc cannot say, when this module was imported."""
    try:
        with open("/proc/self/stat", encoding="utf-8") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat", encoding="utf-8") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED_AT


class TimeBreakdown(TrainerCallback):
    """Accumulates the phases of this process (see the module docstring) on paddlenlp's timers.

    The trainer calls ``step_complete`` once a step's logging, evaluation and saving are done (paddlenlp's
    ``_print_timer`` hook), ``timed`` around evaluation and saving, ``interval_record`` at each log record and
    ``run_time`` for the summary and the files; the checkpoint manager ``restore`` at the start of ``train`` and
    ``write`` into each checkpoint (the run-state protocol of ``pretrain.checkpoint_manager``).
    """

    def __init__(self, start_time: Optional[float] = None, output_dir: str = "", overwrite_output_dir: bool = False):
        """Args:
        start_time: when this process started (epoch seconds); default ``process_start_time()``.
        output_dir: the run's folder, whose ``time_history.json`` holds the previous attempts' time.
        overwrite_output_dir: a run from scratch replaces an earlier one in ``output_dir``: its time is not ours.
        """
        self.timers = LoopTimers()  # the trainer hands this group to paddlenlp's loop
        self.start_time = process_start_time() if start_time is None else start_time
        self.output_dir, self.overwrite_output_dir = output_dir, overwrite_output_dir
        self._state: Any = None  # paddlenlp's TrainerState of the training loop (its global_step), from on_train_begin
        self.previous = RunTime()
        self.totals = dict.fromkeys(PHASES, 0.0)  # this process
        self.steps = 0  # optimizer steps completed in this process
        self._interval = dict.fromkeys(PHASES, 0.0)
        self._interval_steps = 0
        self._interval_start: Optional[float] = None  # perf_counter at the previous record (or when training began)
        self._wait_start: Optional[float] = None  # perf_counter when the loop began to wait for a batch
        self._wait_inside_forward_backward = 0.0
        self._started_training = False
        self._redone = 0.0  # productive seconds of this process that rollbacks discarded (lost)
        # seconds in collectives while a timer of these phases ran (CPU: counted by comm_volume)
        self._communication_inside = dict.fromkeys(("forward_backward", "optimizer"), 0.0)
        COUNTER.listener = self.on_collective  # the run's one TimeBreakdown (the latest built)

    def _reset_timers(self) -> None:
        """Stop and zero every timer of the group: a training loop that raised (a NanGuard stop) leaves
        its phase's timer running, and paddlenlp asserts when a running timer is started again."""
        for timer in self.timers.timers.values():
            timer.reset()

    def restore(self, checkpoint_folder: Optional[str]) -> None:
        """Start from the history of the previous attempts (``previous_run_time``); from scratch (None) with
        ``overwrite_output_dir`` (a new run replacing an earlier one in ``output_dir``): from nothing.

        Called again once this process has trained (a rollback to ``checkpoint_folder``): the productive
        seconds of the run past that checkpoint become lost ones, and the previous attempts stay as they
        were (``output_dir``'s record holds this process's time already: read back, it would count twice)."""
        if self._started_training:
            saved = read_run_time(checkpoint_folder) or RunTime()
            self._redone += max(0.0, self.run_time(saved.global_step).productive_seconds - saved.productive_seconds)
            return
        fresh = checkpoint_folder is None and self.overwrite_output_dir
        self.previous = RunTime() if fresh else previous_run_time(checkpoint_folder, read_run_time(self.output_dir))

    def _add(self, phase: str, seconds: float) -> None:
        self.totals[phase] += seconds
        self._interval[phase] += seconds

    def _start_wait(self) -> None:
        if self._wait_start is None:
            self._wait_start = time.perf_counter()

    def _stop_wait(self) -> None:
        if self._wait_start is None:
            return
        seconds = time.perf_counter() - self._wait_start
        self._wait_start = None
        self._add("data_wait", seconds)
        timer = self.timers.timers.get("forward-backward")
        if timer is not None and timer.started_:  # a later micro-batch: paddlenlp's timer runs on
            self._wait_inside_forward_backward += seconds

    def on_collective(self, seconds: float) -> None:
        """A collective of ``seconds`` just ended (``pretrain.metrics.comm_volume``, CPU runs): within the
        forward-backward or optimizer timer, it counts as communication instead."""
        for name, phase in PADDLENLP_TIMERS.items():
            timer = self.timers.timers.get(name)
            if phase in self._communication_inside and timer is not None and timer.started_:
                self._communication_inside[phase] += seconds
                return

    def collect(self) -> None:
        """Move what paddlenlp's timers and ours hold into the totals (the timers are reset)."""
        for name, timer in self.timers.timers.items():
            if timer.started_:
                continue
            seconds = timer.elapsed(reset=True)
            phase = PADDLENLP_TIMERS.get(name) or OWN_TIMERS.get(name)
            if phase == "forward_backward":
                seconds -= self._wait_inside_forward_backward
                self._wait_inside_forward_backward = 0.0
            if phase in self._communication_inside:
                communicated, self._communication_inside[phase] = self._communication_inside[phase], 0.0
                seconds -= communicated
                self._add("communication", communicated)
            if phase is not None:
                self._add(phase, seconds)

    @contextmanager
    def timed(self, name: str):
        """Context manager: the block counts as ``OWN_TIMERS[name]`` (``evaluation``, ``checkpoint-save``);
        yields a dict whose ``seconds`` holds the block's duration once it ends. Nested blocks of one
        name count once (the outer one)."""
        timer, took = self.timers(name), {"seconds": None}
        if timer.started_:
            yield took
            return
        before = timer.elapsed_
        timer.start()
        try:
            yield took
        finally:
            timer.stop()
            took["seconds"] = timer.elapsed_ - before

    def on_train_begin(self, args, state, control, **kwargs):
        self._state = state
        self._reset_timers()
        if not self._started_training:
            self._started_training = True
            self.totals["startup"] = time.time() - self.start_time
        self._interval_start = time.perf_counter()

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._start_wait()

    def on_load_data_end(self, args, state, control, **kwargs):
        self._stop_wait()

    def on_substep_end(self, args, state, control, **kwargs):
        self._start_wait()

    def on_step_end(self, args, state, control, **kwargs):
        self.collect()
        self.steps += 1
        self._interval_steps += 1

    def step_complete(self) -> None:
        """The step's logging, evaluation and saving are done: the loop now waits for the next batch."""
        self._start_wait()

    def on_epoch_end(self, args, state, control, **kwargs):
        self._stop_wait()

    def on_train_end(self, args, state, control, **kwargs):
        self._stop_wait()

    def interval_record(self) -> dict:
        """``{"time_<phase>": seconds per optimizer step}`` over the steps since the previous record
        (every phase but startup; ``time_other`` is the rest of the interval's wall time); {} when no
        step ended since."""
        self.collect()
        now = time.perf_counter()
        steps, wall = self._interval_steps, now - (self._interval_start or now)
        record = {}
        if steps:
            phases = [phase for phase in PHASES if phase not in ("startup", "other")]
            record = {f"time_{phase}": self._interval[phase] / steps for phase in phases}
            record["time_other"] = max(0.0, wall - sum(self._interval[phase] for phase in phases)) / steps
        self._interval = dict.fromkeys(PHASES, 0.0)
        self._interval_steps, self._interval_start = 0, now
        return record

    def step_seconds(self) -> Optional[float]:
        """Mean seconds per optimizer step of this process (STEP_PHASES), None before any step."""
        return sum(self.totals[phase] for phase in STEP_PHASES) / self.steps if self.steps else None

    def run_time(self, global_step: int) -> RunTime:
        """The whole run up to now: the previous attempts plus this process."""
        self.collect()
        wall = time.time() - self.start_time
        phases = dict(self.totals)
        phases["other"] = max(0.0, wall - sum(value for phase, value in phases.items() if phase != "other"))
        before = self.previous
        return RunTime(
            attempts=before.attempts + 1,
            global_step=global_step,
            wall_seconds=before.wall_seconds + wall,
            productive_seconds=before.productive_seconds
            + sum(phases[phase] for phase in PRODUCTIVE_PHASES)
            - self._redone,
            lost_seconds=before.lost_seconds + self._redone,
            phase_seconds={phase: before.phase_seconds.get(phase, 0.0) + phases[phase] for phase in PHASES},
        )

    def write(self, folder: str) -> None:
        """Write ``folder/time_history.json`` at the training loop's step, durably (``write_record``)."""
        self.write_record(folder, self._state.global_step if self._state is not None else 0)

    def write_record(self, folder: str, global_step: int, durable: bool = True) -> None:
        """Write ``folder/time_history.json`` (``run_time``) atomically; ``durable``: flushed to disk too
        (``pretrain.atomic``). Without it (``output_dir``'s copy at each log record: an fsync costs
        milliseconds, see benchmarks/time_breakdown_overhead.py) a crashed process's copy is intact
        and a machine's crash may leave the previous one: ``previous_run_time`` takes the
        checkpoint's record where it is the later one."""
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, TIME_HISTORY_FILE)
        record = asdict(self.run_time(global_step))
        if durable:
            write_json(path, record, indent=1)
            return
        with open(partial_path(path), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
        os.replace(partial_path(path), path)


def summary_fields(run_time: RunTime) -> dict:
    """The run summary's keys: ``time_breakdown`` (phase -> seconds, summing to ``wall_seconds``),
    ``wall_seconds``, ``goodput``, ``productive_seconds``, ``lost_seconds`` and ``attempts``."""
    return {
        "time_breakdown": run_time.phase_seconds,
        "wall_seconds": run_time.wall_seconds,
        "goodput": run_time.goodput,
        "productive_seconds": run_time.productive_seconds,
        "lost_seconds": run_time.lost_seconds,
        "attempts": run_time.attempts,
    }
