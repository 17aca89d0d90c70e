"""One run per ``output_dir``: an exclusive lock held for the run's life.

Each node's local rank 0 takes an ``flock`` on ``output_dir/.run.lock.node<n>`` (one file per node,
so the nodes of one run sharing a folder do not refuse each other) and writes its pid and host
into it; the verdict is agreed by every rank (``pretrain.cluster.agreement``) so that every rank of a refused
run stops, in one line naming the rank and the holder. The kernel drops the lock when the process
ends in any way (kill -9 included), so a lock file left on disk never blocks a restart.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from contextlib import contextmanager, nullcontext
from typing import Callable, Optional

import paddle.distributed as dist

from pretrain import checkpoint
from pretrain.cluster.agreement import agree_on
from pretrain.errors import UserError
from pretrain.log import logger

LOCK_NAME = ".run.lock.node{node}"
DEFAULT_AGREE_SECONDS = 600.0  # the default of hang_timeout (pretrain.arguments)


def node_index() -> int:
    """This process's machine among the launched nodes (0 without a launcher)."""
    env = dist.ParallelEnv()
    local_size = int(os.environ.get("PADDLE_LOCAL_SIZE", "1") or 1)
    return (env.rank - int(os.environ.get("PADDLE_RANK_IN_NODE", "0") or 0)) // local_size


def _take(path: str):
    """Open and lock ``path``; return (file, None) on success, (None, what the holder wrote) when it is held.

    Raises:
        UserError: the folder or the lock file cannot be created.
    """
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        lock_file = open(path, "a+", encoding="utf-8")
    except OSError as e:
        raise UserError(f"output_dir: cannot create {path} ({e.strerror}); choose a writable output_dir") from None
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.seek(0)
        holder = lock_file.read().strip() or "a process that wrote nothing"
        lock_file.close()
        return None, holder
    except OSError as e:  # a filesystem without locks: run, unprotected
        logger.warning("output_dir: cannot lock %s (%s); concurrent runs on it are not detected", path, e.strerror)
        return lock_file, None
    lock_file.truncate(0)
    lock_file.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    lock_file.flush()
    return lock_file, None


@contextmanager
def output_dir_lock(
    output_dir: str,
    local_zero: bool,
    timeout_s: float = DEFAULT_AGREE_SECONDS,
    on_taken: Optional[Callable[[str], None]] = None,
):
    """Hold ``output_dir`` for the run inside the ``with`` block (a collective call under a launcher).

    Args:
        local_zero: this process is its node's local rank 0 (it takes the node's lock).
        timeout_s: seconds the ranks wait for each other's verdict (``pretrain.cluster.agreement``).
        on_taken: called with ``output_dir`` by each process that took a lock, before the ranks agree
            (so every rank waits for it): tidying what a killed run left.

    Raises:
        UserError: on every rank, when another run holds the lock on some node (the message names the
            rank, its pid and host) or a node cannot create its lock file.
    """

    def take():
        if not local_zero:
            return None
        lock_file, holder = _take(os.path.join(output_dir, LOCK_NAME.format(node=node_index())))
        if holder is not None:
            raise UserError(
                f"output_dir: {os.path.abspath(output_dir)} is in use by another run ({holder}); wait for it "
                "to finish, or give this run another output_dir"
            )
        if on_taken is not None:
            try:
                on_taken(output_dir)
            except BaseException:
                lock_file.close()
                raise
        return lock_file

    lock_file = agree_on("output_dir lock", take, timeout_s)
    try:
        yield
    finally:
        if lock_file is not None:
            lock_file.close()


@contextmanager
def guarded_run(training_args):
    """What an entry script (run_pretrain.py, run_finetune.py) holds while it runs: ``output_dir_lock``
    (none for a dry run; on taking it, ``checkpoint.tidy_output_dir``), with a full disk (ENOSPC, EDQUOT)
    inside the block turned into one line.

    Raises:
        UserError: another run holds output_dir, or the disk filled up (every file is written
            atomically and checkpoints are marked complete last: the same command resumes once
            there is room).
    """
    args = training_args
    lock = (
        nullcontext()
        if args.dry_run
        else output_dir_lock(
            args.output_dir, args.local_process_index == 0, args.hang_timeout, checkpoint.tidy_output_dir
        )
    )
    try:
        with lock:
            yield
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise UserError(
            f"{e.filename or args.output_dir}: the disk is full ({e.strerror}); free space and run the "
            "same command again: it resumes from the last complete checkpoint"
        ) from e
