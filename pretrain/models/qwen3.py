"""Qwen3 (dense) on paddlenlp 3.0.0b4's Qwen2 classes (Qwen3 Technical Report, Yang et al. 2025, sec. 2).

Qwen3's decoder is Qwen2's (paddlenlp ``qwen2/modeling.py``) with three changes, read from transformers'
``models/qwen3/modeling_qwen3.py`` (4.55), which is the reference these classes are tested against:

- ``head_dim`` is its own config value, not ``hidden_size // num_attention_heads`` (Qwen3-0.6B: hidden 1024,
  16 heads of 128): q_proj is [hidden, heads x head_dim], k/v_proj [hidden, kv_heads x head_dim], o_proj
  [heads x head_dim, hidden];
- no q/k/v bias (``attention_bias`` false in every published Qwen3 config.json; importing a config with true
  is refused, pretrain.families.qwen3);
- ``q_norm``/``k_norm``: an RMSNorm over head_dim (weight [head_dim], eps ``rms_norm_eps``) applied to each
  head of q and k after the projection and before RoPE (``Qwen3Attention.forward``:
  ``q_norm(q_proj(x).view(..., -1, head_dim))``).

paddlenlp's ``Qwen2Attention.forward`` reshapes the projections' output to heads and applies RoPE in one
method, so the norms are forward hooks on the projections: the output of q_proj (k_proj, or the fused
qkv_proj's q and k parts) normalized per head, before the forward reshapes it and applies RoPE. The hooks are
put on whatever layer holds the projection's name when the attention runs (``Qwen3Attention.forward``), so a
projection replaced after the model is built (paddlenlp's LoRA puts a ``LoRALinear`` in its place) is
normalized too.

Tensor parallelism: each rank holds its own heads and the whole (replicated) ``q_norm``/``k_norm`` weight, so a
rank's gradient of that weight covers its heads only; ``Qwen3HeadRMSNorm`` passes the weight through paddle's
``_c_identity`` (identity forward, all-reduce SUM of the gradient over the tensor-parallel group backward, as
``ColumnParallelLinear`` does for its input), making it the full gradient on every rank.

The classes keep paddlenlp's Qwen2 names for the weights (``qwen2.layers.N.self_attn.q_proj.weight``, the
base model under ``qwen2``) so its name and tensor-parallel mappings apply with the bias entries removed and
the norms added. paddlenlp 3.0.0b4 has no pipeline class for them (``Qwen2ForCausalLMPipe`` builds
``Qwen2DecoderLayerPipe`` by name): the registry leaves ``pipe_class`` None and preflight refuses
pipeline parallelism.
"""

from __future__ import annotations

from typing import Callable

import paddle
from paddle import nn
from paddle.distributed import fleet
from paddle.distributed.fleet.layers.mpu.mp_ops import _c_identity
from paddlenlp.transformers import Qwen2Config
from paddlenlp.transformers.conversion_utils import StateDictNameMapping
from paddlenlp.transformers.model_utils import register_base_model
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


class Qwen3Config(Qwen2Config):
    """Qwen2Config plus ``head_dim`` (default hidden_size // num_attention_heads)."""

    model_type = "qwen3"

    def __init__(self, head_dim=None, **kwargs):
        super().__init__(**kwargs)
        self.head_dim = head_dim or self.hidden_size // self.num_attention_heads


