"""Activation memory and elementwise HBM traffic of one decoder layer, per token, on one card.

The layer is paddlenlp's as installed (``transformers/llama/modeling.py`` and its qwen, qwen2 and
gpt siblings), tensor by tensor: a term is a tensor an op saves for its backward, the derivation
of Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(Section 4.1: per-layer activations 34·s·b·h + 5·a·s²·b bytes in 16 bit, divided by the tensor
parallel degree t inside the parallel region and, with sequence parallelism, outside it too),
redone for what these models actually save. Where paddle saves more than the paper's
transformer, the term says so:

- ``ColumnParallelLinear`` copies its input (``_c_identity`` runs ``c_identity``, a copy whose
  backward all-reduces), so with t > 1 every separate column-parallel matmul saves its own copy of
  the norm output: 3 for separate Q, K, V, 2 for separate gate and up. With sequence parallelism
  each one all-gathers (``AllGatherOp``) and saves the full-sequence input.
- The unfused RMSNorm (``LlamaRMSNorm.forward`` with ``use_fused_rms_norm`` off) saves a float32
  copy for ``pow``, a float32 type-promoted copy for the ``rsqrt(var) * x`` product and the 16-bit
  normalized tensor for the weight product: 4h + 4h + 2h bytes against the fused op's 2h
  (QWen v1's norm casts once: 4h + 2h). The unfused rotary embedding saves q, k and their
  ``rotate_half`` copies plus cos and sin.
- Flash attention (``flash_attn``) saves q, k, v, its output and the float32 log-sum-exp per head
  and token; without it paddlenlp saves the float32 softmax output and its 16-bit cast
  (``scaled_dot_product_attention``), 6·heads·s bytes per token instead of the paper's 5.
- Qwen3's per-head q/k RMSNorm (``pretrain.models.qwen3``, never fused) saves what the unfused RMSNorm
  saves, at the width of this card's q and k, with a float32 inverse RMS per head.
- There is no dropout in LLaMA, Qwen and Baichuan; GPT saves 1-byte masks (paddle's ``dropout``).

Symbols (per card): a = bytes per activation element (2 under AMP, 4 in fp32), h = hidden,
q = query width / t, kv = key-value width / t, f = MLP width / t, n = heads / t, d = head size,
s = sequence length. Norm and residual terms are divided by t under sequence parallelism.

Each term also gives the bytes its elementwise ops read and write in the forward (matmuls and
flash attention are timed by FLOPs, see ``throughput``): the input to the throughput model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

from pretrain.registry import DecoderShape, implementation_for

FP32 = 4  # bytes
INDEX = 8  # bytes of an int64 token id
MASK = 1  # bytes of a dropout mask element


@dataclass(frozen=True)
class LayerDims:
    """One decoder layer on one card, and the kernels it runs (see the module docstring for symbols)."""

    a: int
    h: int
    q: int
    kv: int
    f: int
    n: int
    d: int
    s: int
    tp: int
    sequence_parallel: bool
    gated: bool  # SwiGLU (LLaMA family) instead of GELU (GPT)
    norm: str  # "rms" (LLaMA, Qwen2), "rms_qwen" (QWen v1) or "layer" (GPT)
    rope: bool  # rotary embedding (not ALiBi, not learned positions)
    learned_positions: bool  # learned absolute position embeddings (GPT)
    rope_tables: float  # bytes per token of the cos and sin the unfused rotary embedding saves
    dropout: bool  # GPT's hidden and attention dropout (probability > 0)
    flash: bool
    fused_norm: bool
    fused_rope: bool
    attention_copies: int  # saved inputs of the column-parallel Q/K/V matmuls
    head_norms: bool  # Qwen3's per-head RMSNorm on q and k (always unfused: pretrain.models.qwen3)
    mlp_copies: int  # saved inputs of the column-parallel MLP input matmuls
    recomputed: tuple = ()  # units recomputed in backward, outermost first ("layer", "attention", "core")

    @property
    def outside(self) -> float:
        """Divisor of tensors outside the tensor-parallel region: t with sequence parallelism, else 1."""
        return self.tp if self.sequence_parallel else 1


def layer_dims(shape: DecoderShape, model_type: str, workload) -> LayerDims:
    """The LayerDims of ``shape`` under a workload's layout, precision and kernels."""
    tp = workload.layout.tensor_parallel_degree
    config = workload.model_config
    heads = config.num_attention_heads
    head_size = shape.query_size // heads
    impl = implementation_for(model_type)
    sharing = 1 if impl.rope_table_per_sample else workload.micro_batch_size
    fused_qkv = impl.fused_qkv(workload.fuse_attention_qkv)
    separate_mlp_inputs = 2 if (shape.gated_mlp and not workload.fuse_attention_ffn) else 1
    dropout = any(getattr(config, key, 0) > 0 for key in impl.dropout_keys)
    return LayerDims(
        a=workload.activation_bytes,
        h=shape.hidden_size,
        q=shape.query_size // tp,
        kv=shape.key_value_size // tp,
        f=shape.mlp_width // tp,
        n=heads // tp,
        d=head_size,
        s=workload.seq_length,
        tp=tp,
        sequence_parallel=workload.layout.sequence_parallel and tp > 1,
        gated=shape.gated_mlp,
        norm=impl.norm,
        rope=shape.position_rows == 0 and not getattr(config, "alibi", False),
        learned_positions=shape.position_rows > 0,
        rope_tables=2 * workload.activation_bytes * head_size / sharing,
        dropout=dropout,
        flash=workload.use_flash_attention,
        fused_norm=workload.use_fused_rms_norm,
        fused_rope=workload.use_fused_rope,
        attention_copies=1 if (tp == 1 or fused_qkv) else 3,
        head_norms=shape.head_norms > 0,
        mlp_copies=1 if tp == 1 else separate_mlp_inputs,
        recomputed=impl.recomputed(workload.layout.pipeline_parallel_degree > 1, workload.recompute_granularity)
        if workload.recompute
        else (),
    )


