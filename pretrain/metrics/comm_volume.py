"""What each rank's collectives and point-to-point transfers move per optimizer step, and the time they take
(CPU processes on gloo, paddle 3.3.1).

``install_counter`` wraps every data-moving method of paddle's ``core.ProcessGroupGloo`` (all_reduce,
broadcast, reduce, all_gather, all_gather_into_tensor, reduce_scatter, all_to_all, gather, scatter,
send, recv and their variants, ``pretrain.cpu_comm``'s replacements included): each call adds its
payload to ``COUNTER`` under its group kind and collective, and its duration to ``COUNTER.seconds``.
paddle's hybrid-parallel layers, its pipeline P2P, its sharding optimizers and paddlenlp reach gloo
through these Python methods, so they are all counted; paddle.DataParallel's gradient all-reduce
(``EagerReducer``, called from C++) is not.

Payload ("bytes"): per call on this rank, the bytes of the largest tensor argument (lists summed):
the reduced or broadcast tensor, the gathered output, the full input of a reduce-scatter, the tensor
sent or received. It is the logical payload of the collective (what the model asks to move), not what
an algorithm puts on the wire (a ring all-reduce sends 2(k-1)/k of it; ``pretrain.cpu_comm``'s
reduce-scatter, an all-reduce of the whole input, more): the planner's time model applies those
factors to the same payload (``pretrain.planner.communication``). A call within a counted call (a
replacement built from another collective) adds nothing; a group of one rank moves nothing and
counts nothing.

Group kind: ``mp``, ``pp`` (the pipe group and ``pretrain.cpu_comm.pipeline``'s pair groups),
``dp``, ``sharding``, ``sep``, ``check`` (fleet's groups, by ``HybridCommunicateGroup``), ``world``
(every rank: the app's own agreement and monitoring collectives) and ``other``.

Time: on CPU a gloo call returns when its data has moved, so ``COUNTER.seconds`` is the time the
process spent communicating (waiting for slower peers included). ``COUNTER.listener`` (the run's
``TimeBreakdown``) is told each call's seconds, to move them into the ``communication`` phase. GPU runs
never install the counter: NCCL calls are asynchronous and return before the transfer ends, so a
host clock around them would measure the launch only.

``CommunicationVolume`` (a Trainer callback) records the payload per optimizer step and writes
``comm_volume_rank<r>.json`` into output_dir at the end of training (the steps this process trained: a
resumed run's file holds its own attempt). The planner's figure for the same layout is
``pretrain.planner.estimate.communication_volume``.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import defaultdict
from typing import Callable, Optional

from paddlenlp.trainer import TrainerCallback

from pretrain.atomic import write_json
from pretrain.upstream import verified

FILE_PATTERN = "comm_volume_rank{rank}.json"
DEFINITION = (
    "payload bytes per optimizer step on this rank, by group kind and collective: per call the largest tensor "
    "argument (the reduced/broadcast tensor, the gathered output, the reduce-scatter input, the tensor sent or "
    "received); not the bytes an algorithm puts on the wire (pretrain.metrics.comm_volume)"
)
# ProcessGroup methods that move data (paddle 3.3.1 pybind names; the *_on_calc_stream variants call
# these on gloo once pretrain.cpu_comm is installed, and fail before moving anything otherwise)
COUNTED_METHODS = (
    "all_reduce",
    "allreduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_tensor",
    "all_to_all_single",
    "alltoall",
    "alltoall_single",
    "gather",
    "scatter",
    "scatter_tensor",
    "send",
    "recv",
)
# method -> the collective it counts as
COLLECTIVE = {
    "allreduce": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all_tensor": "all_to_all",
    "all_to_all_single": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_single": "all_to_all",
    "scatter_tensor": "scatter",
}
GROUP_KINDS = ("mp", "pp", "dp", "sharding", "sep", "check", "world", "other")


def tensor_bytes(value) -> int:
    """Bytes of a paddle Tensor (numel x element size), or the sum over a list/tuple of them; 0 otherwise."""
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(item) for item in value)
    if hasattr(value, "element_size") and hasattr(value, "shape"):
        numel = 1
        for size in value.shape:
            numel *= size
        return numel * value.element_size()
    return 0


class CollectiveCounter:
    """Payload bytes and calls per (group kind, collective) since the process began, and seconds inside
    collectives (see the module docstring)."""

    def __init__(self):
        self.bytes: dict = defaultdict(int)  # (kind, collective) -> bytes
        self.calls: dict = defaultdict(int)  # (kind, collective) -> calls
        self.seconds = 0.0
        self.installed = False
        self.listener: Optional[Callable[[float], None]] = None  # told each outermost call's seconds
        self._kinds: dict = {}  # id(process group) -> kind
        self._depth = threading.local()

    def snapshot(self) -> dict:
        """``{kind: {collective: bytes}}`` so far."""
        nested: dict = {}
        for (kind, collective), nbytes in sorted(self.bytes.items()):
            nested.setdefault(kind, {})[collective] = nbytes
        return nested

    def kind_of(self, process_group) -> str:
        """The kind (GROUP_KINDS) of a paddle ProcessGroup, from fleet's hybrid groups and the group's ranks."""
        key = id(process_group)
        if key not in self._kinds:
            self._kinds = group_kinds()
        return self._kinds.get(key, "other")

    def count(self, method: str, process_group, args: tuple, call: Callable):
        """Run ``call()`` (one ProcessGroup ``method`` with ``args``), counting it if it is the outermost."""
        depth = getattr(self._depth, "value", 0)
        if depth or process_group.size() <= 1:
            return call()
        self._depth.value = 1
        start = time.perf_counter()
        try:
            return call()
        finally:
            self._depth.value = 0
            seconds = time.perf_counter() - start
            key = (self.kind_of(process_group), COLLECTIVE.get(method, method))
            self.bytes[key] += max((tensor_bytes(arg) for arg in args), default=0)
            self.calls[key] += 1
            self.seconds += seconds
            if self.listener is not None:
                self.listener(seconds)


COUNTER = CollectiveCounter()


def group_kinds() -> dict:
    """``{id(process group): kind}`` of every group paddle has created in this process: fleet's hybrid
    groups by identity, a group inside this rank's pipe group (a pair group) ``pp``, every rank ``world``."""
    from paddle.distributed import collective, fleet

    hcg = getattr(fleet.fleet, "_hcg", None)
    named = {}
    if hcg is not None:
        getters = {
            "mp": hcg.get_model_parallel_group,
            "pp": hcg.get_pipe_parallel_group,
            "dp": hcg.get_data_parallel_group,
            "sharding": hcg.get_sharding_parallel_group,
            "sep": hcg.get_sep_parallel_group if getattr(hcg, "_sep_degree", 1) > 1 else None,  # asserts without
            "check": hcg.get_check_parallel_group,
        }
        for kind, getter in getters.items():
            group = getter() if getter is not None else None
            if group is not None and group.process_group is not None:
                named.setdefault(id(group.process_group), kind)
    pipe = set(hcg.get_pipe_parallel_group().ranks) if hcg is not None else set()
    world = collective._get_global_env().world_size
    kinds = {}
    for group in collective._get_group_map().values():
        process_group = getattr(group, "process_group", None)
        if process_group is None:
            continue
        ranks = set(group.ranks)
        if id(process_group) in named:
            kinds[id(process_group)] = named[id(process_group)]
        elif len(ranks) == world:
            kinds[id(process_group)] = "world"
        elif len(ranks) > 1 and ranks <= pipe:
            kinds[id(process_group)] = "pp"
    return kinds


