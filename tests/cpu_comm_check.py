"""Checks of ``pretrain.cpu_comm`` against each collective's definition, run by 2 gloo processes.

    python -m paddle.distributed.launch --nproc_per_node 2 tests/cpu_comm_check.py {tensor|pipeline}

``tensor``: fleet with tensor degree 2 (collectives, kernels, places); ``pipeline``: pipeline degree 2
(ordered P2P, the shape exchange). Each check prints ``ok <name>`` or raises (exit status 1).
"""

import sys

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.distributed import fleet

from pretrain.cpu_comm import install


def check(name: str, condition: bool, detail="") -> None:
    """Print ``ok name``, or raise with ``detail``."""
    if not condition:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}", flush=True)


def close(a, b, rtol=1e-6) -> bool:
    return np.allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=1e-7)


def tensor_checks(hcg) -> None:
    group = hcg.get_model_parallel_group()
    pg, rank, n = group.process_group, group.rank, group.nranks
    from paddle.distributed.communication.reduce import ReduceOp, _get_reduce_op

    total = _get_reduce_op(ReduceOp.SUM)

    # every rank r holds r + 1 (+ offsets): the expected results follow from the definitions
    x = paddle.to_tensor([rank + 1.0, 10.0 * (rank + 1)])
    pg.all_reduce_on_calc_stream(x, total)
    check("all_reduce_on_calc_stream", close(x, [3.0, 30.0]), x)
    gathered = paddle.empty([2 * n])
    pg.all_gather_into_tensor_on_calc_stream(gathered, paddle.to_tensor([rank, rank + 0.5]))
    check("all_gather_into_tensor_on_calc_stream", close(gathered, [0, 0.5, 1, 1.5]), gathered)
    x = paddle.to_tensor([rank + 7.0])
    pg.broadcast_on_calc_stream(x, 1)
    check("broadcast_on_calc_stream", close(x, [8.0]), x)
    x = paddle.to_tensor([rank + 1.0])
    pg.reduce_on_calc_stream(x, 0, total)
    check("reduce_on_calc_stream", rank != 0 or close(x, [3.0]), x)
    x = paddle.to_tensor([rank + 0.25])
    if rank == 0:
        pg.send_on_calc_stream(x, 1)
    else:
        pg.recv_on_calc_stream(x, 0)
    check("send/recv_on_calc_stream", close(x, [0.25]), x)

    # reduce_scatter: rank r gets chunk r of the element-wise sum
    inputs = [np.arange(8, dtype="float32").reshape(4, 2) * (r + 1) for r in range(n)]
    out = paddle.empty([2, 2])
    task = pg.reduce_scatter(out, paddle.to_tensor(inputs[rank]), total, True)
    task.wait()
    check("reduce_scatter", close(out, sum(inputs)[2 * rank : 2 * rank + 2]), out)
    out = paddle.empty([2, 2])
    pg.reduce_scatter_tensor_on_calc_stream(out, paddle.to_tensor(inputs[rank]), total)
    check("reduce_scatter_tensor_on_calc_stream", close(out, sum(inputs)[2 * rank : 2 * rank + 2]), out)
    # all_to_all: output chunk j is rank j's input chunk `rank`
    inputs = [np.arange(6, dtype="float32").reshape(6, 1) + 100 * r for r in range(n)]
    out = paddle.empty([6, 1])
    pg.all_to_all(out, paddle.to_tensor(inputs[rank]), True)
    expected = np.concatenate([np.split(inputs[j], n)[rank] for j in range(n)])
    check("all_to_all", close(out, expected), out)
    out = paddle.empty([6, 1])
    pg.all_to_all_tensor_on_calc_stream(out, paddle.to_tensor(inputs[rank]))
    check("all_to_all_tensor_on_calc_stream", close(out, expected), out)
    out = paddle.empty([6, 1])  # as paddlenlp's MoELayer dispatches: paddle's stream.alltoall_single
    paddle.distributed.stream.alltoall_single(out, paddle.to_tensor(inputs[rank]), None, None, None, True, True)
    check("alltoall_single (all_to_all_single_on_calc_stream)", close(out, expected), out)

    # kernels, through paddle's own mp_ops (which look them up in paddle._C_ops)
    from paddle.distributed.fleet.layers.mpu import mp_ops

    rng = np.random.default_rng(0)  # the same numbers on both ranks
    full = rng.standard_normal((3, 4, 8)).astype("float32")
    x = paddle.to_tensor(full, stop_gradient=False)
    y = mp_ops._c_identity(x, group=group)
    check("c_identity", close(y, full) and y is not x)
    (y * (rank + 1)).sum().backward()  # c_identity's gradient all-reduces: 1 + 2
    check("c_identity backward (all-reduce)", close(x.grad, np.full_like(full, 3.0)), x.grad)
    y = mp_ops._c_split(paddle.to_tensor(full), group=group)
    check("c_split", close(y, np.split(full, n, axis=-1)[rank]), y)
    part = paddle.to_tensor(full + rank, stop_gradient=False)
    y = mp_ops._c_concat(part, group=group)
    check("c_concat", close(y, np.concatenate([full + r for r in range(n)], axis=-1)), y)
    weight = rng.standard_normal((3, 4, 8 * n)).astype("float32")
    (y * paddle.to_tensor(weight)).sum().backward()
    check("c_concat backward (c_split)", close(part.grad, np.split(weight, n, axis=-1)[rank]), part.grad)

    # parallel cross-entropy against paddle's single-process cross-entropy on the whole vocabulary
    logits = rng.standard_normal((2, 5, 8 * n)).astype("float32") * 3
    labels = rng.integers(0, 8 * n, size=(2, 5, 1))
    labels[0, 1, 0] = -100  # ignore_index
    whole = paddle.to_tensor(logits, stop_gradient=False)
    reference = paddle.nn.functional.cross_entropy(whole, paddle.to_tensor(labels), reduction="none", ignore_index=-100)
    (reference * paddle.to_tensor(np.arange(10, dtype="float32").reshape(2, 5, 1))).sum().backward()
    mine = paddle.to_tensor(np.split(logits, n, axis=-1)[rank], stop_gradient=False)
    loss, softmax = mp_ops._c_softmax_with_cross_entropy(
        mine, paddle.to_tensor(labels), group=group, return_softmax=True
    )
    check("c_softmax_with_cross_entropy loss", close(loss, reference.numpy(), rtol=1e-6), (loss, reference))
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    check("c_softmax_with_cross_entropy softmax", close(softmax, np.split(probabilities, n, axis=-1)[rank]))
    (loss * paddle.to_tensor(np.arange(10, dtype="float32").reshape(2, 5, 1))).sum().backward()
    expected = np.split(whole.grad.numpy(), n, axis=-1)[rank]
    check("c_softmax_with_cross_entropy backward", close(mine.grad, expected, rtol=1e-5), (mine.grad, expected))

    # places
    from paddle.distributed.fleet.meta_parallel import tensor_parallel

    ids = paddle.to_tensor([[rank + 5, 1]])
    tensor_parallel.broadcast_input_data(hcg, ids, labels=paddle.to_tensor([rank]))
    check("broadcast_input_data", close(ids, [[5, 1]]), ids)
    check("ParallelEnv().device_id", dist.ParallelEnv().device_id == 0)


