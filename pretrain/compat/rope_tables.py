"""paddlenlp 3.0.0b4's rotary embeddings keep cos/sin tables for every position the config allows, in each layer.

``LlamaRotaryEmbedding.__init__`` (llama/modeling.py:433, ``_set_cos_sin_cache(seq_len=max_position_embeddings)``)
and its copies in Qwen2 (qwen2/modeling.py:339), Qwen2-MoE (qwen2_moe/modeling.py:376) and Mixtral
(mixtral/modeling.py:394), which our Qwen3 and ERNIE-4.5 attention builds too, compute float32 cos and sin
tables [1, max_position_embeddings, 1, head_dim] when the model is built, one pair per attention layer. Their
``forward`` reads the first ``seq_len`` rows. A run never reads a row at or past its sequence length, yet holds
them all on every card: 2 x 131,072 x 128 x 4 bytes = 128 MiB per layer for Llama 3.1 and Qwen2.5, 4 GiB over
Llama-3.1-8B's 32 layers, 3.5 GiB over ERNIE-4.5-21B-A3B's 28.

``trim`` keeps the rows a run reads (its sequence length): the same values, a copy the size of what is used, and
``max_seq_len_cached`` set to it, so that Qwen2's, Qwen2-MoE's and Mixtral's ``forward`` would rebuild the
tables for a longer sequence as they do past max_position_embeddings (LLaMA's would fail on the shape).
Applied per model (``pretrain.model.build_model``); DeepSeek's tables (built at the first forward for the
sequence) and QWen v1's (for twice it) are already that small and are left alone.
"""

from __future__ import annotations

import paddle
from paddlenlp.transformers.llama.modeling import LlamaRotaryEmbedding
from paddlenlp.transformers.mixtral.modeling import MixtralRotaryEmbedding
from paddlenlp.transformers.qwen2.modeling import Qwen2RotaryEmbedding
from paddlenlp.transformers.qwen2_moe.modeling import Qwen2MoeRotaryEmbedding

from pretrain.upstream import verified

# the classes above (and their subclasses: Llama 3's, the scaled ones); DeepSeek's would keep a trimmed host copy
ROTARY_CLASSES = (LlamaRotaryEmbedding, Qwen2RotaryEmbedding, Qwen2MoeRotaryEmbedding, MixtralRotaryEmbedding)
TABLES = ("cos_cached", "sin_cached")  # [1, positions, 1, rotary dim] float32


def trim(model: paddle.nn.Layer, rows: int) -> int:
    """Cut every sublayer's cos/sin tables of more than ``rows`` positions to their first ``rows``.

    Args:
        model: a built model (any layout: each rank trims its own layers).
        rows: positions to keep, the run's sequence length in tokens (the model config's ``seq_length``).

    Returns:
        The bytes freed (0 on a paddlenlp other than the ledger's, where the tables are left whole).
    """
    if not verified("rope-tables"):
        return 0
    freed = 0
    for layer in model.sublayers(include_self=True):
        if not isinstance(layer, ROTARY_CLASSES) or layer.cos_cached.shape[1] <= rows:
            continue
        for name in TABLES:
            table = getattr(layer, name)
            freed += (table.shape[1] - rows) * table.shape[3] * table.element_size()
            setattr(layer, name, table[:, :rows].clone())
        layer.max_seq_len_cached = rows
    return freed
