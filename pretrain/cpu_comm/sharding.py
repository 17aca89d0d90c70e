"""Sharding stage2 and stage3 (paddle's group-sharded ZeRO) on CPU processes, for paddle 3.3.1.

paddle's ``group_sharded_parallel`` and the constructors of its stage2 optimizer and stage3 layer
refuse a CPU build before any communication happens, although their bodies run on CPU tensors (their
alignment tables have a ``"cpu"`` row, and gloo provides every collective they call: synchronous
``reduce``, ``broadcast``, ``all_reduce`` and ``all_gather``), and two host copies they make are, on a
CPU build, the tensor itself, freed right after. Each patch below replaces one such device check or
copy, names the paddle 3.3.1 code it replaces and what that code does on a GPU; none moves other data
or changes any arithmetic (``tests/test_sharding_cpu.py`` holds the losses and weights of stage2 and
stage3 x2 to a 1-process run's: bit-identical). Not covered: ``offload`` (refused: on CPU the states
are on the host already) and stage3's gradient clipping (``GroupShardedClipGrad`` moves the global norm
to a GPU in the middle of its arithmetic; the preflight refuses ``max_grad_norm`` > 0 with stage3 on CPU).

``install()`` applies them; ``run_pretrain.py`` calls it only for a CPU run with sharding stage2 or
stage3 over more than one rank, before paddlenlp wraps the model.
"""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import paddle
import paddle.distributed.sharding as sharding_api
from paddle.base import core
from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_optimizer_stage2, group_sharded_stage3
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_optimizer_stage2 import (
    GroupShardedOptimizerStage2,
)
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage2 import GroupShardedStage2
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_storage import ParamStorage

from pretrain.upstream import verified

CPU = "cpu"


class _CoreOfAGpuBuild:
    """paddle's ``core`` module as a CUDA build answers ``is_compiled_with_cuda()``; every other name is core's."""

    def __getattr__(self, name):
        return getattr(core, name)

    @staticmethod
    def is_compiled_with_cuda() -> bool:
        return True


class _PaddleWithADeviceId:
    """The ``paddle`` module, whose ``get_device()`` names the CPU as ``"cpu:0"`` (a GPU build's ``"gpu:0"``
    form, which paddle's sharding code splits for a device id); every other name is paddle's."""

    def __getattr__(self, name):
        return getattr(paddle, name)

    @staticmethod
    def get_device() -> str:
        return f"{CPU}:0"


@contextmanager
def _device_checks_passed_on_cpu(module):
    """While the constructor of paddle 3.3.1's ``GroupShardedOptimizerStage2`` (``module`` is
    group_sharded_optimizer_stage2) or ``GroupShardedStage3`` (group_sharded_stage3) runs, in ``module``
    only: its assertion ``core.is_compiled_with_cuda() or core.is_compiled_with_xpu() or device in
    core.get_all_custom_device_type()`` holds, and ``paddle.get_device()`` reads ``"cpu:0"``, so that
    the stage2 optimizer's ``int(paddle.get_device().split(":")[1])`` (a device id, used only to copy
    offloaded master weights back to the GPU) is 0 as stage3's own CPU branch sets it."""
    with (
        mock.patch.object(module, "core", _CoreOfAGpuBuild()),
        mock.patch.object(module, "paddle", _PaddleWithADeviceId()),
    ):
        yield


_ADD_RANK_PARAMS = ParamStorage.add_rank_params


def _add_rank_params_on_the_host(self, trainable_params, param2align, convert_gpu=True):
    """Replaces paddle 3.3.1's ``ParamStorage.add_rank_params`` (group_sharded_storage.py) as the stage2
    optimizer calls it, with ``convert_gpu=True``: each parameter is copied to the host (``param.cpu()``),
    its device memory freed, the copy written into a flat host buffer, the buffer copied to the device
    (``cvt_to_device``) and the parameter made a view of it. On a CPU build ``param.cpu()`` is the
    parameter's own memory, which ``_clear_data`` then frees ("Tensor not initialized yet"), and
    ``cvt_to_device`` raises: paddle's own ``convert_gpu=False`` path is the same on the host (each
    value copied into the flat buffer, the parameter made a view of it, no device copy).
    """
    return _ADD_RANK_PARAMS(self, trainable_params, param2align, convert_gpu=False)