def _norm_saved(x: LayerDims) -> float:
    """Saved by one norm: fused op / LayerNorm: the input + float32 statistics; unfused RMSNorm: see module doc."""
    if x.norm == "layer":
        return (x.a * x.h + 2 * FP32) / x.outside  # input, mean and variance
    if x.fused_norm:
        return (x.a * x.h + FP32) / x.outside  # input, inverse RMS
    promoted = FP32 * x.h if (x.norm == "rms" and x.a != FP32) else 0  # rsqrt(var) * x16 -> float32 copy
    normalized = x.a * x.h  # the (16-bit cast of the) normalized tensor the weight product saves
    return (FP32 * x.h + promoted + normalized + FP32) / x.outside


def _norm_traffic(x: LayerDims) -> float:
    """Bytes one norm's elementwise kernels read and write, forward."""
    if x.fused_norm or x.norm == "layer":
        return 2 * x.a * x.h / x.outside  # read x, write y
    cast = (x.a + FP32) if x.a != FP32 else 0
    # cast in, pow (r/w fp32), mean (read), [promoting cast], rsqrt-multiply (r/w), cast out, weight product
    promoted = cast if x.norm == "rms" else 0
    return (cast + 2 * FP32 + FP32 + promoted + 2 * FP32 + cast + 2 * x.a) * x.h / x.outside


def _head_norms_saved(x: LayerDims) -> float:
    """Qwen3's q_norm and k_norm (``Qwen3HeadRMSNorm``, unfused) over this card's q and k heads: the unfused
    RMSNorm's tensors at width q + kv, and a float32 inverse RMS per head."""
    if not x.head_norms:
        return 0.0
    width = x.q + x.kv
    promoted = FP32 * width if x.a != FP32 else 0
    return FP32 * width + promoted + x.a * width + FP32 * width / x.d


def _head_norms_traffic(x: LayerDims) -> float:
    """As ``_norm_traffic`` unfused, at width q + kv."""
    if not x.head_norms:
        return 0.0
    cast = (x.a + FP32) if x.a != FP32 else 0
    return (cast + 2 * FP32 + FP32 + cast + 2 * FP32 + cast + 2 * x.a) * (x.q + x.kv)


def _column_inputs(copies: Callable) -> tuple:
    """(saved, traffic) of the inputs column-parallel matmuls keep: one per separate matmul when t > 1."""
    saved = lambda x: copies(x) * x.a * x.h  # noqa: E731 (gathered to the full sequence under sequence parallel)
    traffic = lambda x: (copies(x) * 2 * x.a * x.h) if (x.tp > 1 and not x.sequence_parallel) else 0  # noqa: E731
    return saved, traffic


