"""ERNIE-4.5 (dense) on paddlenlp 3.0.0b4's Qwen2 classes (ERNIE 4.5 Technical Report, Baidu 2025).

ERNIE-4.5's dense decoder (baidu/ERNIE-4.5-0.3B-PT) is read from transformers' ``models/ernie4_5/
modeling_ernie4_5.py`` (5.x), the reference these classes are tested against: LLaMA's pre-norm decoder (RMSNorm,
SwiGLU MLP, grouped-query attention), an explicit ``head_dim`` (0.3B: 16 heads of 128 on hidden 1024), no
biases (``use_bias`` false in the published config.json; importing one with true is refused,
pretrain.families.ernie4_5), tied embeddings, and RoPE that rotates interleaved pairs:

    ``apply_rotary_pos_emb`` ("glm rope style"): cos/sin of frequency i at dims 2i and 2i+1
    (``cos[..., :d/2].repeat_interleave(2)``), ``rotate_half(x) = stack(-x[1::2], x[0::2]).flatten()``, so
    dims (2i, 2i+1) turn by position x inv_freq[i], inv_freq[i] = rope_theta^(-2i/d) (``rope_theta`` 500,000).

paddlenlp's ``Qwen2Attention`` rotates halves (dims i and i + d/2 by inv_freq[i]; ``rotate_half`` in
qwen2/modeling.py, and its fused kernel with ``use_neox_rotary_style=False``). Each head of q and k is therefore
put in halves order (``pairs_to_halves``: its even dims, then its odd dims) by a hook on the projection's output
(``pretrain.models.qwen2_head_dim``) before paddlenlp rotates it: halves-RoPE of the reordered head is the
reordered interleaved-RoPE head, element for element, and attention scores q.k are sums over a head's dims that
one reordering of both q and k leaves as they are. v is not reordered. The weights keep transformers' layout,
so the Hugging Face mappings are Qwen2's (without biases) and the reordering is the same on every
tensor-parallel rank (it acts within a head; ranks hold whole heads).

paddlenlp 3.0.0b4 has no pipeline class for these layers (``Qwen2ForCausalLMPipe`` builds
``Qwen2DecoderLayerPipe`` by name): the registry leaves ``pipe_class`` None and preflight refuses pipeline
parallelism.
"""

from __future__ import annotations

import paddle
from paddlenlp.transformers.model_utils import register_base_model

from pretrain.models.qwen2_head_dim import (
    HeadDimAttention,
    HeadDimConfig,
    HeadDimDecoderLayer,
    HeadDimForCausalLM,
    HeadDimModel,
    HeadDimPretrainedModel,
)


class Ernie4_5Config(HeadDimConfig):
    """Qwen2Config plus ``head_dim``, as model type ``ernie4_5``; tied embeddings unless told otherwise, as
    transformers' ``Ernie4_5Config``, whose ``save_pretrained`` leaves ``tie_word_embeddings`` out of
    config.json when it is that default."""

    model_type = "ernie4_5"

    def __init__(self, tie_word_embeddings=True, **kwargs):
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)


def pairs_to_halves(heads: paddle.Tensor) -> paddle.Tensor:
    """[..., head_dim] -> same shape and dtype: a head's even dims, then its odd dims (interleaved RoPE's pair
    (2i, 2i+1) becomes halves RoPE's pair (i, i + head_dim/2); module docstring)."""
    return paddle.concat([heads[..., 0::2], heads[..., 1::2]], axis=-1)


class Ernie4_5Attention(HeadDimAttention):
    """HeadDimAttention with q and k heads in halves order before paddlenlp's RoPE (module docstring)."""

    def __init__(self, config: Ernie4_5Config, layerwise_recompute: bool = True, skip_recompute_ops=None):
        super().__init__(config, layerwise_recompute, skip_recompute_ops=skip_recompute_ops)
        self.projection_hooks = {"qkv_proj": self._reorder_fused_qkv}
        if not self.fuse_attention_qkv:
            self.projection_hooks = {"q_proj": self._reorder, "k_proj": self._reorder}

    def _reorder(self, _, inputs, projected: paddle.Tensor) -> paddle.Tensor:
        """q_proj's or k_proj's output [..., n x head_dim], each head in halves order."""
        shape = projected.shape
        return pairs_to_halves(projected.reshape([*shape[:-1], -1, self.head_dim])).reshape(shape)

    def _reorder_fused_qkv(self, _, inputs, mixed: paddle.Tensor) -> paddle.Tensor:
        """qkv_proj's output (``HeadDimAttention.split_fused_qkv``) with its q and k heads in halves order."""
        q, k, v = self.split_fused_qkv(mixed)
        return self.join_fused_qkv(pairs_to_halves(q), pairs_to_halves(k), v, mixed.shape)


class Ernie4_5DecoderLayer(HeadDimDecoderLayer):
    """Qwen2DecoderLayer on ``Ernie4_5Attention``."""

    attention_class = Ernie4_5Attention


class Ernie4_5PretrainedModel(HeadDimPretrainedModel):
    """Qwen2's name and tensor-parallel mappings without the q/k/v biases (transformers' ERNIE-4.5 names its
    tensors as Qwen2 does: ``model.layers.N.self_attn.q_proj.weight``, ...)."""

    config_class: type = Ernie4_5Config


@register_base_model
class Ernie4_5Model(Ernie4_5PretrainedModel, HeadDimModel):
    """Qwen2Model on ``Ernie4_5DecoderLayer``s."""

    decoder_layer_class = Ernie4_5DecoderLayer

    def __init__(self, config: Ernie4_5Config):
        HeadDimModel.__init__(self, config)  # paddlenlp's InitTrackerMeta gives Ernie4_5PretrainedModel an __init__


class Ernie4_5ForCausalLM(Ernie4_5PretrainedModel, HeadDimForCausalLM):
    """Qwen2ForCausalLM on ``Ernie4_5Model`` (its forward, loss and generation unchanged)."""

    def __init__(self, config: Ernie4_5Config):
        HeadDimForCausalLM.__init__(self, config)  # as Ernie4_5Model's
