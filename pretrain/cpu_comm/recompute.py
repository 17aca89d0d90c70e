"""The pipeline layer's recompute on CPU.

paddle 3.3.1's ``PipelineLayer.forward`` recomputes each run of ``recompute_interval`` layers with
``recompute_hybrid`` (``fleet/meta_parallel/parallel_layers/pp_layers.py:1195``), whose forward asserts a GPU, XPU
or custom device before it saves the random states (``fleet/recompute/recompute_hybrid.py:136``: "Recompute with
RNG is not support current device: cpu"). paddlenlp 3.0.0b4's QWen pipeline sets that interval under full
recompute (``qwen/modeling_pp.py:192``); LLaMA's, Qwen2's and GPT's recompute inside their layers and set none.

``recompute_segment`` keeps recompute_hybrid's contract on CPU: the segment runs under paddle's reentrant
``fleet.utils.recompute`` (a PyLayer that runs it without a graph and again in the backward, as
``_HPRecomputeFunction`` does, restoring the same random states: the generator's, fleet's model-parallel tracker's,
numpy's and Python's; paddle's own code reads the CPU generator's there), and outputs that are not floating point
stop gradients, as recompute_hybrid marks them. Its ``offload`` and ``partition`` (activations moved to the host or
split over the tensor-parallel group) are refused: no paddlenlp pipeline sets them. On GPU, recompute_hybrid
receives the same segments (``ctx``: the pipeline's ``recompute_ctx``, offload and partition False).
"""

from __future__ import annotations

import paddle
from paddle.distributed.fleet.meta_parallel.parallel_layers import pp_layers
from paddle.distributed.fleet.meta_parallel.pp_utils.utils import is_float_tensor
from paddle.distributed.fleet.utils import recompute

from pretrain.upstream import verified


def recompute_segment(ctx: dict, function, *args, **kwargs):
    """``recompute_hybrid(ctx, function, *args, **kwargs)`` on a CPU place: ``function``'s outputs (a tensor, or a
    tuple whose non-floating-point tensors stop gradients), its activations recomputed in the backward.

    Raises:
        NotImplementedError: ``ctx`` asks for offload or partition.
    """
    if ctx.get("offload", False) or ctx.get("partition", False):
        raise NotImplementedError("the CPU pipeline recompute has no activation offload or partition")
    outputs = recompute(function, *args, preserve_rng_state=True, use_reentrant=True, **kwargs)
    if paddle.is_tensor(outputs):
        return outputs
    for output in outputs:
        if paddle.is_tensor(output) and not is_float_tensor(output):
            output.stop_gradient = True
    return tuple(outputs)


def install_recompute() -> None:
    """Make ``PipelineLayer`` recompute through ``recompute_segment`` (idempotent).

    Raises:
        UserError: paddle or paddlenlp is not the ledger's (``pretrain.upstream``).
    """
    verified("cpu-pipeline-recompute")
    pp_layers.recompute_hybrid = recompute_segment
