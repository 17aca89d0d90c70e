"""Errors meant for users: one sentence naming what is wrong, where, and the fix."""

import logging
import os
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

    def __init__(self, message: str, exit_status: int):
        super().__init__(message)
        self.exit_status = exit_status


def _report_stop(stop: RunStopped) -> int:
    print(f"stopped: {stop}", file=sys.stderr)
    return stop.exit_status


def run_cli(main, *args):
    """Call ``main(*args)``; on UserError print ``error: <message>`` to stderr and exit with status 2; on
    RunStopped print ``stopped: <message>`` and exit with its status; on Ctrl-C (KeyboardInterrupt)
    print one line, no traceback, and exit with status 130 (128 + SIGINT)."""
    try:
        return main(*args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except RunStopped as stop:
        sys.exit(_report_stop(stop))
    except KeyboardInterrupt:
        print("stopped: interrupted (SIGINT)", file=sys.stderr)
        sys.exit(130)


def run_launched(main, *args) -> None:
    """``run_cli`` for an entry script that ``paddle.distributed.launch`` may start on several ranks.

    After ``main`` has returned, or stopped on request (RunStopped), its ranks having left together
    through a barrier with every file written and closed, a launched process with more than one rank
    (``PADDLE_TRAINERS_NUM``) ends at once with status 0 (or the RunStopped status), skipping
    interpreter teardown: the C++ destructors of paddle's gloo context and TCP store occasionally
    abort a process that has finished (SIGABRT, the launcher's "Exit code -6"), and the launcher
    then reports the whole job failed. Log handlers and the output streams are flushed first. A
    single process exits as usual.
    """
    status = 0

    def main_stopping(*main_args):
        nonlocal status
        try:
            return main(*main_args)
        except RunStopped as stop:
            status = _report_stop(stop)

    run_cli(main_stopping, *args)
    if int(os.environ.get("PADDLE_TRAINERS_NUM", "1") or 1) > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    if status:
        sys.exit(status)
