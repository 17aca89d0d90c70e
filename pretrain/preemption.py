"""Preemption: SIGTERM, SIGUSR1 or ``max_wall_time`` end the run at the next step boundary with a checkpoint.

A scheduler that preempts a job (Slurm, Kubernetes, PaddleCloud) sends SIGTERM and kills it a grace
period later. Here a stop request (a SIGTERM or SIGUSR1 received by any rank, or ``max_wall_time``
seconds since the handlers were installed at the start of the entry script's main) is joined into
the NaN guard's per-step all-reduce (one more element of it, ``pretrain.nan_guard``: no extra
collective), so every rank learns it at the same
optimizer step ``k``; step ``k`` finishes, ``checkpoint-<k>`` is saved and marked complete even when
``k`` is not a multiple of ``save_steps``, and every rank exits with ``EXIT_PREEMPTED`` after one
line saying where it stopped. A request that arrives while evaluating is agreed on when the
evaluation ends (one all-reduce per evaluation) and saved at that step. The same command resumes
from ``checkpoint-<k>`` as from any checkpoint: the resumed run equals an uninterrupted one.

paddle 3.3.1's launcher (``paddle/distributed/launch/controllers/controller.py``, ``job/pod.py``,
``utils/process_context.py``), on SIGTERM or SIGINT, sends SIGTERM to each worker's process group
up to 3 times 0.2 s apart, waits up to 30 s for each worker, SIGKILLs what is left and exits with the
signal's number (15, or 2). Hence: repeated SIGTERMs count as one request, and the DataLoader worker
processes (in their rank's process group, so reached by the same SIGTERM; Slurm signals every
process of a job step too) ignore it: paddle's worker handler (``_set_process_signal_handler``,
``imperative/data_loader.cc``) dies on a SIGTERM not sent by its rank, and the rank then raises at
once (``io/multiprocess_utils.py`` ``_set_SIGCHLD_handler``). ``StopSignals.worker_init`` replaces
it in each worker: the worker ignores SIGTERM and SIGUSR1 until its rank is exiting (then a SIGTERM
from Python's ``multiprocessing`` exit handler ends it, as paddle's handler would). SIGUSR1 is not
handled by the launcher (its default action ends the launcher alone), so it must be sent to the
ranks themselves.

SIGINT (Ctrl-C) stops at once without saving, with one line naming the step and the last complete
checkpoint, and status ``EXIT_INTERRUPTED``. Under the launcher a terminal's Ctrl-C reaches only
the launcher (each worker runs in a session of its own), which turns it into a SIGTERM: a
checkpoint.
"""

from __future__ import annotations

import atexit
import mmap
import os
import signal
import time
from typing import Optional

import paddle
import paddle.distributed as dist
from paddlenlp.trainer import TrainerCallback

from pretrain import checkpoint
from pretrain.cluster.process_end import end_child_processes
from pretrain.errors import RunStopped

# sysexits.h EX_TEMPFAIL, "a temporary failure ... the user is invited to retry": requeue and rerun.
EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 128 + signal.SIGINT  # the shell's status for a process ended by SIGINT
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
STOP_REQUESTED = 1  # a rank's request code in the NaN guard's verdict (the maximum over ranks is agreed)


class _Progress:
    """Where this process is, for the one-line messages: the Trainer's state and output_dir once training."""

    def __init__(self):
        self.state = None
        self.output_dir = None
        self.max_steps = None

    def describe(self) -> str:
        if self.state is None:
            return "before training started"
        return f"at step {self.state.global_step} of {self.max_steps}"

    def resume_advice(self) -> str:
        last = checkpoint.latest_complete_checkpoint(self.output_dir) if self.output_dir else None
        if last is None:
            return "no complete checkpoint was saved: the same command starts the run over"
        return f"the last complete checkpoint is {last}: the same command resumes from it"


class StopSignals:
    """This process's stop signals: the first SIGTERM/SIGUSR1 received, and SIGINT raising ``RunStopped``.

    One per process (``SIGNALS``), installed by the entry script before anything long starts.
    """

    def __init__(self):
        self.received: Optional[str] = None  # name of the first stop signal received
        self.started = time.monotonic()  # the clock of max_wall_time
        self.progress = _Progress()
        self._pid = None  # the process that installed the handlers (not its forked DataLoader workers)
        self._exiting = None  # one byte shared with the forked DataLoader workers: 1 once this process exits
        self._rank_pid = None  # in a DataLoader worker: the rank that started it

    def install(self) -> None:
        """Handle SIGTERM, SIGUSR1 (record the request) and SIGINT (stop now) in this process (main thread)."""
        self._pid = os.getpid()
        self.started = time.monotonic()
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._request)
        signal.signal(signal.SIGINT, self._interrupt)
        self._exiting = mmap.mmap(-1, 1)  # anonymous and shared: the workers forked later see this byte
        atexit.register(self.mark_exiting)  # registered after multiprocessing's exit handler: runs before it

    def mark_exiting(self) -> None:
        """From now on a SIGTERM ends this process's DataLoader workers (its exit handlers, or a stopped run)."""
        if self._exiting is not None:
            self._exiting[0] = 1

    def end_workers(self) -> None:
        """End this process's DataLoader workers before it exits early (they hold its files, the run lock
        included): from now on they take SIGTERM (``worker_init``), and ``end_child_processes`` shuts the
        loaders, then terminates and reaps every child."""
        self.mark_exiting()
        end_child_processes()

    def worker_init(self, worker_id: int) -> None:
        """A DataLoader ``worker_init_fn`` (run in each worker after paddle's signal handlers are set):
        the worker ignores SIGTERM and SIGUSR1 meant for its rank; once the rank exits, a SIGTERM ends it."""
        if self._exiting is None:  # the handlers were not installed in the rank: paddle's stay
            return
        self._rank_pid = os.getppid()
        signal.signal(signal.SIGTERM, self._worker_stop)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)

    def _worker_stop(self, signum, frame) -> None:
        if self._exiting[0] or os.getppid() != self._rank_pid:  # the rank is exiting or gone
            os._exit(0)

    def _request(self, signum, frame) -> None:
        if os.getpid() == self._pid and self.received is None:
            self.received = signal.Signals(signum).name

    def _interrupt(self, signum, frame) -> None:
        if os.getpid() != self._pid:  # a DataLoader worker: its rank stops it
            return
        raise RunStopped(
            f"interrupted (SIGINT) {self.progress.describe()}, nothing saved since; {self.progress.resume_advice()}",
            EXIT_INTERRUPTED,
        )