def _counted(method: str, original: Callable) -> Callable:
    def counted(self, *args, **kwargs):
        return COUNTER.count(method, self, args + tuple(kwargs.values()), lambda: original(self, *args, **kwargs))

    counted.__name__ = method
    counted.__doc__ = f"paddle's ProcessGroupGloo.{method}, counted by pretrain.metrics.comm_volume."
    counted.counts = True  # type: ignore[attr-defined]
    return counted


def install_counter(training_args) -> bool:
    """On a CPU run of several processes, count every gloo collective (see the module docstring); whether
    it did. Call after ``pretrain.layout.install_cpu_communication`` (which replaces some of the methods
    counted here); idempotent."""
    from paddle.base import core

    from pretrain.layout import runs_on_gpu

    if runs_on_gpu(training_args) or training_args.world_size <= 1 or not verified("collective-byte-counter"):
        return False
    for method in COUNTED_METHODS:
        original = getattr(core.ProcessGroupGloo, method, None)
        if original is not None and not getattr(original, "counts", False):
            setattr(core.ProcessGroupGloo, method, _counted(method, original))
    COUNTER.installed = True
    return True


class CommunicationVolume(TrainerCallback):
    """The payload of each optimizer step (what ``COUNTER`` gained between two step ends), written as
    ``output_dir/comm_volume_rank<r>.json``: ``{"rank", "stage" (pipeline), "definition", "parameter_numel"
    (elements of the parameters this rank holds: its tensor-parallel slices of its pipeline stage), "steps": [{"step",
    "bytes": {kind: {collective: bytes}}, "calls": {...}, "seconds"}]}``. Does nothing when the counter is
    not installed."""

    def __init__(self):
        self.steps: list = []
        self.parameter_numel: Optional[int] = None  # elements of the parameters this rank holds
        self._bytes: dict = {}
        self._calls: dict = {}
        self._seconds = 0.0

    def _mark(self) -> None:
        self._bytes, self._calls, self._seconds = dict(COUNTER.bytes), dict(COUNTER.calls), COUNTER.seconds

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._mark()
        if model is not None:
            # from the shapes: sharding stage3 releases the parameters it does not own (numel() then fails)
            self.parameter_numel = sum(math.prod(parameter.shape) for parameter in model.parameters())

    def on_step_end(self, args, state, control, **kwargs):
        if not COUNTER.installed:
            return
        moved, calls = {}, {}
        for key, total in COUNTER.bytes.items():
            kind, collective = key
            if total > self._bytes.get(key, 0):
                moved.setdefault(kind, {})[collective] = total - self._bytes.get(key, 0)
                calls.setdefault(kind, {})[collective] = COUNTER.calls[key] - self._calls.get(key, 0)
        seconds = COUNTER.seconds - self._seconds
        self.steps.append({"step": state.global_step, "bytes": moved, "calls": calls, "seconds": seconds})
        self._mark()

    def on_train_end(self, args, state, control, **kwargs):
        if not COUNTER.installed:
            return
        record = {"rank": args.process_index, "stage": args.pipeline_parallel_rank, "definition": DEFINITION}
        record["parameter_numel"] = self.parameter_numel
        record["steps"] = self.steps
        write_json(os.path.join(args.output_dir, FILE_PATTERN.format(rank=args.process_index)), record, indent=1)


def read_volume(output_dir: str, rank: int) -> dict:
    """The ``comm_volume_rank<rank>.json`` record a run wrote (see ``CommunicationVolume``)."""
    import json

    with open(os.path.join(output_dir, FILE_PATTERN.format(rank=rank)), encoding="utf-8") as f:
        return json.load(f)
