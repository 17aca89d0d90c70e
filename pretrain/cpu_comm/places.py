"""Two GPU-place assumptions of paddle 3.3.1's hybrid-parallel wrappers, answered for CPU.

- ``broadcast_input_data`` (``fleet/utils/hybrid_parallel_util.py``, called by ``TensorParallel``
  before each forward): broadcasts every input tensor from the tensor-parallel group's first rank,
  after moving it to the current device; it asserts the device is gpu, xpu or a custom device.
  Here the same broadcast with the CPU place.
- ``ParallelEnv().device_id`` (read by ``PipelineLayer.__init__``): the selected GPU, from
  ``FLAGS_selected_gpus``; a CPU build never sets it (AttributeError). A CPU process has one
  device: 0.
"""

from __future__ import annotations

import paddle
from paddle.distributed.fleet.meta_parallel import tensor_parallel
from paddle.distributed.fleet.utils import hybrid_parallel_util
from paddle.distributed.parallel import ParallelEnv

from pretrain.upstream import verified


def broadcast_input_data(hcg, *inputs, **kwargs):
    """(inputs, kwargs) of the forward, every tensor in them broadcast in place from the tensor-parallel
    group's first rank (the contract of paddle's GPU version, on ``paddle.CPUPlace()``)."""
    place = paddle.CPUPlace()
    if inputs:
        inputs = hybrid_parallel_util._broadcast_nested_data(hcg, "cpu", place, inputs)
    if kwargs:
        kwargs = hybrid_parallel_util._broadcast_nested_data(hcg, "cpu", place, kwargs)
    return inputs, kwargs


def install_places() -> None:
    """Install the CPU answers above (idempotent).

    Raises:
        UserError: paddle or paddlenlp is not the ledger's (``pretrain.upstream``).
    """
    verified("cpu-places")
    tensor_parallel.broadcast_input_data = broadcast_input_data
    ParallelEnv._device_id = 0  # the class default an instance's own attribute (GPU builds) overrides
