"""Bounded time for a stuck or lost rank, with a diagnosis; the slow rank named.

paddle lends no watchdog for this on every backend: its launcher watches only the processes of its
own node (the default HTTP master never tells the others that a node failed), gloo and NCCL wait in
a collective for ``PADDLE_PG_TIMEOUT`` (30 min, NCCL only) or longer, and a stopped process
(kill -STOP) fails no collective at all. So each rank of a launched run keeps:

- its progress: the optimizer step it works on (global step + 1) and the phase it is in, one of
  ``PHASES`` (set by ``pretrain.trainer`` at each phase boundary: a few attribute writes a step);
- a heartbeat thread that publishes that progress every ``beat_s`` seconds in the launcher's TCP
  store (served by global rank 0; a client of its own, ``hb/<rank>/*`` keys, two ``add`` calls a beat);
- a watch thread: when the current phase has lasted ``hang_timeout`` seconds, it prints a report
  (this rank, its step and phase; every other rank's last heartbeat: step, phase and age, those
  silent for more than ``STALE_BEATS`` beats named as stopped or gone), kills this process's
  children and ends it with ``HANG_EXIT_STATUS``; the launcher then stops its node's other ranks,
  and the other nodes' ranks, stuck in the same collective, end the same way at about the same time.

A rank whose process raised gets the same report from ``failure_report``
(``pretrain.cluster.launched.run_launched`` prints it), once the heartbeats have had time to show which ranks
went silent. Heartbeat ages compare the ranks' wall clocks: nodes must be in time sync (NTP: well
below a beat).

What no thread of the rank can do, a sidecar does: a small process of its own per rank (``python -m
pretrain.cluster.watchdog``, the standard library only) that reads the rank's step and phase from a shared
memory page (``PROGRESS``, written at each phase boundary). When the rank ends without finishing
(kill -9, the OOM killer, the launcher's SIGKILL of the survivors once a rank failed; gloo aborts a rank,
SIGABRT, when a peer's connection drops mid-collective) it prints ``error: rank R (...) ended without
finishing at step S, phase P`` and kills what is left of the rank's process group: its DataLoader workers
(adopted by init, blocked on their pipes, not ending on SIGTERM) and the sidecar itself; the group id
stays the rank's while one of them lives (Linux reuses no process group id in use), so no other process
is hit. When the rank is stopped (kill -STOP: its threads stop with it) and its phase outlasts
``hang_timeout`` plus ``SIDECAR_GRACE_S``, it prints the same kind of line and kills the rank's process
group (the rank and its DataLoader workers), so that its launcher ends the node even when no other rank
of the node is left to fail.

Slow rank: ``RankWork`` counts each rank's own time per step, data wait plus forward (host time:
backward also waits for the gradient all-reduce of the slowest rank under data parallelism, so it
would hide the culprit); ``slow_rank_message`` names the slowest rank at a log record when it lags
the median rank by more than ``slow_rank_threshold``.
"""

from __future__ import annotations

import mmap
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Optional

from pretrain.cluster.process_end import kill_child_processes
from pretrain.cluster.ranks import launched_world
from pretrain.log import logger

PHASES = ("starting", "data", "forward/backward", "collective", "optimizer", "save", "evaluate", "done")
WATCHED = frozenset({"data", "forward/backward", "collective", "optimizer", "save", "evaluate"})
HANG_EXIT_STATUS = 124  # the status timeout(1) uses: the launcher reports it as the rank's exit code
STALE_BEATS = 3  # a rank silent for this many beats (plus a second) is stopped or gone
SLOW_RANK_MIN_SECONDS = 0.005  # lags below this (s/step) are noise, never reported
PROGRESS = struct.Struct("<qid")  # the shared page: step, phase index, unix time the phase began
SIDECAR_GRACE_S = 10.0  # the sidecar acts this long after hang_timeout: the rank's own report comes first
SIDECAR_POLL_S = 0.5


def beat_seconds(timeout_s: float) -> float:
    """Seconds between two heartbeats: a tenth of the timeout, between 0.5 and 5."""
    return min(5.0, max(0.5, timeout_s / 10))


