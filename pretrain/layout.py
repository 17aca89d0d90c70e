"""The hybrid-parallel layout of a run: how its cards split into tensor, pipeline, sharding and data groups.

paddlenlp's ``TrainingArguments.__post_init__`` derives the degrees from the launcher's world size
(``paddle.distributed.get_world_size()``): sharding degree = world / (tensor x pipeline x sep x
context) when ``sharding`` is set and the degree is -1, data degree = what is left, and sharding is
dropped when its degree is 1. Without a launcher (one process) it resets every degree to -1 on
purpose, so a multi-card config parses on one card but says nothing about the cluster.

``simulated_launch(nnodes, nproc_per_node)`` runs that same paddlenlp code as
``python -m paddle.distributed.launch`` on ``nnodes x nproc_per_node`` cards would, without creating
a process group (``fleet.init`` and ``init_parallel_env`` do nothing) or touching a GPU: the forecast
(``tools/plan.py``) and the planner read a config's real layout on a laptop this way, and paddlenlp's
validation of the fleet strategy (``sharding_parallel_config``, ``tensor_parallel_config`` and
``pipeline_parallel_config`` values, ``split_param`` needing ``amp_master_grad``...) runs as on the cluster.

Usage::

    with simulated_launch(nnodes=1, nproc_per_node=8):
        model_args, data_args, training_args = parse_arguments(["config/llama/pretrain_argument.json"])
        layout = ParallelLayout.from_arguments(training_args, nnodes=1)
"""

from __future__ import annotations

import logging
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass
from unittest import mock

import paddle.distributed
from paddle.distributed import fleet

from pretrain.enums import plain
from pretrain.errors import UserError

SHARDING_STAGES = ("stage1", "stage2", "stage3")


def sharding_options(sharding) -> list:
    """The option names of paddlenlp's ``sharding`` argument, e.g. ``["stage2", "offload"]``.

    Args:
        sharding: the parsed list of ``ShardingOption`` (e.g. ``[stage2, offload]``) or the raw
            string (``"stage2 offload"``).
    """
    return sharding.split() if isinstance(sharding, str) else [str(plain(s)) for s in sharding]


def sharding_stage(sharding) -> int:
    """The ZeRO stage of paddlenlp's ``sharding`` argument (as ``sharding_options`` takes it): 0 (none), 1, 2 or 3."""
    stages = [int(option[len("stage") :]) for option in sharding_options(sharding) if option in SHARDING_STAGES]
    return stages[0] if stages else 0


@dataclass(frozen=True)
class ParallelLayout:
    """Degrees of every parallel dimension of a run (1 when unused); their product is ``world_size``.

    ``sharding_stage`` is the stage the config asks for, also when paddlenlp drops sharding because
    its degree is 1 (the published ``...SH1SP1`` cases); memory is sharded only when the degree is > 1.
    """

    world_size: int  # cards (processes), every parallel dimension
    nnodes: int  # machines the cards span
    tensor_parallel_degree: int = 1
    pipeline_parallel_degree: int = 1
    virtual_pp_degree: int = 1  # interleaved virtual stages per pipeline rank
    sharding_stage: int = 0  # 0 none, 1 optimizer states, 2 + gradients, 3 + parameters
    sharding_parallel_degree: int = 1
    data_parallel_degree: int = 1
    sep_parallel_degree: int = 1
    context_parallel_degree: int = 1
    sequence_parallel: bool = False

    @property
    def dataset_world_size(self) -> int:
        """Ranks that read distinct samples: data x sharding degree (tensor and pipeline ranks share them)."""
        return self.data_parallel_degree * self.sharding_parallel_degree

    def global_batch_samples(self, micro_batch_size: int, gradient_accumulation_steps: int) -> int:
        """Samples one optimizer step consumes across all cards: micro batch x accumulation x dataset_world_size."""
        return micro_batch_size * gradient_accumulation_steps * self.dataset_world_size

    @property
    def nproc_per_node(self) -> int:
        return self.world_size // self.nnodes

    @property
    def name(self) -> str:
        """The published tables' strategy name ``TP{t}PP{p}SH{stage}SP{sharding degree}``, plus ``DP{d}``."""
        return (
            f"TP{self.tensor_parallel_degree}PP{self.pipeline_parallel_degree}"
            f"SH{self.sharding_stage}SP{self.sharding_parallel_degree}DP{self.data_parallel_degree}"
        )

    @classmethod
    def from_arguments(cls, training_args, nnodes: int) -> ParallelLayout:
        """The layout paddlenlp resolved into ``training_args`` (call inside ``simulated_launch`` for a
        simulated cluster: outside it a single process reports world size 1).

        Args:
            training_args: parsed ``PreTrainingArguments``.
            nnodes: machines the run spans (``PADDLE_NNODES`` under a real launch).
        """

        def degree(name: str) -> int:
            return max(int(getattr(training_args, name, 1) or 1), 1)

        world_size = paddle.distributed.get_world_size() if training_args.local_rank != -1 else 1
        return cls(
            world_size=world_size,
            nnodes=nnodes,
            tensor_parallel_degree=degree("tensor_parallel_degree"),
            pipeline_parallel_degree=degree("pipeline_parallel_degree"),
            virtual_pp_degree=degree("virtual_pp_degree"),
            sharding_stage=sharding_stage(getattr(training_args, "sharding_configured", training_args.sharding)),
            sharding_parallel_degree=degree("sharding_parallel_degree"),
            data_parallel_degree=degree("data_parallel_degree") if training_args.use_hybrid_parallel else world_size,
            sep_parallel_degree=degree("sep_parallel_degree"),
            context_parallel_degree=degree("context_parallel_degree"),
            sequence_parallel=bool(training_args.sequence_parallel),
        )


