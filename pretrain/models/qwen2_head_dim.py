"""paddlenlp 3.0.0b4's Qwen2 decoder at an explicit ``head_dim``, without q/k/v bias, with hooks on the attention
projections' outputs: the base of Qwen3 (``pretrain.models.qwen3``) and ERNIE-4.5 (``pretrain.models.ernie4_5``).

- ``head_dim`` is its own config value, not ``hidden_size // num_attention_heads`` (Qwen3-0.6B and
  ERNIE-4.5-0.3B: hidden 1024, 16 heads of 128): q_proj is [hidden, heads x head_dim], k/v_proj
  [hidden, kv_heads x head_dim], o_proj [heads x head_dim, hidden];
- no q/k/v bias (paddlenlp's ``Qwen2Attention`` has one; o_proj and the MLP have none in either);
- ``projection_hooks``: ``{projection name: forward post hook}`` a subclass sets; paddlenlp's
  ``Qwen2Attention.forward`` reshapes the projections' output to heads and applies RoPE in one method, so what a
  model does to q and k between the projection and RoPE (Qwen3's per-head norms, ERNIE-4.5's RoPE pair order)
  is a hook on the projection's output. The hooks are put on whatever layer holds the projection's name when
  the attention runs, so a projection replaced after the model is built (paddlenlp's LoRA puts a
  ``LoRALinear`` in its place) is hooked too.

The classes keep paddlenlp's Qwen2 names for the weights (``qwen2.layers.N.self_attn.q_proj.weight``, the base
model under ``qwen2``), so its name and tensor-parallel mappings apply with the bias entries removed.
"""

from __future__ import annotations

from typing import Callable

import paddle
from paddle import nn
from paddlenlp.transformers import Qwen2Config
from paddlenlp.transformers.qwen2.modeling import (
    Qwen2Attention,
    Qwen2DecoderLayer,
    Qwen2ForCausalLM,
    Qwen2LMHead,
    Qwen2Model,
    Qwen2PretrainedModel,
    Qwen2PretrainingCriterion,
    Qwen2RotaryEmbedding,
)
from paddlenlp.transformers.refined_recompute import get_skip_recompute_ops


class HeadDimConfig(Qwen2Config):
    """Qwen2Config plus ``head_dim`` (default hidden_size // num_attention_heads)."""

    def __init__(self, head_dim=None, **kwargs):
        super().__init__(**kwargs)
        self.head_dim = head_dim or self.hidden_size // self.num_attention_heads


class HeadDimAttention(Qwen2Attention):
    """Qwen2Attention at ``config.head_dim``, without q/k/v bias, its projections' outputs passed through
    ``projection_hooks`` (module docstring)."""

    def __init__(self, config: HeadDimConfig, layerwise_recompute: bool = True, skip_recompute_ops=None):
        super().__init__(config, layerwise_recompute, skip_recompute_ops=skip_recompute_ops)
        # Rebuilt at head_dim, without bias, with the linear classes Qwen2Attention chose for the layout
        # (tensor / sequence parallel, refined recompute).
        self.head_dim = config.head_dim
        kv = config.num_key_value_heads * self.head_dim
        query = config.num_attention_heads * self.head_dim
        column = type(self._sub_layers["qkv_proj" if self.fuse_attention_qkv else "q_proj"])
        row = type(self._sub_layers["o_proj"])
        parallel = config.tensor_parallel_degree > 1

        def make_column(width):
            if parallel:
                return column(self.hidden_size, width, has_bias=False, gather_output=False)
            return column(self.hidden_size, width, bias_attr=False)

        if self.fuse_attention_qkv:
            self.qkv_proj = make_column(query + 2 * kv)
        else:
            self.q_proj, self.k_proj, self.v_proj = make_column(query), make_column(kv), make_column(kv)
        if parallel:
            self.o_proj = row(query, self.hidden_size, has_bias=False, input_is_parallel=True)
        else:
            self.o_proj = row(query, self.hidden_size, bias_attr=False)
        self.rotary_emb = Qwen2RotaryEmbedding(
            self.head_dim, max_position_embeddings=self.max_position_embeddings, base=self.rope_theta
        )
        self.projection_hooks: dict[str, Callable] = {}  # projection name -> forward post hook (subclasses)

    def forward(self, *args, **kwargs):
        """``Qwen2Attention.forward`` with ``projection_hooks`` on the projections it will call (module docstring)."""
        for name, hook in self.projection_hooks.items():
            projection = self._sub_layers[name]
            if not getattr(projection, "head_dim_hooked", False):
                projection.register_forward_post_hook(hook)
                projection.head_dim_hooked = True
        return super().forward(*args, **kwargs)

    def split_fused_qkv(self, mixed: paddle.Tensor) -> tuple:
        """qkv_proj's output [..., kv_heads x (groups + 2) x head_dim], laid out per key/value head as
        [q x groups, k, v] (what ``Qwen2Attention.forward`` splits) -> (q, k, v) of
        [..., kv_heads, groups or 1, head_dim]; ``join_fused_qkv`` puts them back."""
        grouped = mixed.reshape([*mixed.shape[:-1], -1, self.num_key_value_groups + 2, self.head_dim])
        return tuple(paddle.split(grouped, [self.num_key_value_groups, 1, 1], axis=-2))

    @staticmethod
    def join_fused_qkv(q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, shape: list) -> paddle.Tensor:
        """The inverse of ``split_fused_qkv``: qkv_proj's output of ``shape``."""
        return paddle.concat([q, k, v], axis=-2).reshape(shape)