SIGNALS = StopSignals()


def install_stop_handlers() -> None:
    """Install this process's stop handlers (``StopSignals.install``); call it first in an entry script's main."""
    SIGNALS.install()


class Preemption(TrainerCallback):
    """Turns an agreed stop request into ``checkpoint-<step>`` and the end of training.

    The trainer asks ``local_request()`` once per optimizer step, joins it into the NaN guard's
    all-reduce and hands the agreed code to ``agreed()``; ``on_step_end`` then saves and stops.

    Args:
        max_wall_time: seconds since ``install_stop_handlers`` after which the run stops as on SIGTERM
            (None: no limit).
        world_size: processes that must agree (all-reduce after an evaluation when > 1).
        signals: the process's StopSignals.
    """

    def __init__(self, max_wall_time: Optional[float], world_size: int, signals: StopSignals = SIGNALS):
        self.max_wall_time = max_wall_time
        self.world_size = world_size
        self.signals = signals
        self.reason: Optional[str] = None  # why the ranks agreed to stop ("SIGTERM", "max_wall_time", ...)
        self.stopped_at: Optional[int] = None  # the global step of the checkpoint saved before stopping
        self._agreed_step: Optional[int] = None
        self._training = False

    def _local_reason(self) -> Optional[str]:
        if self.signals.received is not None:
            return self.signals.received
        if self.max_wall_time is not None and time.monotonic() - self.signals.started >= self.max_wall_time:
            return f"max_wall_time {self.max_wall_time:g} s"
        return None

    def local_request(self) -> int:
        """This rank's bits for the step's verdict: STOP_REQUESTED when it wants to stop."""
        return STOP_REQUESTED if self._local_reason() is not None else 0

    def agreed(self, code: int, step: int) -> None:
        """Take the request code agreed at optimizer step ``step`` (1-based): STOP_REQUESTED stops after it."""
        if code >= STOP_REQUESTED and self._agreed_step is None:
            self._agreed_step = step
            self.reason = self._local_reason() or "a stop request of another rank"

    def on_train_begin(self, args, state, control, **kwargs):
        self._training = True
        self.signals.progress.state = state
        self.signals.progress.output_dir = args.output_dir
        self.signals.progress.max_steps = state.max_steps

    def on_train_end(self, args, state, control, **kwargs):
        self._training = False

    def on_step_end(self, args, state, control, **kwargs):
        if self._agreed_step == state.global_step and state.global_step < state.max_steps:
            self._stop(state, control)

    def on_evaluate(self, args, state, control, **kwargs):
        # Only the ranks' agreement after an evaluation during training (every rank evaluates):
        # the checkpoint of this step follows in paddlenlp's _maybe_log_save_evaluate.
        if not self._training or self.stopped_at is not None or state.global_step >= state.max_steps:
            return
        code = paddle.to_tensor([self.local_request()], dtype="int32")
        if self.world_size > 1:
            dist.all_reduce(code, op=dist.ReduceOp.MAX)
        self.agreed(int(code.item()), state.global_step)
        if self._agreed_step is not None:
            self._stop(state, control)

    def _stop(self, state, control) -> None:
        control.should_save = True
        control.should_training_stop = True
        self.stopped_at = state.global_step

    def raise_if_stopped(self, output_dir: str) -> None:
        """After training (call it on every rank): when training stopped on request, meet the other ranks
        at a barrier and raise RunStopped (``EXIT_PREEMPTED``) saying where it stopped, what it saved (nothing
        when the NaN guard held the weights unconfirmed: ``NanGuard.may_save``) and how to resume."""
        if self.stopped_at is None:
            return
        if self.world_size > 1:
            dist.barrier()  # leave together, as a finished run does (pretrain.cluster.launched.run_launched)
        self.signals.end_workers()
        folder = os.path.join(output_dir, f"checkpoint-{self.stopped_at}")
        if checkpoint.checkpoint_problem(folder, verify_checksums=False) is None:
            saved = f"saved {folder}; the same command resumes from it"
        else:  # the NaN guard held that step's weights unconfirmed (a skipped update; said above)
            saved = f"saved nothing (its weights were not confirmed); {self.signals.progress.resume_advice()}"
        raise RunStopped(
            f"{self.reason}: stopped at step {self.stopped_at} of {self.signals.progress.max_steps} "
            f"and {saved} (exit status {EXIT_PREEMPTED}: requeue)",
            EXIT_PREEMPTED,
        )
