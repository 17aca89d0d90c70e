"""Errors meant for users: one sentence naming what is wrong, where, and the fix."""

import argparse
import errno
import sys


class UserError(Exception):
    """Bad input from the user (config file, command line, data, environment).

    Entry scripts catch it and print ``error: <message>`` on one line, exiting with status 2,
    instead of showing a traceback from deep inside paddle.
    """


class RunStopped(Exception):
    """The run stopped on request before its end (a stop signal, ``max_wall_time``): not a failure.

    Entry scripts print ``stopped: <message>`` on one line (where it stopped, how to resume) and exit
    with ``exit_status`` (``pretrain.preemption``).
    """

    word = "stopped"  # the line's first word

    def __init__(self, message: str, exit_status: int):
        super().__init__(message)
        self.exit_status = exit_status


class RunDiverged(RunStopped):
    """The run reached its last step, its files all written, but its loss never recovered from a spike
    (``pretrain.recovery.SpikeWatch.unrecovered``): entry scripts print ``diverged: <message>`` and exit with
    ``exit_status``, so a scheduler does not take the run for a success."""

    word = "diverged"


def report_stop(stop: RunStopped) -> int:
    """Print ``stopped: <message>`` (``diverged: ...``) on one line to stderr; return the stop's exit status."""
    print(f"{stop.word}: {stop}", file=sys.stderr)
    return stop.exit_status


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors (an unknown flag, a missing or ill-typed value) are a
    ``UserError``, so ``run_cli`` prints them as one ``error:`` line with exit status 2 (argparse
    prints its usage text and ``prog: error: ...``)."""

    def error(self, message):
        raise UserError(f"command line: {message}; see --help")


def raise_problems(problems: list, found_by: str) -> None:
    """Raise one ``UserError`` listing ``problems`` (the line itself when there is one); return when none.

    ``found_by`` names the check in the heading of several, e.g. "preflight found 3 problems, ...".

    Raises:
        UserError: there is at least one problem.
    """
    if len(problems) == 1:
        raise UserError(problems[0])
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise UserError(f"{found_by} found {len(problems)} problems, nothing was started:\n{lines}")


# What to do about an operating-system error, by errno (the rest: its message only).
OS_ERROR_FIXES = {
    errno.ENOSPC: "the disk is full: free space there or write to another disk",
    errno.EDQUOT: "the disk quota is used up: free space there or write to another disk",
    errno.EROFS: "the file system is read-only: write to another folder",
    errno.EACCES: "permission denied: fix the permissions or choose another path",
    errno.EPERM: "operation not permitted: fix the permissions or choose another path",
    errno.ENOENT: "no such file or folder: check the path",
    errno.ENOTDIR: "a part of the path is a file, not a folder: check the path",
    errno.EISDIR: "it is a folder, not a file: check the path",
}


def os_error_message(error: OSError) -> str:
    """One line for an ``OSError``: the file (or files) it names, what happened and the fix."""
    where = " -> ".join(str(name) for name in (error.filename, error.filename2) if name is not None)
    number = error.errno or 0  # 0: no errno (no fix, no code name)
    what = OS_ERROR_FIXES.get(number) or error.strerror or str(error)
    code = f" ({errno.errorcode[number]})" if number in errno.errorcode else ""
    return f"{where}: {what}{code}" if where else f"{what}{code}"


def run_cli(main, *args):
    """Call ``main(*args)``; on UserError, or an OSError (a full or read-only disk, a missing or unreadable
    file: ``os_error_message``), print ``error: <message>`` on one line to stderr and exit with status 2;
    on RunStopped print ``stopped: <message>`` and exit with its status; on Ctrl-C (KeyboardInterrupt)
    print one line, no traceback, and exit with status 130 (128 + SIGINT).

    Writers use ``pretrain.atomic``, so an error leaves no partial output behind.
    """
    try:
        return main(*args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except OSError as error:
        print(f"error: {os_error_message(error)}", file=sys.stderr)
        sys.exit(2)
    except RunStopped as stop:
        sys.exit(report_stop(stop))
    except KeyboardInterrupt:
        print("stopped: interrupted (SIGINT)", file=sys.stderr)
        sys.exit(130)