class Qwen3HeadRMSNorm(nn.Layer):
    """RMSNorm over the last axis, head_dim: [..., heads, head_dim] -> same shape and dtype; the arithmetic of
    paddlenlp's ``Qwen2RMSNorm`` (float32 variance), weight [head_dim]. Under tensor parallelism its weight's
    gradient is summed over the group (module docstring)."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.weight = paddle.create_parameter(
            shape=[config.head_dim],
            dtype=paddle.get_default_dtype(),
            default_initializer=nn.initializer.Constant(1.0),
        )
        self.variance_epsilon = config.rms_norm_eps
        self.tensor_parallel = config.tensor_parallel_degree > 1

    def forward(self, heads: paddle.Tensor) -> paddle.Tensor:
        weight = self.weight
        if self.tensor_parallel:
            group = fleet.get_hybrid_communicate_group().get_model_parallel_group()
            weight = _c_identity(weight, group=group)
        with paddle.amp.auto_cast(False):
            variance = heads.astype("float32").pow(2).mean(-1, keepdim=True)
            normed = paddle.rsqrt(variance + self.variance_epsilon) * heads
        if weight.dtype in [paddle.float16, paddle.bfloat16]:
            normed = paddle.cast(normed, weight.dtype)
        return normed * weight


class Qwen3Attention(Qwen2Attention):
    """Qwen2Attention with an explicit head_dim, no q/k/v bias and per-head q/k norms (module docstring)."""

    def __init__(self, config: Qwen3Config, layerwise_recompute: bool = True, skip_recompute_ops=None):
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
        self.q_norm = Qwen3HeadRMSNorm(config)
        self.k_norm = Qwen3HeadRMSNorm(config)
        self._norm_hooks: dict[str, Callable] = {"qkv_proj": self._norm_fused_qkv}  # projection name -> hook
        if not self.fuse_attention_qkv:
            self._norm_hooks = {
                "q_proj": lambda _, inputs, out: self._norm_heads(self.q_norm, out),
                "k_proj": lambda _, inputs, out: self._norm_heads(self.k_norm, out),
            }

    def forward(self, *args, **kwargs):
        """``Qwen2Attention.forward`` with the norm hooks on the projections it will call (module docstring)."""
        for name, hook in self._norm_hooks.items():
            projection = self._sub_layers[name]
            if not getattr(projection, "qwen3_head_norm_hooked", False):
                projection.register_forward_post_hook(hook)
                projection.qwen3_head_norm_hooked = True
        return super().forward(*args, **kwargs)

    def _norm_heads(self, norm: Qwen3HeadRMSNorm, projected: paddle.Tensor) -> paddle.Tensor:
        """[..., n x head_dim] -> [..., n x head_dim], each head normalized by ``norm``."""
        shape = projected.shape
        return norm(projected.reshape([*shape[:-1], -1, self.head_dim])).reshape(shape)

    def _norm_fused_qkv(self, _, inputs, mixed: paddle.Tensor) -> paddle.Tensor:
        """qkv_proj's output [..., kv_heads x (groups + 2) x head_dim], laid out per key/value head as
        [q x groups, k, v] (what ``Qwen2Attention.forward`` splits), with its q and k heads normalized."""
        shape = mixed.shape
        grouped = mixed.reshape([*shape[:-1], -1, self.num_key_value_groups + 2, self.head_dim])
        q, k, v = paddle.split(grouped, [self.num_key_value_groups, 1, 1], axis=-2)
        return paddle.concat([self.q_norm(q), self.k_norm(k), v], axis=-2).reshape(shape)


class Qwen3DecoderLayer(Qwen2DecoderLayer):
    """Qwen2DecoderLayer on ``Qwen3Attention``."""

    def __init__(self, config: Qwen3Config, layerwise_recompute: bool = False, skip_recompute_ops=None):
        super().__init__(config, layerwise_recompute, skip_recompute_ops=skip_recompute_ops)
        self.self_attn = Qwen3Attention(config, layerwise_recompute, skip_recompute_ops=self.skip_recompute_ops)


class Qwen3PretrainedModel(Qwen2PretrainedModel):
    """Qwen2's mappings without the q/k/v biases, plus the per-head norms (replicated on tensor-parallel
    ranks: no split action)."""

    config_class = Qwen3Config

    @classmethod
    def _get_name_mappings(cls, config: Qwen3Config) -> list:
        kept = [m for m in super()._get_name_mappings(config) if not m.source_name.endswith("_proj.bias")]
        rows = [[m.source_name, m.target_name, m.action] for m in kept]
        prefixes = ("", "") if "Qwen2Model" in config.architectures else ("model.", "qwen2.")
        for layer in range(config.num_hidden_layers):
            for norm in ("q_norm", "k_norm"):
                name = f"layers.{layer}.self_attn.{norm}.weight"
                rows.append([prefixes[0] + name, prefixes[1] + name, None])
        return [StateDictNameMapping(*row, index=index) for index, row in enumerate(rows)]

    @classmethod
    def _get_tensor_parallel_mappings(cls, config: Qwen3Config, is_split=True):
        actions = super()._get_tensor_parallel_mappings(config, is_split=is_split)
        return {name: action for name, action in actions.items() if not name.endswith("_proj.bias")}


@register_base_model
class Qwen3Model(Qwen3PretrainedModel, Qwen2Model):
    """Qwen2Model on ``Qwen3DecoderLayer``s (built once: Qwen2Model's own layers are never made)."""

    def __init__(self, config: Qwen3Config):
        layers = config.num_hidden_layers
        config.num_hidden_layers = 0  # Qwen2Model.__init__ builds its embedding and norm, no Qwen2 layer
        try:
            Qwen2Model.__init__(self, config)
        finally:
            config.num_hidden_layers = layers
        self.layers = nn.LayerList(
            [
                Qwen3DecoderLayer(
                    config=config,
                    layerwise_recompute=index not in self.no_recompute_layers,
                    skip_recompute_ops=get_skip_recompute_ops(config, index),
                )
                for index in range(layers)
            ]
        )


class Qwen3ForCausalLM(Qwen3PretrainedModel, Qwen2ForCausalLM):
    """Qwen2ForCausalLM on ``Qwen3Model`` (its forward, loss and generation unchanged)."""

    def __init__(self, config: Qwen3Config):
        super(Qwen2ForCausalLM, self).__init__(config)  # PretrainedModel's: Qwen2ForCausalLM's would build Qwen2
        self.qwen2 = Qwen3Model(config)
        if config.tie_word_embeddings:
            self.lm_head = Qwen2LMHead(config, embedding_weights=self.qwen2.embed_tokens.weight, transpose_y=True)
            self.tie_weights()
        else:
            self.lm_head = Qwen2LMHead(config)
        self.criterion = Qwen2PretrainingCriterion(config)
        self.vocab_size = config.vocab_size
