"""paddlenlp 3.0.0b4's DeepSeek-V2/V3 attention under tensor parallelism: the shared rotary key's gradient.

``DeepseekV2Attention`` (deepseek_v2/modeling.py lines 860-866) keeps ``kv_a_proj_with_mqa`` a plain
``Linear``, replicated on every tensor-parallel rank, and splits the heads. Its output is the compressed
key/value (``kv_lora_rank`` columns, on to ``kv_b_proj``, a ``ColumnParallelLinear`` whose input gradient is
all-reduced over the tensor-parallel group) and ``k_pe`` (the last ``qk_rope_head_dim`` columns), the rotary
key that every head shares: ``forward`` (lines 983-989) expands it over this rank's heads only. Its gradient is
thus the sum over this rank's heads, not all of them, with no all-reduce: under TP2 each rank's
``kv_a_proj_with_mqa`` (and, through it, every layer below) got a different, partial gradient. Measured on
the DeepSeek-V2 debug model from scratch, TP2, one step: ``layers.0.self_attn.kv_a_proj_with_mqa.weight``
differed between the ranks by up to 1.4e-3 (99% of its elements), and the run left one process's.

``sum_rotary_key_gradient`` gives every such layer a forward hook whose output passes through
``_SumRotaryKeyGradient``: the identity forward; backward all-reduces (SUM) the ``k_pe`` columns of the
gradient over the tensor-parallel group, as paddle's ``c_identity`` does for a column-parallel input. Applied
per model (``pretrain.model.build_model``), to paddlenlp 3.0.0b4 only (``upstream.PADDLENLP_VERSION``): a release that
sums the gradient itself would get it twice, so another one is left unpatched with a warning.
"""

from __future__ import annotations

import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer
from paddle.distributed import fleet
from paddlenlp.transformers.deepseek_v2.modeling import DeepseekV2Attention

from pretrain.upstream import verified


class _SumRotaryKeyGradient(PyLayer):
    """Identity forward of ``kv_a_proj_with_mqa``'s output [batch, seq, kv_lora_rank + rope_dim]; backward sums
    the last ``rope_dim`` columns of its gradient over ``group``."""

    @staticmethod
    def forward(ctx, compressed_kv: paddle.Tensor, rope_dim: int, group) -> paddle.Tensor:
        ctx.rope_dim, ctx.group = rope_dim, group
        return compressed_kv.clone()

    @staticmethod
    def backward(ctx, grad: paddle.Tensor) -> paddle.Tensor:
        rotary = grad[..., -ctx.rope_dim :].clone()
        dist.all_reduce(rotary, group=ctx.group)
        return paddle.concat([grad[..., : -ctx.rope_dim], rotary], axis=-1)


def sum_rotary_key_gradient(model: paddle.nn.Layer) -> int:
    """Under tensor parallelism, make the gradient of every ``DeepseekV2Attention``'s shared rotary key the sum
    over all heads (see the module docstring); the number of attention layers fixed (0 for other models, or
    without tensor parallelism)."""
    layers = [layer for layer in model.sublayers() if isinstance(layer, DeepseekV2Attention)]
    if not layers or layers[0].config.tensor_parallel_degree <= 1:
        return 0
    if not verified("deepseek-rope-key-gradient"):
        return 0
    group = fleet.get_hybrid_communicate_group().get_model_parallel_group()
    for layer in layers:
        rope_dim = layer.qk_rope_head_dim

        def hook(_, inputs, output, rope_dim=rope_dim):
            return _SumRotaryKeyGradient.apply(output, rope_dim, group)

        layer.kv_a_proj_with_mqa.register_forward_post_hook(hook)
    return len(layers)
