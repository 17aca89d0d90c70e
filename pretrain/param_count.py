"""Parameter counts from a model config, without building the model.

Every supported decoder is described by one ``DecoderShape`` (read from its paddlenlp config by
its ``model_type``'s registry record, ``pretrain.registry.Implementation``), and one formula counts it:

    embedding      V*d                         token embedding table [vocab, hidden]
  + positions      P*d                         learned absolute positions (GPT), else 0
  + L * (
      attention    d*(q + 2*kv) + q*d          Q, K, V and output projections
                   + bias: (q + 2*kv) + d      when the layer has them
                   or, multi-head latent attention (DeepSeek): ``registry.LatentAttention.parameters``
                   + per-head q/k norm weights (Qwen3's q_norm, k_norm: 2 x head size)
      mlp          m*d*f                       m = 3 (gated SwiGLU: gate, up, down) or 2 (up, down)
                   + bias: (m-1)*f + d         when the layer has them
                   or, with experts (MoE):
                   d*E + e*3*d*fe              router [d, E]; e = E experts (total) or k (activated)
                   + 3*d*fs (+ d)              shared experts (and Qwen2-MoE's shared-expert gate)
                   (+ E)                       DeepSeek-V3's per-expert routing bias
                   except in the dense layers of a mixture of experts (DeepSeek's first_k_dense_replace):
                   3*d*fd                      a dense SwiGLU MLP of width fd
      norms        2 * n                       n = d (RMSNorm) or 2d (LayerNorm weight + bias)
    )
  + final norm     n
  + output head    V*d unless tied to the embedding
  + D * (          DeepSeek-V3's multi-token-prediction modules (``pretrain.mtp``), unless ``prediction_modules``
      layer        one more layer as above, with experts when the model has them
      enorm, hnorm 2 * n
      eh_proj      2d*d                        [2 x hidden, hidden], no bias (``mtp.drop_projection_bias``)
    )              the embedding, final norm and output head are the main model's

with d = hidden size, q = query heads x head size, kv = key/value heads x head size, f = MLP
width, V = vocabulary, L = layers; E routed experts of width fe per MoE layer, k of them per token,
shared experts of fs hidden units in all. The activated count (``activated=True``) is what one token
uses: the router, its k experts and the shared ones (the same as the total for a dense model).
tests/test_param_count.py pins the formula to the numel of built paddlenlp models and to the
published counts (total and activated) of every registry entry.
"""

from __future__ import annotations

from paddlenlp.transformers import PretrainedConfig

from pretrain.registry import DecoderShape, implementation_for


def experts_text(count: int) -> str:
    """``"1 expert"``, ``"4 experts"``: a count of experts for a message."""
    return f"{count} expert{'' if count == 1 else 's'}"


def decoder_shape(config: PretrainedConfig) -> DecoderShape:
    """The DecoderShape of a paddlenlp config, read by its registry record (``Implementation.read_shape``).

    Raises:
        UserError: the config's model_type is not in the registry.
    """
    return implementation_for(config.model_type).read_shape(config)


def _moe_mlp_parameters(shape: DecoderShape, activated: bool) -> int:
    """Parameters of one MoE layer's MLP (all experts, or those one token uses); see the module docstring."""
    d = shape.hidden_size
    experts = shape.experts_per_token if activated else shape.experts
    shared = 3 * d * shape.shared_expert_width + (d if shape.shared_expert_gate else 0)
    router = d * shape.experts + (shape.experts if shape.router_bias else 0)
    return router + experts * 3 * d * shape.expert_width + shared


def count_shape_parameters(shape: DecoderShape, activated: bool = False, prediction_modules: bool = True) -> tuple:
    """(total, input-embedding) parameters of a decoder; the formula is in the module docstring.

    ``activated``: count only the parameters one token uses (the router, ``experts_per_token`` of the
    routed experts, the shared experts); no difference for a dense decoder. ``prediction_modules`` False: the
    main model alone, without DeepSeek-V3's multi-token-prediction modules (what its report's 671B and 37B count).
    """
    d, f = shape.hidden_size, shape.mlp_width
    q, kv = shape.query_size, shape.key_value_size
    norm = 2 * d if shape.norm_has_bias else d
    mlp_matrices = 3 if shape.gated_mlp else 2

    attention = d * (q + 2 * kv) + q * d
    attention += (q + 2 * kv) if shape.qkv_bias else 0
    mlp = mlp_matrices * d * f
    if shape.output_bias:
        attention += d
        mlp += (mlp_matrices - 1) * f + d
    if shape.latent_attention:
        attention = shape.latent_attention.parameters(d)
    attention += shape.head_norms
    if shape.experts:
        mlp = _moe_mlp_parameters(shape, activated)
    dense_layer = attention + 3 * d * shape.dense_mlp_width + 2 * norm  # DeepSeek's dense layers (gated MLP)
    layer = attention + mlp + 2 * norm
    layers = (shape.num_hidden_layers - shape.dense_layers) * layer + shape.dense_layers * dense_layer
    if prediction_modules:
        layers += shape.prediction_layers * (layer + 2 * norm + 2 * d * d)

    embedding = shape.vocab_size * d
    total = embedding + shape.position_rows * d + layers + norm
    if not shape.tie_word_embeddings:
        total += shape.vocab_size * d
    return total, embedding


def count_config_parameters(
    config: PretrainedConfig, activated: bool = False, prediction_modules: bool = True
) -> tuple:
    """(total, input-embedding) parameters of the full (unsharded) model ``config`` describes; with
    ``activated``, of those one token uses; without ``prediction_modules``, of the main model alone
    (``count_shape_parameters``).

    The total equals the sum of parameter sizes of the model built on one card, without
    building it (so it works for 175B on a laptop).
    """
    return count_shape_parameters(decoder_shape(config), activated, prediction_modules)
