"""The optimizer as paddle and paddlenlp wrap it for a layout: what each rank's optimizer holds, and the two
changes the pretraining trainer makes to the optimizer paddlenlp creates.

- ``wrapped_optimizers``: the chain of wrappers (fleet's, sharding's) down to the optimizer that updates.
- ``own_parameters``: the parameters whose Adam moments (and master weights) this rank creates and saves.
- ``held_elements``: the parameter and optimizer-state elements this rank holds, counted on the live tensors.
- ``adapt_created_optimizer``: the weight-decay rule decided as in one process (pipeline names, sharding
  stage3's slice names) and, under expert parallelism, the clip by the norm over every rank's experts.
- ``create_own_moments``: Adam's moments created at their initial values (checkpoint-0 of a rollback run).
"""

from __future__ import annotations

from typing import Optional

import paddle
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_optimizer_stage2 import GroupShardedOptimizerStage2

from pretrain.compat import moe as moe_compat
from pretrain.model import weight_decay_rule
from pretrain.upstream import verified

STAGE3_SLICE_PREFIX = "slice@"  # paddle's GroupShardedStage3 names a parameter's slice "slice@<name>"


def wrapped_optimizers(optimizer) -> list:
    """``optimizer`` and the optimizers it wraps, outermost first, through fleet's ``_inner_opt`` and the
    group-sharded ``_optim`` links (paddlenlp's ``unwrap_optimizer`` walk). Stops at a self-link: paddle 3.3.1's
    sharding stage3 marks the optimizer it wraps with ``optimizer._optim = optimizer`` (``_OptimizerWrapper``),
    on which paddlenlp 3.0.0b4's ``unwrap_optimizer`` loops for ever."""
    chain = [optimizer]
    while True:
        current = chain[-1]
        inner = getattr(current, "_inner_opt", None) or getattr(current, "_optim", None)
        if inner is None or any(inner is seen for seen in chain):
            return chain
        chain.append(inner)


def expert_parallel_clip_of(optimizer) -> Optional[moe_compat.ExpertParallelClip]:
    """The innermost optimizer's clip when it is ``adapt_created_optimizer``'s ``ExpertParallelClip``, else None."""
    clip = getattr(wrapped_optimizers(optimizer)[-1], "_grad_clip", None)
    return clip if isinstance(clip, moe_compat.ExpertParallelClip) else None


def own_parameters(optimizer) -> list:
    """The parameters whose Adam moments (and master weights) this rank's optimizer creates, updates and saves.

    The innermost optimizer's list: every parameter without sharding, this rank's part under sharding stage1
    (paddle's ``DygraphShardingOptimizer`` narrows that list) and stage3 (its slices). Under stage2, paddle's
    ``GroupShardedOptimizerStage2`` leaves every parameter there and updates only those its ``param2rank``
    assigns to its rank in the sharding group (``_rank``): those.

    Args:
        optimizer: the trainer's optimizer, as wrapped for its layout.
    Returns:
        The parameters (paddle Parameters), in the innermost optimizer's order.
    """
    chain = wrapped_optimizers(optimizer)
    parameters = list(chain[-1]._parameter_list)
    stage2 = next((o for o in chain if isinstance(o, GroupShardedOptimizerStage2)), None)
    if stage2 is None:
        return parameters
    return [p for p in parameters if stage2.param2rank[p.name] == stage2._rank]


MOMENTS = ("moment1", "moment2")  # paddle AdamW's accumulator names (optimizer/adamw.py:173)


def held_elements(model, optimizer) -> tuple:
    """``(parameter elements, optimizer-state elements)`` this rank holds, counted on the live tensors: what the
    planner's per-rank figures say (``pretrain.planner.parameters.held_elements``).

    - parameters: every model parameter that holds memory here; under sharding stage3 a parameter paddle sliced
      (``GroupShardedStage3._param_storage``: ``param._clear_data()``, this rank's part in ``fw_storage``) counts
      its slice.
    - optimizer states: Adam's two moments (``MOMENTS``) and the float32 master weights (``_master_weights``) of
      the optimizer that updates (``wrapped_optimizers``); the one-element beta-power accumulators are left out,
      as the planner leaves them. 0 before the first step creates them.
    """
    parameters = 0
    for parameter in model.parameters():
        part = parameter if parameter._is_initialized() else getattr(parameter, "fw_storage", None)
        parameters += int(part._numel()) if part is not None and part._is_initialized() else 0
    inner = wrapped_optimizers(optimizer)[-1]
    accumulators = getattr(inner, "_accumulators", {})
    states = sum(int(t._numel()) for name in MOMENTS for t in accumulators.get(name, {}).values())
    states += sum(int(t._numel()) for t in getattr(inner, "_master_weights", {}).values())
    return parameters, states