def _device_to_host_copy(trans_param: paddle.Tensor, convert_dtype: bool = False) -> paddle.Tensor:
    """Replaces paddle 3.3.1's ``group_sharded_stage3._device2cpu`` (a host copy of a tensor, cast to float32
    first with ``convert_dtype``, whose device memory is then freed), which ``GroupShardedStage3.get_all_parameters
    (convert2cpu=True)`` calls on each gathered parameter before paddlenlp saves the model. On a CPU build
    ``Tensor.cpu()`` is the tensor's own memory, which ``_clear_data`` then frees: the copy is made here.

    Args:
        trans_param: the tensor (any float dtype, any shape).
        convert_dtype: cast to float32 first.

    Returns:
        A new host tensor with ``trans_param``'s values (float32 with ``convert_dtype``); ``trans_param`` is freed.
    """
    if convert_dtype:
        trans_param = paddle.cast(trans_param, paddle.float32)
    copy = trans_param._copy_to(paddle.CPUPlace(), True)
    trans_param._clear_data()
    return copy


def group_sharded_parallel_on_cpu(
    model,
    optimizer,
    level: str,
    scaler=None,
    group=None,
    offload: bool = False,
    sync_buffers: bool = False,
    buffer_max_size: int = 2**23,
    segment_size: int = 2**20,
    sync_comm: bool = False,
    dp_group=None,
    exclude_layer=None,
):
    """Replaces paddle 3.3.1's ``paddle.distributed.sharding.group_sharded_parallel`` (group_sharded.py),
    which asserts "group_sharded_parallel only support gpu, xpu and custom_device now" and would
    otherwise pass ``paddle.get_device()`` (``"cpu"`` here) as the device: the same wrappers, built with
    device ``"cpu"`` (paddlenlp's ``Trainer._wrap_model`` calls it). Arguments are paddle's; ``scaler`` is
    returned as given (paddle wraps a ``GradScaler`` for fp16, which does not run on CPU; paddlenlp passes None).

    Level ``os``/``os_g`` (paddle runs both as stage2): ``GroupShardedOptimizerStage2`` (the optimizer states
    of the parameters this rank owns) and ``GroupShardedStage2`` (each gradient bucket reduced to its owner
    in backward, the updated parameters broadcast by their owners). Level ``p_g_os`` (stage3):
    ``GroupShardedStage3`` (parameters above ``segment_size`` elements sliced over the ranks, gathered
    layer by layer in forward and backward; gradients all-reduced, then sliced).

    Returns:
        (model, optimizer, scaler): the wrapped model and optimizer (stage3 keeps the optimizer), as paddle's.

    Raises:
        ValueError: ``offload``, or a level other than os, os_g and p_g_os.
    """
    if offload:
        raise ValueError("sharding offload moves optimizer states to the host: on CPU they are there already")
    wrapper_args = {"group": group, "sync_buffers": sync_buffers, "dp_group": dp_group, "device": CPU}
    if level == "p_g_os":
        with _device_checks_passed_on_cpu(group_sharded_stage3):
            model = group_sharded_stage3.GroupShardedStage3(
                model,
                optimizer,
                segment_size=segment_size,
                sync_comm=sync_comm,
                exclude_layer=exclude_layer,
                **wrapper_args,
            )
        return model, optimizer, scaler
    if level not in ("os", "os_g"):
        raise ValueError(f"sharding level {level!r}: paddle's levels are os, os_g and p_g_os")
    with _device_checks_passed_on_cpu(group_sharded_optimizer_stage2):
        optimizer = GroupShardedOptimizerStage2(
            params=optimizer._parameter_list, optim=optimizer, group=group, dp_group=dp_group, device=CPU
        )
    model = GroupShardedStage2(model, optimizer, buffer_max_size=buffer_max_size, **wrapper_args)
    return model, optimizer, scaler


def install() -> None:
    """Apply the patches of this module (idempotent). Call only in a CPU process, before paddlenlp wraps the model.

    Raises:
        UserError: paddle or paddlenlp is not the ledger's (``pretrain.upstream``).
    """
    verified("cpu-group-sharded")
    sharding_api.group_sharded_parallel = group_sharded_parallel_on_cpu
    ParamStorage.add_rank_params = _add_rank_params_on_the_host
    group_sharded_stage3._device2cpu = _device_to_host_copy
