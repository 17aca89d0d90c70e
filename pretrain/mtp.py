"""DeepSeek-V3's multi-token prediction (MTP), as paddlenlp 3.0.0b4 builds and trains it.

The DeepSeek-V3 technical report (arXiv 2412.19437, section 2.2) adds D sequential modules after the main model;
module k predicts the token k + 1 places ahead of each position from the previous depth's representation h^{k-1}
(the main model's last hidden state for k = 1) and the embedding of the token k places ahead:
h'_i = M_k [RMSNorm(h^{k-1}_i); RMSNorm(Emb(t_{i+k}))], then one transformer block, then the shared output head.
Its loss is the cross-entropy of those predictions, averaged over the depths and weighted by lambda:
L = L_main + lambda / D x sum_k L_MTP^k (eq. 25); the release trains D = 1 with lambda 0.3 for the first 10T
tokens and 0.1 for the remaining 4.8T (section 4.2).

paddlenlp builds it from ``num_nextn_predict_layers`` (D) and ``num_nextn_predict_lambda`` (lambda):

- ``DeepseekV2MTPLayer`` (deepseek_v2/modeling.py:1173): a ``DeepseekV2DecoderLayer`` at layer index
  num_hidden_layers + k (a MoE layer for DeepSeek-V3) with ``hnorm``, ``enorm`` and ``eh_proj`` (M_k, applied
  to [hnorm(h); enorm(e)]); the embedding, the final norm and the output head are the main model's.
- ``DeepseekV2Model.forward`` (:1593) takes ``seq_length + D`` tokens: the main model reads the first
  ``seq_length``, depth k the embeddings of tokens k .. k + seq_length - 1 (past the main model's window for the
  last k). ``DeepseekV2PretrainingCriterion`` (:1810) takes labels of as many tokens: the main loss reads the
  first ``seq_length``, depth k labels k .. k + seq_length - 1. A sample therefore holds
  ``max_seq_length + D + 1`` tokens (``sample_tokens``) and the config's ``seq_length`` is
  ``max_seq_length + D`` (the attention's and output head's reshapes under sequence parallelism read it).
- The loss it returns has the main loss's value with lambda x the MTP loss's gradient (``add_loss``:
  main + mtp - mtp.detach()): the logged loss stays the next-token loss; the MTP loss itself is not returned.

Two departures, fixed here (rows of the ledger, ``pretrain.upstream``):

- paddlenlp's ``eh_proj`` is an ``nn.Linear`` with a bias, which the report's M_k and the release's checkpoint
  (``model.layers.61.eh_proj.weight`` only) do not have; ``drop_projection_bias`` removes it from a built model.
- ``DeepseekV2PretrainedModel._get_tensor_parallel_mappings`` (deepseek_v2/modeling.py:1378) splits each MTP
  layer's ``eh_proj`` by columns, for paddlenlp's inference models; the training layer holds it whole on every
  tensor-parallel rank, so a TP2 run could not load the weights it starts from ("receives a shape [512, 128],
  but the expected shape is [512, 256]") and would merge two copies into one tensor when it saves.
  ``install_tensor_parallel_mapping`` leaves those weights unsplit.
"""

from __future__ import annotations

import paddle
from paddlenlp.transformers.deepseek_v2.modeling import DeepseekV2MTPLayer, DeepseekV2PretrainedModel

from pretrain.upstream import verified

_UPSTREAM_MAPPINGS = DeepseekV2PretrainedModel._get_tensor_parallel_mappings.__func__  # the classmethod's function


def prediction_depth(config) -> int:
    """D: the multi-token-prediction modules a paddlenlp config builds (0 for every model type but DeepSeek's)."""
    return int(getattr(config, "num_nextn_predict_layers", 0) or 0)


def sample_tokens(max_seq_length: int, config) -> int:
    """Tokens one pretraining sample holds for ``config``: ``max_seq_length`` inputs, their next tokens' shift
    and D more for the MTP depths (module docstring)."""
    return max_seq_length + 1 + prediction_depth(config)


def drop_projection_bias(model: paddle.nn.Layer) -> int:
    """Remove the bias of every MTP module's ``eh_proj`` in ``model``, in place (module docstring); the number
    removed. A model without MTP modules is left as it is."""
    layers = [layer for layer in model.sublayers() if isinstance(layer, DeepseekV2MTPLayer)]
    if layers and not verified("mtp-projection-bias"):
        return 0
    for layer in layers:
        layer.eh_proj.bias = None
    return len(layers)


def _get_tensor_parallel_mappings(cls, config, is_split: bool = True) -> dict:
    """paddlenlp's ``{name suffix: split or merge action}`` of DeepSeek-V2/V3 without the actions on the MTP layers'
    ``eh_proj``, which every tensor-parallel rank holds whole (module docstring)."""
    mappings = _UPSTREAM_MAPPINGS(cls, config, is_split=is_split)
    first = config.num_hidden_layers
    for layer in range(first, first + prediction_depth(config)):
        mappings.pop(f"layers.{layer}.eh_proj.weight", None)
    return mappings


def install_tensor_parallel_mapping() -> None:
    """Give ``DeepseekV2PretrainedModel`` (and so DeepSeek-V3's classes) the mapping of
    ``_get_tensor_parallel_mappings``; idempotent. Another paddlenlp than 3.0.0b4: left unpatched, with a warning."""
    if not verified("mtp-tensor-parallel-mapping"):
        return
    DeepseekV2PretrainedModel._get_tensor_parallel_mappings = classmethod(_get_tensor_parallel_mappings)