def adapt_created_optimizer(optimizer, model, max_grad_norm: float) -> None:
    """Change the optimizer paddlenlp's ``Trainer.create_optimizer`` just created (call once, on every rank).

    - Its weight-decay rule decided as in one process, normalisation layers exempt whatever their names
      (``pretrain.model.weight_decay_rule``; a pipeline model on its single-model names). Sharding stage3:
      paddle 3.3.1's ``GroupShardedStage3`` hands the optimizer each sliced parameter (those above its
      ``segment_size``, 2**20 elements: the embeddings and LM head first) as a new tensor named
      ``slice@<name>`` (``_TensorWrapper``); paddlenlp 3.0.0b4's rule (``name in decay_parameters``,
      ``Trainer.create_optimizer``) does not find those names, so they trained without weight decay.
    - Under expert parallelism its gradients clipped by the norm over every rank's experts and shards
      (``pretrain.compat.moe.expert_parallel_clip``; ``max_grad_norm``: the clip's global norm).
    """
    verified("stage3-weight-decay-and-expert-parallel-clip")  # applied on any version: at most a warning
    inner = wrapped_optimizers(optimizer)[-1]  # inside fleet's wrappers
    if inner._apply_decay_param_fun is not None:  # paddlenlp's name rule (no optimizer_grouped_parameters)
        decays = weight_decay_rule(model)
        inner._apply_decay_param_fun = lambda name: decays(name.removeprefix(STAGE3_SLICE_PREFIX))
    expert_clip = moe_compat.expert_parallel_clip(model, max_grad_norm)
    if expert_clip is not None:
        inner._grad_clip = expert_clip


def create_own_moments(optimizer) -> None:
    """Create Adam's moments and beta powers (and master weights) now, at their initial values and with the
    names later checkpoints use, for the parameters this rank's optimizer updates (``own_parameters``).

    paddle creates them at the first step; created before it, they are in checkpoint-0 for a rollback to load.
    Only this rank's own, or a rollback's load would miss the others and each shard would hold them all, never
    freed."""
    trained = [p for p in own_parameters(optimizer) if not p.stop_gradient]
    wrapped_optimizers(optimizer)[-1]._create_accumulators(paddle.static.default_main_program().global_block(), trained)


def restore_stage2_views(optimizer) -> int:
    """Make every parameter sharding stage2 fused into its ``ParamStorage`` a view of that storage again, with the
    values the parameter holds now; the number of parameters re-viewed (0: not stage2).

    Stage2's optimizer updates its own slice of each storage buffer and broadcasts the buffers after every step
    (paddle ``group_sharded_optimizer_stage2.py`` ``_broadcast_params``, ``group_sharded_storage.py``
    ``_convert_buffer``). paddlenlp's unified checkpoint load (``unified_checkpoint/load_local.py:134``
    ``faster_set_state_dict``, ``transformers/model_utils.py:843``) points each parameter at the memory it read
    instead of copying into the parameter's: after a rollback within the run the parameters no longer share the
    buffers, so every step after it broadcasts the abandoned weights and each rank trains the others' parameters
    as they were at the rollback (measured: llama debug, sharding stage2 x2, final weights 2e-2 of scale off)."""
    restored = 0
    if not verified("stage2-views-after-unified-load"):  # "warn": applied on other versions too, with a warning
        return restored
    for sharded in wrapped_optimizers(optimizer):
        for per_rank in getattr(sharded, "param_storages", {}).values():
            for storage in per_rank.values():
                start = 0
                with paddle.no_grad():
                    for parameter in storage._params:
                        end = start + parameter._numel()
                        storage.buffer._slice(start, end).set_value(parameter.flatten())
                        start = end + storage.param2align[parameter.name]
                storage._array_params()
                restored += len(storage._params)
    return restored
