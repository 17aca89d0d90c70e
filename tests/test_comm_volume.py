"""The collective counter (pretrain.metrics.comm_volume), its time in the breakdown, and sharding stage2's buffers
in the planner. The counts of real runs against the planner: tests/test_parallel_layouts.py."""

import time

import paddle
import pytest

from pretrain.metrics.comm_volume import CollectiveCounter, tensor_bytes
from pretrain.metrics.time_breakdown import TimeBreakdown
from pretrain.planner import parameters
from pretrain.planner.parameters import stage2_buffers


class _Group:
    """A stand-in for a paddle ProcessGroup: only its size is read."""

    def __init__(self, size: int):
        self._size = size

    def size(self) -> int:
        return self._size


def test_a_call_counts_its_largest_tensor_once_under_its_group_kind():
    counter, heard = CollectiveCounter(), []
    counter.listener = heard.append
    model, alone = _Group(2), _Group(1)
    counter._kinds = {id(model): "mp", id(alone): "dp"}
    gathered, part = paddle.zeros([4, 8], "float32"), paddle.zeros([2, 8], "float32")
    pieces = [paddle.zeros([2, 8], "float32")] * 2

    def reduce_scatter_from_an_all_reduce():  # a replacement built from another counted collective
        counter.count("all_reduce", model, (gathered,), lambda: None)
        return "done"

    assert counter.count("reduce_scatter_tensor", model, (part, gathered), reduce_scatter_from_an_all_reduce) == "done"
    counter.count("all_gather", model, (pieces, part, True), lambda: time.sleep(0.01))
    counter.count("all_reduce", alone, (gathered,), lambda: None)  # a group of one moves nothing
    assert counter.snapshot() == {"mp": {"reduce_scatter": 128, "all_gather": 128}}
    assert dict(counter.calls) == {("mp", "reduce_scatter"): 1, ("mp", "all_gather"): 1}
    assert len(heard) == 2 and heard[1] >= 0.01 and counter.seconds == pytest.approx(sum(heard))
    assert tensor_bytes(paddle.zeros([3], "int64")) == 24 and tensor_bytes("not a tensor") == 0


def test_collective_seconds_inside_forward_backward_count_as_communication():
    breakdown = TimeBreakdown(start_time=time.time())
    no_state = (None, None, None)
    breakdown.on_train_begin(*no_state)
    forward_backward = breakdown.timers("forward-backward")
    forward_backward.start()
    time.sleep(0.3)
    breakdown.on_collective(0.2)  # a TP all-reduce of the forward, timed by the counter
    forward_backward.stop()
    breakdown.on_collective(5.0)  # outside every step phase: a log record's collective, stays in "other"
    breakdown.timers("optimizer-step").start()
    time.sleep(0.1)
    breakdown.on_collective(0.05)  # a sharding broadcast of the updated parameters
    breakdown.timers("optimizer-step").stop()
    breakdown.on_step_end(*no_state)
    record = breakdown.interval_record()
    assert record["time_communication"] == pytest.approx(0.25, abs=0.01)  # + the empty all-reduce timer: none
    assert 0.3 - 0.2 <= record["time_forward_backward"] < 0.3 - 0.2 + 0.1
    assert 0.1 - 0.05 <= record["time_optimizer"] < 0.1 - 0.05 + 0.1


def test_stage2_pads_each_gradient_buffer_to_the_largest_rank(monkeypatch):
    # 2 ranks, fp32, 4096-byte (1024-element) alignment: paddle's model-order greedy gives rank 0 tensors
    # 0 and 3 (1000 + 10), rank 1 tensors 1 and 2 (600 + 500); padded: 1024 + 1024 and 1024 + 1024
    tensors = (1000, 600, 500, 10)
    reduced, broadcast = stage2_buffers(tensors, 2, 4, 4096)
    assert broadcast == 4 * 1024  # every rank's padded parameter buffer
    assert reduced == 2 * 2048  # each rank's gradient buffer is the largest rank's size, reduced whole
    assert stage2_buffers((3000, 10), 2, 4, 4096) == (2 * 3072, 3072 + 1024)  # the small rank's buffer is 3072 too
    # a buffer cap (STAGE2_BUFFER_MAX) below a padded tensor: that gradient is reduced alone, unpadded, and a
    # rank whose buffer holds nothing reduces no buffer
    monkeypatch.setattr(parameters, "STAGE2_BUFFER_MAX", 2048)
    assert stage2_buffers((3000, 10), 2, 4, 4096) == (2048 + 3000, 3072 + 1024)
