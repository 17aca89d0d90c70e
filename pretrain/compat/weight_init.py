"""paddlenlp 3.0.0b4 initialises two families' weights other than their own code does: a model of those types built
from scratch is drawn again (``redraw``), after paddlenlp's ``_init_weights`` ran.

- **DeepSeek-V2 and V3.** ``DeepseekV2PretrainedModel._init_weights`` (deepseek_v2/modeling.py line 1395) returns on
  its first line: the linear layers keep paddle's Xavier default and the routers ``Constant(1.0)``.
  transformers' ``DeepseekV2PreTrainedModel._init_weights`` draws every matrix from normal(0, initializer_range).
- **QWen v1.** In ``QWenPretrainedModel._init_weights`` (qwen/modeling.py lines 729-742) the ``else`` that draws
  normal(0, initializer_range) belongs to ``isinstance(module.weight, paddle.Tensor)`` (always true), not to
  ``is_distributed``: only a tensor-parallel slice is drawn. In one process every matrix kept paddle's Xavier
  default (measured on qwen-debug: c_attn std 0.0442, w1 and w2 0.0457, wte and lm_head 0.0155), under tensor
  parallelism the split ones got 0.02, and the two drew other models. The ``c_proj`` projections (attention and
  MLP output), redrawn after it with std initializer_range / sqrt(2 x num_hidden_layers), came from the global
  generator on every rank, so their row-parallel slices were identical on all tensor-parallel ranks. QWen's
  released modeling_qwen.py (``QWenPreTrainedModel._init_weights``) draws every linear layer and embedding from
  normal(0, initializer_range), then the ``c_proj`` weights with that scale.

A tensor-parallel slice (``is_distributed``) is drawn from fleet's model-parallel generator, as paddlenlp's
``LlamaPretrainedModel._init_weights`` draws it (``get_rng_state_tracker().rng_state()``, seeded per
tensor-parallel rank by ``model_parallel_random_seed``, llama/modeling.py line 1498): the global generator is
seeded alike on every tensor-parallel rank (``trainer_utils._get_distributed_seeds``: ``global_seed`` has no mp
term), so a slice drawn from it is the same on every rank (DeepSeek-V2 before this: 67 of its 69 matrices identical
on both ranks of TP2, the model trained at 1/tp of its width). Replicated matrices come from the global generator,
the same on every tensor-parallel rank.

Which types, and which of their matrices are scaled by depth: ``registry.Implementation.init_weights``
(``WeightInit``); ``pretrain.model`` calls ``redraw`` for a model built from scratch.
"""

from __future__ import annotations

import contextlib
import math

import paddle
from paddle.distributed.fleet.meta_parallel import get_rng_state_tracker

from pretrain.upstream import verified


def redraw(model: paddle.nn.Layer, config, depth_scaled: tuple = ()) -> int:
    """Draw every weight matrix of ``model`` (every parameter with 2 dimensions: linear layers, embeddings, the LM
    head, routers) from normal(0, ``config.initializer_range``), in place, those whose names end with one of
    ``depth_scaled`` with std initializer_range / sqrt(2 x ``config.num_hidden_layers``); vectors (norms,
    biases) are left as built. The number of matrices drawn (0 on another paddlenlp than the ledger's, where
    ``pretrain.upstream.verified`` leaves the upstream initialisation alone)."""
    if not verified("weight-init"):
        return 0
    matrices = [(name, param) for name, param in model.named_parameters() if len(param.shape) == 2]
    depth_std = config.initializer_range / math.sqrt(2 * config.num_hidden_layers)
    with paddle.no_grad():
        for name, param in matrices:
            std = depth_std if name.endswith(depth_scaled) else config.initializer_range
            with get_rng_state_tracker().rng_state() if param.is_distributed else contextlib.nullcontext():
                param.set_value(paddle.normal(0.0, std, param.shape).cast(param.dtype))
    return len(matrices)