class HeadDimDecoderLayer(Qwen2DecoderLayer):
    """Qwen2DecoderLayer on the subclass's ``attention_class`` (a ``HeadDimAttention``)."""

    attention_class: type = HeadDimAttention

    def __init__(self, config: HeadDimConfig, layerwise_recompute: bool = False, skip_recompute_ops=None):
        super().__init__(config, layerwise_recompute, skip_recompute_ops=skip_recompute_ops)
        self.self_attn = self.attention_class(config, layerwise_recompute, skip_recompute_ops=self.skip_recompute_ops)


class HeadDimPretrainedModel(Qwen2PretrainedModel):
    """Qwen2's name and tensor-parallel mappings without the q/k/v biases."""

    config_class: type = HeadDimConfig

    @classmethod
    def _get_name_mappings(cls, config: HeadDimConfig) -> list:
        return [m for m in super()._get_name_mappings(config) if not m.source_name.endswith("_proj.bias")]

    @classmethod
    def _get_tensor_parallel_mappings(cls, config: HeadDimConfig, is_split=True):
        actions = super()._get_tensor_parallel_mappings(config, is_split=is_split)
        return {name: action for name, action in actions.items() if not name.endswith("_proj.bias")}


class HeadDimModel(Qwen2Model):
    """Qwen2Model on the subclass's ``decoder_layer_class`` (built once: Qwen2Model's own layers are never
    made)."""

    decoder_layer_class: type = HeadDimDecoderLayer

    def __init__(self, config: HeadDimConfig):
        layers = config.num_hidden_layers
        config.num_hidden_layers = 0  # Qwen2Model.__init__ builds its embedding and norm, no Qwen2 layer
        try:
            Qwen2Model.__init__(self, config)
        finally:
            config.num_hidden_layers = layers
        self.layers = nn.LayerList([self.decoder_layer(config, index) for index in range(layers)])

    def decoder_layer(self, config: HeadDimConfig, index: int) -> nn.Layer:
        """Decoder layer ``index`` (0-based): a ``decoder_layer_class``, recomputed unless in
        ``no_recompute_layers``."""
        return self.decoder_layer_class(
            config=config,
            layerwise_recompute=index not in self.no_recompute_layers,
            skip_recompute_ops=get_skip_recompute_ops(config, index),
        )


class HeadDimForCausalLM(Qwen2ForCausalLM):
    """Qwen2ForCausalLM on the subclass's base model (``base_model_class``, set by ``register_base_model``);
    its forward, loss and generation unchanged."""

    def __init__(self, config: HeadDimConfig):
        super(Qwen2ForCausalLM, self).__init__(config)  # PretrainedModel's: Qwen2ForCausalLM's would build Qwen2
        self.qwen2 = self.base_model_class(config)
        if config.tie_word_embeddings:
            self.lm_head = Qwen2LMHead(config, embedding_weights=self.qwen2.embed_tokens.weight, transpose_y=True)
            self.tie_weights()
        else:
            self.lm_head = Qwen2LMHead(config)
        self.criterion = Qwen2PretrainingCriterion(config)
        self.vocab_size = config.vocab_size
