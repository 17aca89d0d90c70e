"""How an entry script that ``paddle.distributed.launch`` may start on several ranks ends: together,
with its status, and with no process of the run left behind."""

import logging
import os
import sys
import traceback

from pretrain.cluster.process_end import end_child_processes
from pretrain.cluster.watchdog import failure_report
from pretrain.errors import RunStopped, report_stop, run_cli


def run_launched(main, *args) -> None:
    """``run_cli`` for an entry script that ``paddle.distributed.launch`` may start on several ranks.

    With more than one rank (``PADDLE_TRAINERS_NUM``), however ``main`` ends (returned: its ranks left
    together through a barrier, every file written and closed; stopped on request, ``RunStopped``: its
    status; ``UserError``: status 2; another exception: its traceback and, while the watchdog runs,
    where this rank failed and what the other ranks' heartbeats say,
    ``pretrain.cluster.watchdog.failure_report``; status 1), the process ends at once through
    ``os._exit``, skipping interpreter teardown: the C++ destructors of paddle's gloo context and TCP
    store occasionally abort a process that has finished (SIGABRT, the launcher's "Exit code -6"),
    and the launcher then reports the whole job failed. Before that, log handlers and the output
    streams are flushed and every child process (paddle's DataLoader workers) is shut and reaped
    (``pretrain.cluster.process_end.end_child_processes``), so no process of the run outlives it. A
    single process exits as usual.
    """
    status = 0

    def main_stopping(*main_args):
        nonlocal status
        try:
            return main(*main_args)
        except RunStopped as stop:
            status = report_stop(stop)

    if int(os.environ.get("PADDLE_TRAINERS_NUM", "1") or 1) <= 1:
        run_cli(main_stopping, *args)
        if status:
            sys.exit(status)
        return
    try:
        run_cli(main_stopping, *args)
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else int(e.code is not None)
        if e.code is not None and not isinstance(e.code, int):  # sys.exit("message"), as Python would print it
            print(e.code, file=sys.stderr)
    except BaseException as e:  # noqa: BLE001 -- reported here, since os._exit below skips the default report
        status = 1
        traceback.print_exc()
        print("\n".join(failure_report(e)), file=sys.stderr)
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        end_child_processes()
        os._exit(status)
