"""Is a folder shared by every rank of a launch? A probe file written by global rank 0, looked for by all.

Nodes may see the same path on shared storage (NFS, Lustre, a cloud file system) or on a disk of
their own. paddlenlp's ``share_folder`` and a shared ``output_dir`` change who writes there, and a
wrong guess hangs a run (ranks waiting for files that never come) or races (several nodes writing
and deleting the same files). ``folder_seen_by`` answers it for real: global rank 0 writes
``.shared-probe-<token>`` (a token unique to the call, broadcast from rank 0) in the folder, every
rank looks for it after an agreed barrier (``pretrain.cluster.agreement``), the answers are all-gathered,
and rank 0 deletes the probe.
"""

from __future__ import annotations

import os
import socket
import uuid

import paddle.distributed as dist

from pretrain.cluster.agreement import agree_on
from pretrain.cluster.ranks import launched_world

PROBE = ".shared-probe-{token}"


def folder_seen_by(folder: str, timeout_s: float) -> list:
    """``[(rank, node, host, sees_probe)]`` for every rank, by global rank: whether each sees the probe
    global rank 0 wrote in ``folder`` (created if needed). A collective call: every rank, the same folder
    path (a relative path resolves per node). Alone: ``[(0, 0, host, True)]``.

    Raises:
        UserError: on every rank, when rank 0 cannot write the probe, or a rank gives no answer within
            ``timeout_s`` seconds.
    """
    rank, world, node = launched_world()
    if world <= 1:
        return [(0, 0, socket.gethostname(), True)]
    token = [uuid.uuid4().hex if rank == 0 else ""]  # rank 0's, broadcast
    dist.broadcast_object_list(token, src=0)
    probe = os.path.join(folder, PROBE.format(token=token[0]))

    def write_probe():
        if rank == 0:
            os.makedirs(folder, exist_ok=True)
            with open(probe, "w", encoding="utf-8") as f:
                f.write("written by global rank 0 to tell whether every node sees this folder\n")

    try:
        agree_on(f"probe {token[0][:8]} of {folder}", write_probe, timeout_s)  # also the barrier before looking
        seen = []
        dist.all_gather_object(seen, (rank, node, socket.gethostname(), os.path.isfile(probe)))
    finally:
        if rank == 0 and os.path.exists(probe):
            os.remove(probe)
    return seen
