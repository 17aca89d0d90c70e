"""CPU versions of the tensor-parallel ops paddle 3.3.1 has GPU kernels for only.

Installed over ``paddle._C_ops.<op>`` by ``install_kernels``: paddle's ``mp_ops`` (and the layers of
``fleet.meta_parallel`` and paddlenlp built on it) look the op up there at every call. Each takes
the GPU op's arguments; the group is the process group paddle registered under ``ring_id``.

- ``c_identity``: a copy of the input (its gradient, the all-reduce, is in paddle's
  ``c_identity_eager``). The CPU kernel raises "Do not support c_identity for cpu kernel now".
- ``c_split``: this rank's slice of the last dimension (``n`` equal parts); called inside paddle's
  ``c_split_eager``, whose backward all-gathers.
- ``c_concat``: every rank's tensor, concatenated along the last dimension in rank order; its
  gradient is the GPU op's, ``c_split`` of the output gradient (no communication).
- ``c_softmax_with_cross_entropy``: the one op here that is math. Cross-entropy over a vocabulary
  split along the last dimension, by the GPU kernel's decomposition
  (``paddle/phi/kernels/gpu/c_softmax_with_cross_entropy_kernel.cu``): all-reduce MAX of the row
  maxima, all-reduce SUM of the target logit (each rank contributes it only when the label falls in
  its slice), all-reduce SUM of the exponentials; loss = log(sum exp) - target logit, 0 where the
  label is ``ignore_index``. Gradient: (softmax - one-hot of the label in this slice) x loss gradient,
  0 on ignored rows.
"""

from __future__ import annotations

import paddle
from paddle.autograd import PyLayer
from paddle.distributed import ReduceOp
from paddle.distributed.collective import _get_group_map

from pretrain.upstream import verified


def group_of(ring_id: int):
    """The ``paddle.distributed`` group paddle registered under ``ring_id`` (the ops' group argument)."""
    return _get_group_map()[ring_id]


def c_identity(tensor: paddle.Tensor, ring_id: int, use_calc_stream: bool, use_model_parallel: bool) -> paddle.Tensor:
    """A copy of ``tensor`` (any shape, dtype)."""
    return tensor.clone()


def c_split(tensor: paddle.Tensor, rank: int, nranks: int, ring_id: int, use_model_parallel: bool) -> paddle.Tensor:
    """Part ``rank`` of ``nranks`` equal parts of ``tensor``'s last dimension: [..., d] -> [..., d / nranks]."""
    return paddle.split(tensor, nranks, axis=-1)[rank].clone()


class _Concat(PyLayer):
    """[..., d] on each of n ranks -> [..., n x d], rank order; backward: this rank's slice."""

    @staticmethod
    def forward(ctx, tensor, rank, nranks, ring_id):
        ctx.rank, ctx.nranks = rank, nranks
        gathered = paddle.empty([nranks * tensor.shape[0], *tensor.shape[1:]], dtype=tensor.dtype)
        group_of(ring_id).process_group.all_gather_into_tensor(gathered, tensor, True)
        return paddle.concat(paddle.split(gathered, nranks, axis=0), axis=-1)

    @staticmethod
    def backward(ctx, grad):
        return paddle.split(grad, ctx.nranks, axis=-1)[ctx.rank]


def c_concat(
    tensor: paddle.Tensor, rank: int, nranks: int, ring_id: int, use_calc_stream: bool, use_model_parallel: bool
) -> paddle.Tensor:
    """Every rank's ``tensor`` ([..., d], equal shapes) concatenated along the last dimension: [..., n x d]."""
    return _Concat.apply(tensor, rank, nranks, ring_id)


class _ParallelCrossEntropy(PyLayer):
    """Softmax cross-entropy over a vocabulary split along the last dimension (see the module docstring)."""

    @staticmethod
    def forward(ctx, logits, label, ignore_index, ring_id, rank, nranks):
        group = group_of(ring_id)
        part = logits.shape[-1]  # this rank's vocabulary slice: ids [rank * part, (rank + 1) * part)
        row_max = logits.max(axis=-1, keepdim=True)  # [..., 1]
        paddle.distributed.all_reduce(row_max, op=ReduceOp.MAX, group=group)
        shifted = logits - row_max
        local = label - rank * part  # [..., 1]
        here = (local >= 0) & (local < part)
        one_hot = paddle.nn.functional.one_hot(paddle.where(here, local, paddle.zeros_like(local)).squeeze(-1), part)
        one_hot = one_hot * here.astype(one_hot.dtype)  # [..., part]
        target = (shifted * one_hot).sum(axis=-1, keepdim=True)
        paddle.distributed.all_reduce(target, op=ReduceOp.SUM, group=group)
        exp = shifted.exp()
        sum_exp = exp.sum(axis=-1, keepdim=True)
        paddle.distributed.all_reduce(sum_exp, op=ReduceOp.SUM, group=group)
        kept = (label != ignore_index).astype(logits.dtype)  # [..., 1]
        loss = (sum_exp.log() - target) * kept
        softmax = exp / sum_exp
        ctx.save_for_backward(softmax, one_hot, kept)
        return softmax, loss

    @staticmethod
    def backward(ctx, softmax_grad, loss_grad):
        softmax, one_hot, kept = ctx.saved_tensor()
        return (softmax - one_hot) * (loss_grad * kept), None


def c_softmax_with_cross_entropy(
    logits: paddle.Tensor, label: paddle.Tensor, ignore_index: int, ring_id: int, rank: int, nranks: int
):
    """(softmax, loss) of logits [..., V / n] (this rank's slice of a V-word vocabulary) and
    global label ids [..., 1] (int64): softmax [..., V / n], loss [..., 1] in nats, 0 where the label is
    ``ignore_index``."""
    return _ParallelCrossEntropy.apply(logits, label, ignore_index, ring_id, rank, nranks)


KERNELS = {
    "c_identity": c_identity,
    "c_split": c_split,
    "c_concat": c_concat,
    "c_softmax_with_cross_entropy": c_softmax_with_cross_entropy,
}


def install_kernels() -> None:
    """Put the ops above in ``paddle._C_ops`` (idempotent).

    Raises:
        UserError: paddle or paddlenlp is not the ledger's (``pretrain.upstream``).
    """
    verified("cpu-kernels")
    for name, kernel in KERNELS.items():
        setattr(paddle._C_ops, name, kernel)