MODEL_PARALLEL_DEGREES = (
    "tensor_parallel_degree",
    "pipeline_parallel_degree",
    "sep_parallel_degree",
    "context_parallel_degree",
)


def _model_parallel_degrees(training_args) -> dict:
    """``{name: degree}`` of the dimensions that split one model replica (unset counts as 1)."""
    return {name: max(int(getattr(training_args, name, 1) or 1), 1) for name in MODEL_PARALLEL_DEGREES}


def check_degrees_divide_the_cards(training_args) -> None:
    """Refuse a launch whose cards do not split into whole model replicas, before paddlenlp's
    ``TrainingArguments.__post_init__`` (which asserts it for tensor x pipeline only, in its own
    words, and otherwise floors the data-parallel degree). A single process is always fine.

    Raises:
        UserError: tensor x pipeline x sep x context does not divide the world size (the message
            names the degrees, the card count and card counts that work).
    """
    world_size = paddle.distributed.get_world_size()
    degrees = _model_parallel_degrees(training_args)
    product = math.prod(degrees.values())
    if world_size <= 1 or world_size % product == 0:
        return
    named = " x ".join(f"{name} {degree}" for name, degree in degrees.items() if degree > 1)
    multiples = sorted({max(world_size // product, 1) * product, (world_size // product + 1) * product})
    raise UserError(
        f"{named} splits each model replica over {product} cards, which do not divide the {world_size} cards of "
        f"the launch; launch on a multiple of {product} cards (e.g. {' or '.join(map(str, multiples))}) or "
        f"choose degrees whose product divides {world_size}"
    )


def accumulation_for_global_batch(global_batch_size: int, micro_batch_size: int, training_args) -> int:
    """Gradient accumulation steps that give ``global_batch_size`` samples per optimizer step on the cards
    of this launch (``paddle.distributed.get_world_size()``, also inside ``simulated_launch``).

    The data-parallel ranks (those reading distinct samples: data x sharding degree) are the cards
    over tensor x pipeline x sep x context degrees, as paddlenlp's ``TrainingArguments.__post_init__``
    derives them from the world size; a single process is one. accumulation = global batch /
    (micro batch x data-parallel ranks), the global batch of ``ParallelLayout.global_batch_samples``.

    Args:
        global_batch_size: samples per optimizer step, over all cards (``global_batch_size`` key).
        micro_batch_size: ``per_device_train_batch_size`` (samples).
        training_args: the arguments being parsed (their parallel degrees, before paddlenlp resolves them).

    Raises:
        UserError: no whole number of accumulation steps reaches the global batch on this card count
            (the message lists card counts that do).
    """
    world_size = paddle.distributed.get_world_size()
    model_parallel = math.prod(_model_parallel_degrees(training_args).values())
    if world_size <= 1:
        world_size = model_parallel = 1  # paddlenlp resets every degree in a single process
    replicas = world_size // model_parallel  # a world size they do not divide: check_degrees_divide_the_cards
    per_step = micro_batch_size * max(replicas, 1)
    if global_batch_size % per_step == 0:
        return global_batch_size // per_step
    if global_batch_size % micro_batch_size:
        fix = f"per_device_train_batch_size {micro_batch_size} does not divide it: change one of them"
    else:
        samples_per_card = global_batch_size // micro_batch_size
        cards = [d * model_parallel for d in range(1, samples_per_card + 1) if samples_per_card % d == 0]
        near = sorted(cards, key=lambda c: abs(c - world_size))[:4]
        fix = (
            f"use a card count whose data-parallel ranks (cards / {model_parallel} for tensor x pipeline x "
            f"sep x context) x per_device_train_batch_size {micro_batch_size} divide it, e.g. "
            f"{', '.join(map(str, sorted(near)))} cards"
        )
    raise UserError(
        f"global_batch_size {global_batch_size} cannot be reached on {world_size} card(s): {max(replicas, 1)} "
        f"data-parallel ranks x micro batch {micro_batch_size} = {per_step} samples per accumulation step; {fix}"
    )


def runs_on_gpu(training_args) -> bool:
    """Whether this process trains on a GPU: a CUDA build of paddle and ``device`` not cpu."""
    return training_args.device != "cpu" and paddle.is_compiled_with_cuda()


def install_cpu_group_stores() -> bool:
    """On a CPU build of paddle launched with several processes, give every gloo process group a
    rendezvous store of its own (``pretrain.cpu_comm.groups``: paddle's gloo groups of different
    members collide in the job's store); whether it did. Call before ``fleet.init`` (``parse_arguments``)."""
    if paddle.is_compiled_with_cuda() or int(os.environ.get("PADDLE_TRAINERS_NUM", "1")) <= 1:
        return False
    from pretrain.cpu_comm.groups import install_group_stores  # here: GPU runs never import it

    install_group_stores()
    return True


def install_cpu_communication(training_args) -> bool:
    """On a CPU run with tensor or pipeline parallelism, install ``pretrain.cpu_comm`` (gloo versions
    of what those layers need from NCCL); whether it did. Only such runs import the package.

    Call after paddlenlp's ``fleet.init`` (``parse_arguments``) and before the model is built; collective
    under pipeline parallelism (every rank must call it).
    """
    degrees = (training_args.tensor_parallel_degree, training_args.pipeline_parallel_degree)
    if runs_on_gpu(training_args) or max(degrees) <= 1:
        return False
    from pretrain.cpu_comm import install  # here: GPU runs never import it

    install(fleet.get_hybrid_communicate_group())
    return True


def launched_nnodes() -> int:
    """Machines of this run as ``paddle.distributed.launch`` sets them (``PADDLE_NNODES``); 1 without a launcher."""
    return int(os.environ.get("PADDLE_NNODES", "1") or 1)


@contextmanager
def simulated_launch(nnodes: int, nproc_per_node: int):
    """Within this context paddlenlp's argument parsing resolves degrees as on ``nnodes x nproc_per_node`` cards.

    It answers ``paddle.distributed.get_world_size()`` with the card count, makes ``fleet.init``
    and ``paddle.distributed.init_parallel_env`` do nothing (``TrainingArguments`` builds and
    checks its ``fleet`` strategy as on the cluster, but starts no process group) and sets
    ``PADDLE_RANK_IN_NODE=0`` (this process plays global rank 0).

    Raises:
        ValueError: ``nnodes`` or ``nproc_per_node`` is < 1.
    """
    if nnodes < 1 or nproc_per_node < 1:
        raise ValueError(f"nnodes ({nnodes}) and nproc_per_node ({nproc_per_node}) must be >= 1")
    world_size = nnodes * nproc_per_node
    environment = {"PADDLE_RANK_IN_NODE": "0", "PADDLE_NNODES": str(nnodes), "PADDLE_LOCAL_SIZE": str(nproc_per_node)}
    with mock.patch.dict(os.environ, environment), mock.patch.object(fleet, "init"), _info_muted(STRATEGY_LOGGERS):
        with mock.patch.object(paddle.distributed, "init_parallel_env"):
            with mock.patch.object(paddle.distributed, "get_world_size", return_value=world_size):
                yield


# Loggers that print the fleet strategy paddlenlp builds (a 150-line table, then "distributed strategy
# initialized"): on a real launch, part of its start-up log; in a simulated one, noise.
STRATEGY_LOGGERS = ("PaddleNLP", "paddle.distributed.fleet.utils.log_util")


@contextmanager
def _info_muted(names):
    """Within this context the named loggers pass warnings and errors only."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [each.level for each in loggers]
    for each in loggers:
        each.setLevel(max(each.level, logging.WARNING))
    try:
        yield
    finally:
        for each, level in zip(loggers, levels):
            each.setLevel(level)
