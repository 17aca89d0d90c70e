"""Errors meant for users: one sentence naming what is wrong, where, and the fix."""

import sys


class UserError(Exception):
    """Bad input from the user (config file, command line, data, environment).

    Entry scripts catch it and print ``error: <message>`` on one line, exiting with status 2,
    instead of showing a traceback from deep inside paddle.
    """


def run_cli(main, *args):
    """Call ``main(*args)``; on UserError print ``error: <message>`` to stderr and exit with status 2."""
    try:
        return main(*args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
