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

The head_dim, the bias-free projections and the hooks on their outputs are ``pretrain.models.qwen2_head_dim``'s
(shared with ERNIE-4.5); the norms are such hooks: the output of q_proj (k_proj, or the fused qkv_proj's q and k
parts) normalized per head, before ``Qwen2Attention.forward`` reshapes it and applies RoPE.

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

import paddle
from paddle import nn
from paddle.distributed import fleet
from paddle.distributed.fleet.layers.mpu.mp_ops import _c_identity
from paddlenlp.transformers.conversion_utils import StateDictNameMapping
from paddlenlp.transformers.model_utils import register_base_model

from pretrain.models.qwen2_head_dim import (
    HeadDimAttention,
    HeadDimConfig,
    HeadDimDecoderLayer,
    HeadDimForCausalLM,
    HeadDimModel,
    HeadDimPretrainedModel,
)


class Qwen3Config(HeadDimConfig):
    """Qwen2Config plus ``head_dim``, as model type ``qwen3``."""

    model_type = "qwen3"


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


class Qwen3Attention(HeadDimAttention):
    """HeadDimAttention with per-head q/k norms on the projections' outputs (module docstring)."""

    def __init__(self, config: Qwen3Config, layerwise_recompute: bool = True, skip_recompute_ops=None):
        super().__init__(config, layerwise_recompute, skip_recompute_ops=skip_recompute_ops)
        self.q_norm = Qwen3HeadRMSNorm(config)
        self.k_norm = Qwen3HeadRMSNorm(config)
        self.projection_hooks = {"qkv_proj": self._norm_fused_qkv}
        if not self.fuse_attention_qkv:
            self.projection_hooks = {
                "q_proj": lambda _, inputs, out: self._norm_heads(self.q_norm, out),
                "k_proj": lambda _, inputs, out: self._norm_heads(self.k_norm, out),
            }

    def _norm_heads(self, norm: Qwen3HeadRMSNorm, projected: paddle.Tensor) -> paddle.Tensor:
        """[..., n x head_dim] -> [..., n x head_dim], each head normalized by ``norm``."""
        shape = projected.shape
        return norm(projected.reshape([*shape[:-1], -1, self.head_dim])).reshape(shape)

    def _norm_fused_qkv(self, _, inputs, mixed: paddle.Tensor) -> paddle.Tensor:
        """qkv_proj's output (``HeadDimAttention.split_fused_qkv``) with its q and k heads normalized."""
        q, k, v = self.split_fused_qkv(mixed)
        return self.join_fused_qkv(self.q_norm(q), self.k_norm(k), v, mixed.shape)


class Qwen3DecoderLayer(HeadDimDecoderLayer):
    """Qwen2DecoderLayer on ``Qwen3Attention``."""

    attention_class = Qwen3Attention


class Qwen3PretrainedModel(HeadDimPretrainedModel):
    """Qwen2's mappings without the q/k/v biases, plus the per-head norms (replicated on tensor-parallel
    ranks: no split action)."""

    config_class = Qwen3Config

    @classmethod
    def _get_name_mappings(cls, config: Qwen3Config) -> list:
        rows = [[m.source_name, m.target_name, m.action] for m in super()._get_name_mappings(config)]
        prefixes = ("", "") if "Qwen2Model" in config.architectures else ("model.", "qwen2.")
        for layer in range(config.num_hidden_layers):
            for norm in ("q_norm", "k_norm"):
                name = f"layers.{layer}.self_attn.{norm}.weight"
                rows.append([prefixes[0] + name, prefixes[1] + name, None])
        return [StateDictNameMapping(*row, index=index) for index, row in enumerate(rows)]


@register_base_model
class Qwen3Model(Qwen3PretrainedModel, HeadDimModel):
    """Qwen2Model on ``Qwen3DecoderLayer``s."""

    decoder_layer_class = Qwen3DecoderLayer

    def __init__(self, config: Qwen3Config):
        HeadDimModel.__init__(self, config)  # paddlenlp's InitTrackerMeta gives Qwen3PretrainedModel an __init__


class Qwen3ForCausalLM(Qwen3PretrainedModel, HeadDimForCausalLM):
    """Qwen2ForCausalLM on ``Qwen3Model`` (its forward, loss and generation unchanged)."""

    def __init__(self, config: Qwen3Config):
        HeadDimForCausalLM.__init__(self, config)  # as Qwen3Model's