def _rope_saved(x: LayerDims) -> float:
    if not x.rope or x.fused_rope:
        return 0.0
    return 2 * x.a * (x.q + x.kv) + x.rope_tables  # q, rotate_half(q), k, rotate_half(k); cos, sin


def _rope_traffic(x: LayerDims) -> float:
    if not x.rope:
        return 0.0
    # fused: read and write q, k once; unfused: q*cos, slices, neg, concat, *sin, add: ~9 passes
    return (2 if x.fused_rope else 9) * x.a * (x.q + x.kv)


def _core_attention_saved(x: LayerDims) -> float:
    if x.flash:
        return x.a * (2 * x.q + 2 * x.kv) + FP32 * x.n  # q, k, v, out; log-sum-exp per head
    scores = x.n * x.s  # [heads/t, s] per token
    if x.norm == "layer":  # GPT: softmax out, dropout mask, dropout out; q, k, v, out
        return 4 * x.a * x.q + (x.a + (MASK + x.a if x.dropout else 0)) * scores
    low = x.a if x.a != FP32 else 0  # the 16-bit probabilities after the float32 softmax
    return 4 * x.a * x.q + (FP32 + low) * scores  # q, k (repeated to q heads), v, out; softmax


def _core_attention_traffic(x: LayerDims) -> float:
    """Elementwise bytes of attention outside its matmuls (the flash kernel is timed by FLOPs)."""
    if x.flash:
        return 0.0
    scores = x.n * x.s
    transposes = 2 * x.a * 4 * x.q  # q, k, v in, out back: read + write each
    if x.norm == "layer":
        return transposes + (2 * x.a + 2 * x.a + (2 * x.a + MASK if x.dropout else 0)) * scores
    cast = (x.a + FP32) if x.a != FP32 else 0
    return transposes + (2 * x.a + cast + 2 * FP32 + 2 * FP32 + cast) * scores  # mask add, casts, scale, softmax


def _activation_saved(x: LayerDims) -> float:
    return (3 if x.gated else 2) * x.a * x.f  # SwiGLU: x, y and the product; GELU: input and output


def _activation_traffic(x: LayerDims) -> float:
    return (3 if x.gated else 2) * x.a * x.f


def _residual_saved(x: LayerDims) -> float:
    return MASK * x.h / x.outside if x.dropout else 0.0  # dropout mask before the residual add


def _residual_traffic(x: LayerDims) -> float:
    dropout = (2 * x.a + MASK) if x.dropout else 0
    return (3 * x.a + dropout) * x.h / x.outside  # read two, write one (+ dropout)


class Term(NamedTuple):
    """A named piece of a decoder layer: what it saves for backward and its elementwise forward bytes, per token."""

    name: str
    block: str  # "attention" or "mlp": the unit recompute_granularity full_attn recomputes
    core: bool  # inside the core attention (what recompute_granularity core_attn recomputes)
    saved: Callable  # LayerDims -> bytes per token
    traffic: Callable  # LayerDims -> bytes per token


_attention_inputs = _column_inputs(lambda x: x.attention_copies)
_mlp_inputs = _column_inputs(lambda x: x.mlp_copies)
LAYER_TERMS = (
    Term("attention norm", "attention", False, _norm_saved, _norm_traffic),
    Term("Q/K/V matmul inputs", "attention", False, *_attention_inputs),
    Term("q/k head norms", "attention", False, _head_norms_saved, _head_norms_traffic),
    Term("rotary embedding", "attention", False, _rope_saved, _rope_traffic),
    Term("core attention", "attention", True, _core_attention_saved, _core_attention_traffic),
    Term("attention residual", "attention", False, _residual_saved, _residual_traffic),
    Term("MLP norm", "mlp", False, _norm_saved, _norm_traffic),
    Term("MLP matmul inputs", "mlp", False, *_mlp_inputs),
    Term("MLP activation", "mlp", False, _activation_saved, _activation_traffic),
    Term("MLP residual", "mlp", False, _residual_saved, _residual_traffic),
)


def layer_saved_bytes(x: LayerDims) -> dict:
    """Bytes per token one layer saves for backward without recompute, by term name."""
    return {term.name: term.saved(x) for term in LAYER_TERMS}


def layer_traffic_bytes(x: LayerDims) -> float:
    """Bytes per token one layer's elementwise kernels move in one forward."""
    return sum(term.traffic(x) for term in LAYER_TERMS)


