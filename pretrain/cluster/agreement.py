"""Verdicts agreed by every rank of a launch, in bounded time: a problem one node sees stops every node.

paddle's launcher does not tell the other nodes that a node failed (its default HTTP master only
exchanges addresses at start, ``paddle/distributed/launch/controllers/master.py``): a node that
stops on its own one-line error leaves the others to wait in their next collective (gloo: until a
``TIMEOUT`` traceback; NCCL: for ever). ``agree_on(name, check)`` runs ``check`` on every rank and
exchanges the outcomes through the launcher's TCP store (the one ``init_parallel_env`` created,
served by global rank 0): each rank writes its verdict under ``agree/<name>/<rank>`` and polls for
the others' with non-blocking counters (``TCPStore.get`` of a missing key would block), so a rank
that never answers (crashed, stopped) is named after ``timeout_s`` instead of hanging the others.
If any rank failed, every rank raises the same ``UserError`` naming each failed rank, its node and
host, and why; global rank 0 waits (bounded) until every rank has read the verdicts before it
raises, since its exit takes the store down.
"""

from __future__ import annotations

import json
import socket
import time
import traceback
from typing import Callable, Optional, TypeVar, cast

from pretrain.cluster.ranks import describe_rank, launched_world
from pretrain.errors import UserError

T = TypeVar("T")
POLL_SECONDS = 0.05  # between two looks at the store while waiting for the other ranks


def _store():
    """The launcher's TCP store of this process (created by paddle.distributed.init_parallel_env)."""
    from paddle.base import core

    return core.create_or_get_global_tcp_store()


def _exchange(store, name: str, rank: int, world: int, verdict: dict, timeout_s: float) -> dict:
    """Publish this rank's ``verdict`` under ``name``; return ``{rank: verdict}`` of the ranks heard within
    ``timeout_s`` seconds (a rank not heard from is absent). Store errors (rank 0, which serves the
    store, is gone) end the wait with what was heard."""
    store.set(f"agree/{name}/{rank}", json.dumps(verdict).encode())
    store.add(f"agree/{name}/posted/{rank}", 1)
    heard, deadline = {rank: verdict}, time.monotonic() + timeout_s
    try:
        while len(heard) < world and time.monotonic() < deadline:
            for other in range(world):
                if other not in heard and store.add(f"agree/{name}/posted/{other}", 0) > 0:
                    heard[other] = json.loads(store.get(f"agree/{name}/{other}").decode())
            if len(heard) < world:
                time.sleep(POLL_SECONDS)
        store.add(f"agree/{name}/read", 1)
        if rank == 0:  # serving the store: stay until every rank heard has read, or the deadline
            while store.add(f"agree/{name}/read", 0) < len(heard) and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)
    except (ValueError, RuntimeError, OSError) as e:  # paddle raises ValueError on a broken store connection
        heard.setdefault(0, {"error": f"gone: the launcher's store it serves does not answer ({e})".splitlines()[0]})
    return heard


def _verdict_message(name: str, verdicts: dict, world: int, timeout_s: float) -> Optional[str]:
    """One message naming every failed rank (ranks with the same problem grouped), or None when all passed."""
    by_problem: dict[str, list] = {}  # problem -> the ranks that have it, as describe_rank names them
    for rank in range(world):
        verdict = verdicts.get(rank)
        if verdict is None:
            problem = f"gave no {name} verdict within {timeout_s:g} s (it crashed or hangs: see its log)"
            where = f"rank {rank}"
        elif verdict.get("error"):
            problem, where = verdict["error"], describe_rank(rank, verdict.get("node", "?"), verdict.get("host", "?"))
        else:
            continue
        by_problem.setdefault(problem, []).append(where)
    if not by_problem:
        return None
    if len(by_problem) == 1:
        ((problem, ranks),) = by_problem.items()
        return f"{', '.join(ranks)}: {problem}"
    lines = "\n".join(f"  - {', '.join(ranks)}: {problem}" for problem, ranks in by_problem.items())
    failed = sum(len(ranks) for ranks in by_problem.values())
    return f"{name} failed on {failed} ranks, every rank stops:\n{lines}"


def agree_on(name: str, check: Callable[[], T], timeout_s: float) -> T:
    """Run ``check()`` on every rank of a launch and stop every rank if it failed on any.

    Alone (no launcher, or one rank) this is ``check()``. Under a launcher every rank must call it
    with the same ``name`` (unique within the run, e.g. ``"preflight"``).

    Args:
        name: what is agreed on, used in the store keys and in the message.
        check: raises ``UserError`` (or any exception) when this rank cannot go on.
        timeout_s: seconds to wait for the other ranks' verdicts; a rank not heard from by then is
            named as having given none.

    Returns:
        What ``check()`` returned on this rank.

    Raises:
        UserError: on every rank, when ``check`` failed on some rank or a rank gave no verdict in time:
            ``rank R (node N, host H): <its message>`` (one line per distinct problem when several).
            A rank whose ``check`` raised something other than a UserError prints its traceback first.
    """
    rank, world, node = launched_world()
    if world <= 1:
        return check()
    result, verdict = None, {"node": node, "host": socket.gethostname()}
    try:
        result = check()
    except UserError as e:
        verdict["error"] = str(e)
    except Exception as e:  # a bug or an environment fault: still agreed on, so that no peer hangs
        traceback.print_exc()
        verdict["error"] = f"{type(e).__name__}: {e} (traceback in this rank's log)"
    message = _verdict_message(name, _exchange(_store(), name, rank, world, verdict, timeout_s), world, timeout_s)
    if message is not None:
        raise UserError(message)
    return cast(T, result)  # check() returned: had it raised, this rank's error would have raised above