def _store_endpoint() -> Optional[tuple]:
    """(host, port) of the launcher's TCP store, as paddle.distributed.init_parallel_env finds it."""
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    endpoint = os.environ.get("PADDLE_MASTER") or (os.environ.get("PADDLE_TRAINER_ENDPOINTS") or "").split(",")[0]
    if not endpoint or ":" not in endpoint:
        return None
    host, port = endpoint.rsplit(":", 1)
    return host, int(port)


class Watchdog:
    """This rank's progress, its heartbeat in the launcher's store and the watch over its phases.

    Use: ``dog = Watchdog(hang_timeout, rank, world, node).start()``; ``dog.enter(phase, step)`` at each
    phase boundary; ``dog.stop()`` when the run is over (every rank). Only ``WATCHED`` phases are timed.
    """

    def __init__(self, timeout_s: float, rank: int, world: int, node: int):
        self.timeout_s, self.rank, self.world, self.node = timeout_s, rank, world, node
        self.host = socket.gethostname()
        self.beat_s = beat_seconds(timeout_s)
        self.step, self.phase, self.since = 0, "starting", time.monotonic()
        self.work = RankWork()
        self._stopped = threading.Event()
        self._snapshot_wanted = threading.Event()
        self._snapshot: Optional[tuple] = None  # (monotonic time read, {rank: (unix time, step, phase, node, host)})
        self._store: Any = None  # paddle TCPStore client of the heartbeat thread
        self._published = {"t": 0, "progress": 0}
        self._page: Optional[mmap.mmap] = None  # the shared page the sidecar reads

    def _start_sidecar(self) -> None:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        fd, path = tempfile.mkstemp(prefix=f"pretrain-progress-rank{self.rank}-", dir=folder)
        os.ftruncate(fd, PROGRESS.size)
        self._page = mmap.mmap(fd, PROGRESS.size)
        os.close(fd)
        self._write_page()
        subprocess.Popen(
            [sys.executable, "-m", "pretrain.cluster.watchdog", path, str(os.getpid()), str(self.timeout_s)]
            + [str(self.rank), str(self.node), self.host],
            stdin=subprocess.DEVNULL,
        )

    def _write_page(self) -> None:
        if self._page is not None:
            self._page[:] = PROGRESS.pack(
                self.step, PHASES.index(self.phase), time.time() - (time.monotonic() - self.since)
            )

    def start(self) -> "Watchdog":
        """Start the heartbeat and watch threads (daemons); return self."""
        global _ACTIVE
        _ACTIVE = self
        self._start_sidecar()
        threading.Thread(target=self._heartbeat, name="pretrain-heartbeat", daemon=True).start()
        threading.Thread(target=self._watch, name="pretrain-watchdog", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop watching (the run is over); the heartbeat says "done"."""
        self.enter("done")
        self._stopped.set()

    def enter(self, phase: str, step: Optional[int] = None) -> None:
        """This rank now works in ``phase`` (one of ``PHASES``), on optimizer step ``step`` (unchanged if None)."""
        now = time.monotonic()
        self.work.add(self.phase, now - self.since)
        if step is not None:
            self.step = step
        self.phase, self.since = phase, now
        self._write_page()

    def forward_done(self) -> None:
        """The forward pass of the current micro batch has returned (its host time counts as own work)."""
        if self.phase == "forward/backward":
            self.work.forward_s += time.monotonic() - self.since

    # -- heartbeat thread: the only user of the store client (a stopped store host blocks it, not the watch)
    def _heartbeat(self) -> None:
        try:
            from paddle.base import core

            endpoint = _store_endpoint()
            if endpoint is None:
                raise RuntimeError("the launcher named no store (MASTER_ADDR/MASTER_PORT or PADDLE_MASTER)")
            host, port = endpoint
            self._store = core.TCPStore(host, port, False, self.world, int(max(60, self.timeout_s)))
            self._store.set(f"hb/{self.rank}/host", f"{self.node} {self.host}".encode())
            self._store.add(f"hb/{self.rank}/host_set", 1)
        except Exception as e:  # noqa: BLE001 -- no store, no peer report; the watch still runs
            print(f"warning: rank {self.rank}: no heartbeat in the launcher's store ({e})", file=sys.stderr)
            return
        while True:
            try:
                self._publish()
                if self._snapshot_wanted.is_set():
                    self._snapshot = (time.monotonic(), self._read_peers())
                    self._snapshot_wanted.clear()
            except Exception:  # noqa: BLE001 -- the store host is gone: nothing more to publish or read
                return
            if self._stopped.wait(self.beat_s) and self.phase == "done":
                self._publish()
                return

    def _publish(self) -> None:
        values = {"t": int(time.time()), "progress": self.step * len(PHASES) + PHASES.index(self.phase)}
        for key, value in values.items():
            self._store.add(f"hb/{self.rank}/{key}", value - self._published[key])
            self._published[key] = value

    def _read_peers(self) -> dict:
        peers = {}
        for rank in range(self.world):
            t = self._store.add(f"hb/{rank}/t", 0)
            progress = self._store.add(f"hb/{rank}/progress", 0)
            where = ("?", "?")
            if self._store.add(f"hb/{rank}/host_set", 0) > 0:
                where = tuple(self._store.get(f"hb/{rank}/host").decode().split(" ", 1))
            peers[rank] = (t, progress // len(PHASES), PHASES[progress % len(PHASES)], *where)
        return peers

    # -- watch thread
    def _watch(self) -> None:
        while not self._stopped.wait(min(1.0, self.beat_s)):
            stuck_s = time.monotonic() - self.since
            if self.phase in WATCHED and stuck_s > self.timeout_s:
                header = (
                    f"error: rank {self.rank} (node {self.node}, host {self.host}) made no progress for "
                    f"{stuck_s:.0f} s at step {self.step}, phase {self.phase} (hang_timeout {self.timeout_s:g} s); "
                    f"ending the job (exit status {HANG_EXIT_STATUS})"
                )
                print("\n".join([header, *self.peer_lines()]), file=sys.stderr, flush=True)
                kill_child_processes()
                os._exit(HANG_EXIT_STATUS)

    def name_slow_rank(self, all_gather_object, threshold: float, warn: bool) -> None:
        """Gather every rank's own seconds per step since the last call (``all_gather_object``: paddle's
        ``dist.all_gather_object``, a collective every rank calls) and, where ``warn``, log
        ``slow_rank_message``'s warning when the slowest lags the median by more than ``threshold`` (a fraction)."""
        gathered: list = []
        all_gather_object(gathered, (self.work.take(), self.node, self.host))
        message = slow_rank_message(
            [seconds for seconds, _, _ in gathered], threshold, [(node, host) for _, node, host in gathered]
        )
        if message is not None and warn:
            logger.warning(message)

    def peer_lines(self) -> list:
        """One line per other rank from its last heartbeat (bounded: 2 beats to get an answer from the store)."""
        self._snapshot, wanted_at = None, time.monotonic()
        self._snapshot_wanted.set()
        while self._snapshot is None and time.monotonic() - wanted_at < 2 * self.beat_s + 1:
            time.sleep(0.05)
        if self._snapshot is None:
            return [
                "  the launcher's store (served by rank 0) does not answer: rank 0 is stopped or gone, "
                "or its node is unreachable"
            ]
        lines, now = [], time.time()
        for rank, (t, step, phase, node, host) in sorted(self._snapshot[1].items()):
            if rank == self.rank:
                continue
            where = f"rank {rank} (node {node}, host {host})"
            if t == 0:
                lines.append(f"  {where}: never sent a heartbeat (it did not reach training)")
                continue
            age = now - t
            state = "stopped or gone" if age > STALE_BEATS * self.beat_s + 1 and phase != "done" else "alive"
            lines.append(f"  {where}: {state}, last heard {age:.0f} s ago at step {step}, phase {phase}")
        return lines