def recomputed_layer_bytes(x: LayerDims) -> tuple:
    """(saved bytes per token per layer, bytes of the part rebuilt in backward) under ``x.recomputed``.

    paddlenlp's recompute (with or without reentrancy) saves the inputs of the recomputed function
    (``Implementation.recomputed_units``): a "layer" saves the layer input; "attention" the attention norm's output
    while the attention norm and the MLP save as usual; "core" the core attention's q, k, v (its
    output is still saved by the output matmul). The outermost unit decides what stays saved; in
    backward it is rebuilt one layer at a time.
    """
    saved = layer_saved_bytes(x)
    total = sum(saved.values())
    if not x.recomputed:
        return total, 0.0
    unit = x.recomputed[0]
    if unit == "layer":
        return x.a * x.h / x.outside, total
    if unit == "attention":
        attention = sum(saved[t.name] for t in LAYER_TERMS if t.block == "attention" and t.name != "attention norm")
        return total - attention + x.a * x.h, attention
    core = saved["core attention"]
    kept = x.a * (2 * x.q + 2 * x.kv)  # the recompute inputs q, k, v and the output the o_proj saves
    return total - core + kept, core - kept + x.a * x.q


def backward_working_bytes(x: LayerDims) -> float:
    """Gradients alive while one layer runs backward, per token: as large as its larger block's saved tensors.

    The backward of a block creates the gradients of the tensors it saved before freeing them
    (e.g. the SwiGLU backward holds the output gradient and both input gradients, 3·a·f); the
    layer's input gradient (a·h) flows alongside. An estimate, not an op-by-op count.
    """
    saved = layer_saved_bytes(x)
    blocks = {"attention": 0.0, "mlp": 0.0}
    for term in LAYER_TERMS:
        blocks[term.block] += saved[term.name]
    return max(blocks.values()) + x.a * x.h


def loss_bytes(x: LayerDims, vocab: int, prediction_depth: int = 0) -> tuple:
    """(saved, peak transient) bytes per token of the output layer and the loss on the last stage.

    ``LlamaPretrainingCriterion`` (and the qwen, qwen2, gpt criteria) cast the 16-bit logits
    ``[micro_batch, seq, vocab / t]`` to float32 and run (parallel) softmax cross-entropy, which
    saves the float32 softmax (4·V/t bytes per token, counted in ``saved`` with the head's input
    a·h and the final norm). While it runs, the 16-bit logits and their float32 copy are alive
    too: the transient (a + 4)·V/t (4·V/t in fp32, where the cast is a no-op).

    DeepSeek-V3's ``prediction_depth`` D multi-token-prediction modules (``pretrain.mtp``) each add the same
    through the shared final norm and head, and before their decoder layer (counted with the layers) the
    token ids of their embedding lookup, hnorm, enorm and eh_proj's input [hidden; embedding] (2 norms +
    2·a·h). ``DeepseekV2ForCausalLM.forward`` (deepseek_v2/modeling.py:1996) computes all D + 1 logits before
    the criterion casts each: (D + 1)·a·V/t + 4·V/t at once.
    """
    rows = vocab / x.tp if vocab % x.tp == 0 else vocab
    head = FP32 * rows + x.a * x.h + _norm_saved(x)
    saved = head + prediction_depth * (head + 2 * _norm_saved(x) + 2 * x.a * x.h + INDEX)
    logits = (prediction_depth + 1) * x.a * rows
    transient = logits + FP32 * rows if x.a != FP32 else logits
    return saved, transient


def loss_traffic_bytes(x: LayerDims, vocab: int) -> float:
    """Elementwise bytes of the final norm, logits cast and softmax cross-entropy, forward, per token."""
    rows = vocab / x.tp if vocab % x.tp == 0 else vocab
    cast = (x.a + FP32) if x.a != FP32 else 0
    return _norm_traffic(x) + (cast + 2 * FP32) * rows


def embedding_bytes(x: LayerDims) -> tuple:
    """(saved, elementwise forward traffic) bytes per token of the input embedding on the first stage.

    The lookup saves the int64 token ids; GPT adds learned positions (ids saved too), their sum and
    a dropout mask.
    """
    if not x.learned_positions:
        return INDEX, x.a * x.h
    mask = MASK * x.h if x.dropout else 0
    return 2 * INDEX + mask, x.a * x.h * 5 + mask
