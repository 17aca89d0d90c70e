"""Errors meant for users: one sentence naming what is wrong, where, and the fix."""

import logging
import os
import sys


class UserError(Exception):
    """Bad input from the user (config file, command line, data, environment).

    Entry scripts catch it and print ``error: <message>`` on one line, exiting with status 2,
    instead of showing a traceback from deep inside paddle.
    """


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


def run_cli(main, *args):
    """Call ``main(*args)``; on UserError print ``error: <message>`` to stderr and exit with status 2."""
    try:
        return main(*args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def run_launched(main, *args) -> None:
    """``run_cli`` for an entry script that ``paddle.distributed.launch`` may start on several ranks.

    After ``main`` has returned (its ranks left together through a barrier, every file written and
    closed), a launched process with more than one rank (``PADDLE_TRAINERS_NUM``) ends at once with
    status 0, skipping interpreter teardown: the C++ destructors of paddle's gloo context and TCP
    store occasionally abort a process that has finished (SIGABRT, the launcher's "Exit code -6"),
    and the launcher then reports the whole job failed. Log handlers and the output streams are
    flushed first. A single process exits as usual.
    """
    run_cli(main, *args)
    if int(os.environ.get("PADDLE_TRAINERS_NUM", "1") or 1) > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