def pipeline_checks(hcg) -> None:
    from paddle.distributed.fleet.meta_parallel.pp_utils import p2p_communication as p2p

    rank, peer, group = hcg.global_rank, 1 - hcg.global_rank, hcg.get_pipe_parallel_group()
    # both ranks send and receive in one batch: with blocking sends in issue order this deadlocks
    sent = paddle.to_tensor([rank + 0.5, rank + 1.5])
    received = paddle.empty([2])
    ops = [
        p2p.P2PonCalcStream(p2p._send_on_calc_stream, sent, peer, group),
        p2p.P2PonCalcStream(p2p._recv_on_calc_stream, received, peer, group),
    ]
    p2p.batch_send_recv_on_calc_stream(ops)
    check("batch_send_recv_on_calc_stream", close(received, [peer + 0.5, peer + 1.5]), received)
    meta = p2p.SendRecvMeta()
    if rank == 0:
        meta.send_meta(paddle.empty([3, 4]), group)
        check("send_meta", True)
    else:
        meta.recv_meta(group)
        check("recv_meta", list(meta.recv_shape_message) == [3, 4], meta.recv_shape_message)


if __name__ == "__main__":
    paddle.set_device("cpu")
    mode = sys.argv[1]
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"mp_degree": 2} if mode == "tensor" else {"pp_degree": 2}
    if mode == "pipeline":
        strategy.pipeline_configs = {"accumulate_steps": 1, "micro_batch_size": 1}
    fleet.init(is_collective=True, strategy=strategy)
    hcg = fleet.get_hybrid_communicate_group()
    install(hcg)
    if mode == "tensor":
        tensor_checks(hcg)
    else:
        from paddle.distributed.fleet.meta_parallel.pp_utils import p2p_communication

        p2p_communication.initialize_p2p_groups(hcg)
        pipeline_checks(hcg)
    dist.barrier()  # leave together: a rank gone early can abort its peer's gloo teardown (SIGABRT, launch exit 250)
    print("all checks passed", flush=True)
