"""gloo process groups whose rendezvous keys cannot collide: one TCP store per group.

paddle 3.3.1's ``ProcessGroupGloo`` constructor (``paddle/fluid/distributed/collective/
process_group_gloo.cc``) connects its gloo context through the job's one TCP store without a
per-group prefix: each member publishes its address under its rank in the group ("0", "1", ...).
When groups of different members are created, as fleet does for every hybrid layout of 4 or more
ranks (pipe groups [0, 2] and [1, 3], then model groups [0, 1] and [2, 3], ...), members of
different groups read each other's addresses, or a stale one of an earlier group: ``fleet.init``
fails with gloo ``connect ... Connection refused``, a timeout, or ``address.cc:30 sizeof(impl_) ==
bytes.size()``. NCCL groups exchange a unique id under a per-group key and are not affected.

Here each gloo group gets a TCP store of its own: the group's first rank serves it on a free port of
its own endpoint's host and publishes the address in the job's store under a key named after the
group id (unique: every rank numbers groups alike); the others connect to it. Only the rendezvous
changes; the group is paddle's.
"""

from __future__ import annotations

import socket

from paddle.base import core
from paddle.distributed import collective

from pretrain.upstream import verified

STORE_TIMEOUT_S = 900  # paddle's TCPStore default
_create_group = collective._new_process_group_impl
_stores = []  # every group's store, kept alive with the process


def _free_port(host: str) -> int:
    """A TCP port free on ``host`` now (the OS picks it; the store binds it right after)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def group_store(job_store, rank: int, world_size: int, group_id: int):
    """A TCP store for the group ``group_id``, served by its rank 0 (collective over the group's members)."""
    key = f"pretrain_cpu_comm/group_store/{group_id}"
    if rank == 0:
        host = collective._get_global_env().current_endpoint.split(":")[0]
        port = _free_port(host)
        job_store.set(key, f"{host}:{port}")  # first: the server waits until every member has connected
        store = core.TCPStore(host, port, True, world_size, STORE_TIMEOUT_S)
    else:
        job_store.wait(key)
        host, served_port = bytes(job_store.get(key)).decode().rsplit(":", 1)
        store = core.TCPStore(host, int(served_port), False, world_size, STORE_TIMEOUT_S)  # retries until served
    _stores.append(store)
    return store


def new_process_group(backend, store, rank, world_size, group_name, pg_options, group_id=0, **options):
    """paddle's ``collective._new_process_group_impl``; a gloo group rendezvouses in a store of its own."""
    if backend == "gloo":
        store = group_store(store, rank, world_size, group_id)
    return _create_group(backend, store, rank, world_size, group_name, pg_options, group_id, **options)


def install_group_stores() -> None:
    """Route paddle's group creation through ``new_process_group`` (before ``fleet.init``).

    Raises:
        UserError: paddle or paddlenlp is not the ledger's (``pretrain.upstream``).
    """
    verified("cpu-group-stores")
    collective._new_process_group_impl = new_process_group
