"""How a rank's process ends without leaving a process of the run behind.

A multi-rank launch ends its ranks with ``os._exit`` (``pretrain.cluster.launched.run_launched``: paddle's gloo
and TCP-store destructors occasionally abort a finished process), and the watchdog ends a stuck one
the same way (``pretrain.cluster.watchdog``). ``os._exit`` skips the destructors that shut paddle's
DataLoader workers (one process per ``dataloader_num_workers`` per live iterator, holding the data
mmaps): they would be left blocked, adopted by init. ``end_child_processes`` shuts them first, the
way paddle does (``_DataLoaderIterMultiProcess._try_shutdown_all``: the workers read a stop mark
and exit), then ends and reaps whatever child process is still there.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time

WORKER_JOIN_SECONDS = 5.0  # for each live DataLoader iterator's workers to exit after paddle's stop mark
TERM_SECONDS = 3.0  # for a remaining child to exit on SIGTERM before it is killed


def _children_by_parent() -> dict:
    """``{parent pid: [child pids]}`` of every process (read from /proc), zombies included."""
    children: dict = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # not a process, or gone meanwhile
            continue
        children.setdefault(parent, []).append(int(entry))
    return children


def child_pids() -> list:
    """Pids of this process's direct children (read from /proc), zombies included."""
    return _children_by_parent().get(os.getpid(), [])


def descendants(pid: int) -> list:
    """Every process started by ``pid``, directly or not (read from /proc), zombies included."""
    children, found, todo = _children_by_parent(), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_process_tree(pid: int) -> None:
    """SIGKILL ``pid`` and everything it started, like a machine losing power: the process group of
    ``pid`` and those of its descendants, ``pid``'s own first. ``paddle.distributed.launch`` starts each
    rank in a session of its own (``ProcessContext._start``: ``os.setsid``), and each rank's group holds
    its DataLoader workers and watchdog sidecar, so none of them is left, even when adopted by init
    meanwhile. The caller's own process group is spared (start ``pid`` in a session of its own); the
    caller reaps ``pid`` if it is its child."""
    groups, own = [], os.getpgid(0)
    for each in (pid, *descendants(pid)):
        try:
            group = os.getpgid(each)
        except ProcessLookupError:  # it had just ended
            continue
        if group not in groups and group != own:  # never the caller's own group
            groups.append(group)
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _shut_data_loaders() -> None:
    """paddle's own shutdown of every live multi-process DataLoader iterator of this process."""
    loaders = sys.modules.get("paddle.io.dataloader.dataloader_iter")
    if loaders is None:  # never imported: no loader (and no paddle import, with its warnings, at exit)
        return
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads __class__, which deprecated proxies (torch's reduce_op) warn on
        if issubclass(type(obj), loaders._DataLoaderIterMultiProcess) and not getattr(obj, "_shutdown", True):
            obj._try_shutdown_all(WORKER_JOIN_SECONDS)


def _reap(pids: list, deadline: float) -> list:
    """Wait for ``pids`` until ``deadline`` (monotonic); return those still running."""
    running = list(pids)
    while running and time.monotonic() < deadline:
        for pid in list(running):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] != 0:
                    running.remove(pid)
            except ChildProcessError:  # reaped elsewhere (multiprocessing) or not ours
                running.remove(pid)
        if running:
            time.sleep(0.05)
    return running


def end_child_processes() -> None:
    """Shut this process's DataLoader workers, then SIGTERM (after ``TERM_SECONDS``, SIGKILL) and reap every
    other child process, so that none outlives it. Call it right before ``os._exit``; bounded by
    ``WORKER_JOIN_SECONDS`` per live loader plus ``2 * TERM_SECONDS``."""
    # paddle's SIGCHLD handler raises in the main thread when a worker exits by a signal: not wanted now
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _shut_data_loaders()
    children = child_pids()
    for pid in children:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for pid in _reap(children, time.monotonic() + TERM_SECONDS):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _reap(children, time.monotonic() + TERM_SECONDS)


def kill_child_processes() -> None:
    """SIGKILL this process's children and reap them: for a rank ending stuck (``pretrain.cluster.watchdog``), where
    paddle's polite loader shutdown could wait on the stuck thread. Callable from any thread."""
    for pid in child_pids():
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