class RankWork:
    """Seconds of this rank's own work (data wait + forward host time) and optimizer steps, since the last take."""

    def __init__(self):
        self.data_s = self.forward_s = 0.0
        self.steps = 0

    def add(self, phase: str, seconds: float) -> None:
        if phase == "data":
            self.data_s += seconds
        elif phase == "optimizer":
            self.steps += 1

    def take(self) -> Optional[float]:
        """Own seconds per step since the last take (None without a step), and start over."""
        value = (self.data_s + self.forward_s) / self.steps if self.steps else None
        self.data_s = self.forward_s = 0.0
        self.steps = 0
        return value


def slow_rank_message(per_rank: list, threshold: float, where: list) -> Optional[str]:
    """A warning naming the slowest rank, or None when it lags the median by at most ``threshold``.

    Args:
        per_rank: own seconds per step of each rank, by global rank (None: no step in the interval).
        threshold: the lag, as a fraction of the median, above which the slowest rank is named.
        where: ``(node, host)`` of each rank.
    """
    known = [(seconds, rank) for rank, seconds in enumerate(per_rank) if seconds is not None]
    if len(known) < 2:
        return None
    median = statistics.median(seconds for seconds, _ in known)
    slowest, rank = max(known)
    lag = slowest - median
    if lag <= threshold * median or lag < SLOW_RANK_MIN_SECONDS:
        return None
    node, host = where[rank]
    return (
        f"slow rank: rank {rank} (node {node}, host {host}) needs {slowest:.3f} s per step of its own work "
        f"(data + forward), {lag:.3f} s ({lag / median:.0%}) more than the median rank; the others wait for it"
    )


