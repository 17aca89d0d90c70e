"""Process-group collectives that paddle's gloo backend lacks, built from the ones it has.

Installed as methods of ``paddle.base.core.ProcessGroupGloo`` (so NCCL, XCCL and BKCL groups are
untouched) by ``install_collectives``. Each keeps the contract of paddle 3.3.1's
``ProcessGroup`` method it replaces (``paddle/phi/core/distributed/process_group.h``): same
arguments, results written into the given output tensors, a task whose ``wait()`` returns at once
because the work is done (gloo collectives are synchronous on CPU).

- ``*_on_calc_stream``: NCCL runs the collective on the compute stream, so it is ordered with the
  kernels around it without a wait. On CPU everything is ordered already: the synchronous
  (``sync_op=True``) variant has the same result. gloo raises "does not support ..." for these.
- ``reduce_scatter`` / ``reduce_scatter_tensor``: rank ``r`` of ``n`` gets chunk ``r`` (along dim 0,
  ``n`` equal chunks) of the element-wise reduction of every rank's input. Here: an all_reduce of a
  copy of the input, then this rank's chunk (n x the bytes of a ring reduce-scatter; CPU runs are
  small).
- ``all_to_all`` / ``all_to_all_tensor``: the input is ``n`` equal dim-0 chunks; rank ``r``'s output
  chunk ``j`` is rank ``j``'s input chunk ``r``. Here: an all_gather of every input, then this
  rank's selection (for expert parallelism).
- ``all_to_all_single``: the same exchange with the chunk sizes as arguments; equal chunks only (empty
  size lists, as paddlenlp 3.0.0b4's ``MoELayer`` dispatch passes them), which is ``all_to_all``.
"""

from __future__ import annotations

from typing import Callable

import paddle
from paddle.base import core

from pretrain.upstream import verified

# The calc-stream variant -> the synchronous method with the same leading arguments, sync_op last.
CALC_STREAM_TO_SYNC = {
    "all_reduce_on_calc_stream": "all_reduce",
    "all_gather_into_tensor_on_calc_stream": "all_gather_into_tensor",
    "all_gather_on_calc_stream": "all_gather",
    "broadcast_on_calc_stream": "broadcast",
    "reduce_on_calc_stream": "reduce",
    "send_on_calc_stream": "send",
    "recv_on_calc_stream": "recv",
    "reduce_scatter_on_calc_stream": "reduce_scatter",
    "reduce_scatter_tensor_on_calc_stream": "reduce_scatter_tensor",
    "all_to_all_on_calc_stream": "all_to_all",
    "all_to_all_tensor_on_calc_stream": "all_to_all_tensor",
    "all_to_all_single_on_calc_stream": "all_to_all_single",
}


def _sync_variant(name: str):
    """``ProcessGroup.<name>_on_calc_stream(*args)`` as ``ProcessGroup.<name>(*args, sync_op=True)``."""

    def on_calc_stream(self, *args):
        return getattr(self, name)(*args, True)

    on_calc_stream.__name__ = f"{name}_on_calc_stream"
    on_calc_stream.__doc__ = f"gloo: the synchronous ``{name}`` (same result as NCCL's calc-stream variant)."
    return on_calc_stream


def reduce_scatter(self, out: paddle.Tensor, tensor: paddle.Tensor, op, sync_op: bool = True):
    """Write into ``out`` ([d0 / n, ...]) this rank's dim-0 chunk of ``op`` over every rank's ``tensor``
    ([d0, ...], d0 a multiple of the group size n); the same dtype. Returns the finished task."""
    n = self.size()
    if tensor.shape[0] % n:
        raise ValueError(f"reduce_scatter: dim 0 ({tensor.shape[0]}) of the input is not a multiple of {n} ranks")
    reduced = tensor.clone()
    task = self.all_reduce(reduced, op, True)
    paddle.assign(paddle.split(reduced, n, axis=0)[self.rank()], output=out)
    return task


def all_to_all(self, out: paddle.Tensor, tensor: paddle.Tensor, sync_op: bool = True):
    """Write into ``out`` (the shape of ``tensor``: [n x k, ...]) the chunk ``rank`` (k rows) of every
    rank's ``tensor``, in rank order. Returns the finished task."""
    n = self.size()
    if tensor.shape[0] % n:
        raise ValueError(f"all_to_all: dim 0 ({tensor.shape[0]}) of the input is not a multiple of {n} ranks")
    gathered = paddle.empty([n * tensor.shape[0], *tensor.shape[1:]], dtype=tensor.dtype)
    task = self.all_gather_into_tensor(gathered, tensor, True)
    chunks = paddle.split(gathered, n * n, axis=0)  # chunk j*n + r: rank j's input chunk r
    paddle.assign(paddle.concat([chunks[j * n + self.rank()] for j in range(n)], axis=0), output=out)
    return task


def all_to_all_single(self, out: paddle.Tensor, tensor: paddle.Tensor, out_sizes, in_sizes, sync_op: bool = True):
    """``all_to_all`` with equal dim-0 chunks; ``out_sizes`` and ``in_sizes`` must be empty or all equal."""
    if len(set(out_sizes)) > 1 or len(set(in_sizes)) > 1:
        raise ValueError(f"all_to_all_single: unequal chunk sizes {in_sizes} -> {out_sizes} are not supported on gloo")
    return all_to_all(self, out, tensor, sync_op)


def install_collectives() -> None:
    """Give ``core.ProcessGroupGloo`` the methods above (idempotent; paddle 3.3.1 raises
    "ProcessGroup ... does not support" for each of them on gloo).

    Raises:
        RuntimeError: the collective byte counter (``pretrain.metrics.comm_volume.install_counter``) is installed
            already: these methods would replace its counted ones, and their bytes would go uncounted.
        UserError: paddle or paddlenlp is not the ledger's (``pretrain.upstream``).
    """
    verified("cpu-collectives")
    if any(getattr(getattr(core.ProcessGroupGloo, name, None), "counts", False) for name in dir(core.ProcessGroupGloo)):
        raise RuntimeError("install_collectives after comm_volume.install_counter: install the collectives first")
    methods: dict[str, Callable] = {"reduce_scatter": reduce_scatter, "reduce_scatter_tensor": reduce_scatter}
    methods |= {"all_to_all": all_to_all, "all_to_all_tensor": all_to_all, "all_to_all_single": all_to_all_single}
    methods |= {calc_stream: _sync_variant(sync) for calc_stream, sync in CALC_STREAM_TO_SYNC.items()}
    for name, method in methods.items():
        setattr(core.ProcessGroupGloo, name, method)
