"""Pipeline point-to-point transfers on gloo, ordered so that blocking sends cannot deadlock.

NCCL's batched P2P (paddle 3.3.1, ``fleet/meta_parallel/pp_utils/p2p_communication.py``,
``batch_send_recv_on_calc_stream``) starts every send and receive of a step at once and lets them
complete in any order; messages between two ranks are matched in the order they were issued. On gloo:

- a send returns only once the peer has received it, so the ops of one batch are run one pair of
  ranks at a time, pairs in ascending (lower rank, higher rank) order (a global order, hence no
  cycle of ranks waiting on each other), and within a pair the lower rank sends first while the
  higher one receives first;
- message tags come from one counter per group, advanced by every operation of the group, so a
  pipe group of 3 or more ranks (whose middle ranks talk to two peers) would mismatch them: each
  neighbouring pair of stages gets a 2-rank group of its own (``pair_groups``; with 2 stages the
  pipe group is that pair). The shape/dtype exchange before the first transfer (``SendRecvMeta``)
  uses it too;
- NCCL splits a transfer over the tensor-parallel ranks (``send_partial``, then an all-gather);
  here every tensor-parallel rank sends the whole tensor, with the same result
  (``_is_valid_send_recv_partial`` is false).
"""

from __future__ import annotations

import paddle.distributed
from paddle.distributed.fleet.meta_parallel.pp_utils import p2p_communication as p2p

from pretrain.upstream import verified


def pair_groups(hcg) -> dict:
    """``{(lower rank, higher rank): group}`` for every pair of neighbouring pipeline stages (the
    last stage's next is the first: interleaved schedules send around the ring).

    Collective: every rank creates every pair's group, in the same order.
    """
    groups = {}
    pipe_lists = hcg.topology().get_comm_list("pipe")
    for ranks in pipe_lists:
        for i, rank in enumerate(ranks):
            pair = tuple(sorted((rank, ranks[(i + 1) % len(ranks)])))
            if pair in groups:
                continue
            if len(ranks) == 2:  # the pipe group is the pair
                groups[pair] = hcg.get_pipe_parallel_group() if hcg.global_rank in pair else None
            else:
                groups[pair] = paddle.distributed.new_group(list(pair))
    return groups


def ordered_send_recv(groups: dict, rank: int):
    """A ``batch_send_recv_on_calc_stream`` for ``rank`` that runs each op on its pair's group, in the
    deadlock-free order of the module docstring."""

    def batch_send_recv(p2p_op_list):
        by_pair = {}
        for op in p2p_op_list:
            by_pair.setdefault(tuple(sorted((rank, op.peer))), []).append(op)
        for pair in sorted(by_pair):
            group = groups[pair]
            sends = [op for op in by_pair[pair] if op.op is p2p._send_on_calc_stream]
            recvs = [op for op in by_pair[pair] if op.op is not p2p._send_on_calc_stream]
            for op in sends + recvs if rank == pair[0] else recvs + sends:
                peer = group.get_group_rank(op.peer)
                if op.op is p2p._send_on_calc_stream:
                    group.process_group.send(op.tensor, peer, True)
                else:
                    group.process_group.recv(op.tensor, peer, True)

    return batch_send_recv


def _on_pair_group(method, groups: dict, rank: int, peer_of):
    """``SendRecvMeta.method`` with its ``group`` replaced by the pair group of ``rank`` and the peer
    ``peer_of(reverse)`` (paddle passes the whole pipe group)."""

    def on_pair(self, *args, reverse=False, broadcast=False):
        *leading, _pipe_group = args
        pair = tuple(sorted((rank, peer_of(reverse))))
        return method(self, *leading, groups[pair], reverse=reverse, broadcast=broadcast)

    return on_pair


def install_pipeline(hcg) -> None:
    """Route paddle's pipeline P2P through the pair groups, in order (collective: creates the groups).

    Raises:
        UserError: paddle or paddlenlp is not the ledger's (``pretrain.upstream``).
    """
    verified("cpu-pipeline-p2p")
    groups, rank = pair_groups(hcg), hcg.global_rank
    p2p.batch_send_recv_on_calc_stream = ordered_send_recv(groups, rank)
    p2p._is_valid_send_recv_partial = lambda tensor, mp_degree: False
    meta = p2p.SendRecvMeta
    meta.send_meta = _on_pair_group(
        meta.send_meta, groups, rank, lambda reverse: hcg._get_p2p_prev_rank() if reverse else hcg._get_p2p_next_rank()
    )
    meta.recv_meta = _on_pair_group(
        meta.recv_meta, groups, rank, lambda reverse: hcg._get_p2p_next_rank() if reverse else hcg._get_p2p_prev_rank()
    )