def _sidecar(path: str, parent: int, timeout_s: float, rank: str, node: str, host: str) -> None:
    """The sidecar's loop (see the module docstring): watch ``parent`` through the page at ``path``."""
    # SIGTERM from the rank (ending its children) ends the sidecar; from anyone else (the launcher passing
    # on a preemption to the rank's process group) it is ignored: the rank saves a checkpoint, still watched
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    with open(path, "r+b") as f:
        page = mmap.mmap(f.fileno(), PROGRESS.size)
    os.unlink(path)
    where = f"rank {rank} (node {node}, host {host})"
    own_group = os.getpgid(0) == parent  # a launched rank leads its own group: its DataLoader workers are in it
    while True:
        term = signal.sigtimedwait({signal.SIGTERM}, SIDECAR_POLL_S)
        if term is not None and term.si_pid == parent:
            return
        step, phase_index, since = PROGRESS.unpack(page[:])
        phase = PHASES[phase_index]
        if phase == "done":
            return
        if os.getppid() != parent:
            print(f"error: {where} ended without finishing at step {step}, phase {phase}", file=sys.stderr, flush=True)
            if own_group:  # its orphaned DataLoader workers would wait on their pipes for ever; this process goes too
                os.killpg(parent, signal.SIGKILL)
            return
        stuck_s = time.time() - since
        if phase in WATCHED and stuck_s > timeout_s + SIDECAR_GRACE_S:
            print(
                f"error: {where} made no progress for {stuck_s:.0f} s at step {step}, phase {phase} and did not "
                f"end itself (stopped?); killing it (hang_timeout {timeout_s:g} s)",
                file=sys.stderr,
                flush=True,
            )
            if own_group:
                os.killpg(parent, signal.SIGKILL)
            os.kill(parent, signal.SIGKILL)
            return


_ACTIVE: Optional[Watchdog] = None


def start_watchdog(timeout_s: float) -> Optional[Watchdog]:
    """This rank's started Watchdog under a launcher of more than one rank; None for a single process."""
    rank, world, node = launched_world()
    return Watchdog(timeout_s, rank, world, node).start() if world > 1 else None


def failure_report(error: BaseException) -> list:
    """Lines naming where this rank failed (step, phase) and what the other ranks' heartbeats say, for a
    rank ending on an exception while its watchdog runs ([] otherwise). Waits for the heartbeats of
    ranks that died with the error to go stale (about ``STALE_BEATS`` beats)."""
    dog = _ACTIVE
    if dog is None or dog._stopped.is_set():
        return []
    step, phase = dog.step, dog.phase
    time.sleep(STALE_BEATS * dog.beat_s + 1)
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    header = (
        f"error: rank {dog.rank} (node {dog.node}, host {dog.host}) failed at step {step}, phase {phase}: "
        f"{type(error).__name__}: {first_line[:300]}"
    )
    return [header, *dog.peer_lines()]


if __name__ == "__main__":
    _sidecar(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), *sys.argv[4:7])
