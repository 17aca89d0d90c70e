"""The parameter tensors one card holds, per pipeline stage, without building the model.

A decoder is ``[embedding, L decoder layers, final norm, output head]`` (the layer list every
paddlenlp ``...ForCausalLMPipe`` adds: ``llama/modeling_pp.py`` and its qwen, qwen2 and gpt
siblings). Pipeline stages split it with paddle's own ``SegmentLayers``: ``layer:<DecoderLayer>``
(the decoder layers evenly over pipeline x virtual chunks; the embedding goes with the first chunk,
norm and head with the last) when the layer count divides, else ``uniform`` over all items. With
tied embeddings (GPT, small Qwen2) and more than one stage, the last stage holds its own copy of the
embedding as the head (paddle's ``SharedLayerDesc``).

Tensor parallelism splits (Megatron-LM's layout, as paddle's ``ColumnParallelLinear``,
``RowParallelLinear`` and ``VocabParallelEmbedding``): Q/K/V, MLP up/gate and their biases by
output columns, the attention output and MLP down projections by input rows, the embedding and
head by vocabulary rows when the vocabulary divides; norms, positions and row-parallel biases are
replicated. Every tensor below is ``numel`` on one card, in the model's parameter order (the order
the sharding optimizers partition in).

Expert parallelism (``ep`` > 1, paddlenlp's ``MoELayer``: ``transformers/moe_layer.py``) builds
experts / ep of each MoE layer's routed experts on a card (rank r: experts r x E/ep to (r + 1) x E/ep - 1,
the others ``None``); the router, the shared expert and everything outside the MoE blocks stay whole.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import partial

from paddle.distributed.fleet.meta_parallel.parallel_layers.pp_layers import SegmentLayers

from pretrain.registry import DecoderShape

Shapes = list[tuple[str, tuple[int, ...]]]  # (parameter name, per-rank shape) in model order


@dataclass(frozen=True)
class StageParameters:
    """The parameters of one pipeline stage on one card (elements per tensor, model order)."""

    tensors: tuple  # numel of each parameter tensor on this card
    decoder_layers: int  # decoder layers on this stage (all its virtual chunks)
    has_embedding: bool
    has_head: bool  # final norm and output head (the loss is computed here)
    layer_numel: int  # parameters of one decoder layer on this card
    expert_numel: int = 0  # of ``tensors``, the routed experts' elements (outside the data-parallel all-reduce
    # under expert parallelism: paddlenlp marks them no_sync)
    replicated_numel: int = 0  # elements of the norms and row-parallel biases (every tensor-parallel rank's)
    moe_layers: int = 0  # of ``decoder_layers``, those with routed experts

    @property
    def numel(self) -> int:
        return sum(self.tensors)


def _split(n: int, degree: int) -> int:
    return n // degree


def _numel(shapes: list) -> list:
    """Elements of each ``(name, shape)``."""
    return [math.prod(dims) for _, dims in shapes]


def layer_shapes(shape: DecoderShape, tp: int, fused_qkv: bool, fused_ffn: bool, ep: int = 1) -> list:
    """``[(name, per-rank shape)]`` of one decoder layer's parameters on one tensor-parallel rank (and, for a
    mixture of experts, expert-parallel rank 0 of ``ep``), in model order. Names follow LLaMA's (QWen's c_attn
    is ``qkv_proj``, GPT's linear1 ``up_proj``; a routed expert's start with ``experts.``); weights are
    ``[in, out]`` as paddle's ``Linear`` stores them."""
    d, q, kv, f = shape.hidden_size, shape.query_size, shape.key_value_size, shape.mlp_width

    def norm(name: str) -> Shapes:
        weight: Shapes = [(f"{name}.weight", (d,))]
        return weight + ([(f"{name}.bias", (d,))] if shape.norm_has_bias else [])

    projections = [("qkv_proj", q + 2 * kv)] if fused_qkv else [("q_proj", q), ("k_proj", kv), ("v_proj", kv)]
    attention: Shapes = []
    for name, width in projections:  # a Linear registers its weight, then its bias
        attention += [(f"{name}.weight", (d, _split(width, tp)))]
        attention += [(f"{name}.bias", (_split(width, tp),))] if shape.qkv_bias else []
    attention += [("o_proj.weight", (_split(q, tp), d))] + ([("o_proj.bias", (d,))] if shape.output_bias else [])
    if shape.head_norms:  # Qwen3's q_norm and k_norm [head_dim], replicated on tensor-parallel ranks
        attention += [(f"{name}.weight", (shape.head_norms // 2,)) for name in ("q_norm", "k_norm")]
    if shape.latent_attention:
        attention = _latent_attention_shapes(shape.latent_attention, d, tp)
    if shape.experts:
        mlp = _moe_shapes(shape, tp, fused_ffn, ep)
    else:
        mlp = _mlp_shapes("", d, f, tp, shape.gated_mlp, fused_ffn, shape.output_bias)
    if shape.norms_first:
        return norm("input_layernorm") + attention + norm("post_attention_layernorm") + mlp
    return attention + mlp + norm("input_layernorm") + norm("post_attention_layernorm")


def _latent_attention_shapes(mla, d: int, tp: int) -> Shapes:
    """DeepSeek's multi-head latent attention (``registry.LatentAttention``) as paddlenlp's DeepseekV2Attention
    splits it: q_proj / q_b_proj and kv_b_proj by output columns, o_proj by input rows; the low-rank q_a_proj and
    kv_a_proj_with_mqa and their norms replicated (small weights, deepseek_v2/modeling.py line 838)."""
    kv_a = mla.kv_lora_rank + mla.qk_rope_head_dim
    shapes: Shapes = []
    if mla.q_lora_rank:  # registered as DeepseekV2Attention.__init__ does: q_a_proj, q_b_proj, q_a_layernorm
        shapes += [("q_a_proj.weight", (d, mla.q_lora_rank))] + ([("q_a_proj.bias", (mla.q_lora_rank,))] * mla.bias)
        shapes += [
            ("q_b_proj.weight", (mla.q_lora_rank, mla.query_size // tp)),
            ("q_a_layernorm.weight", (mla.q_lora_rank,)),
        ]
    else:
        shapes.append(("q_proj.weight", (d, mla.query_size // tp)))
    shapes += [("kv_a_proj_with_mqa.weight", (d, kv_a))] + ([("kv_a_proj_with_mqa.bias", (kv_a,))] * mla.bias)
    kv_b = mla.heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    shapes += [("kv_b_proj.weight", (mla.kv_lora_rank, kv_b // tp))]
    shapes += [("o_proj.weight", (mla.value_size // tp, d))] + ([("o_proj.bias", (d,))] * mla.bias)
    return shapes + [("kv_a_layernorm.weight", (mla.kv_lora_rank,))]


def _mlp_shapes(prefix: str, d: int, f: int, tp: int, gated: bool, fused_ffn: bool, bias: bool) -> Shapes:
    """One MLP of width ``f``: up (and gate) split by output columns, down by input rows."""
    if gated:
        up = [("gate_up_fused_proj", 2 * f)] if fused_ffn else [("gate_proj", f), ("up_proj", f)]
    else:
        up = [("up_proj", f)]
    mlp: Shapes = [(f"{prefix}{name}.weight", (d, _split(width, tp))) for name, width in up]
    if bias and not gated:
        mlp += [(f"{prefix}up_proj.bias", (_split(f, tp),))]
    return (
        mlp
        + [(f"{prefix}down_proj.weight", (_split(f, tp), d))]
        + ([(f"{prefix}down_proj.bias", (d,))] if bias else [])
    )


def _moe_shapes(shape: DecoderShape, tp: int, fused_ffn: bool, ep: int) -> Shapes:
    """A mixture-of-experts MLP: the SwiGLU MLP of each expert on this card (all of them, or experts / ``ep``
    under expert parallelism) split over tensor-parallel ranks like a dense one (paddlenlp's Qwen2MoeMLP and
    MixtralMLP use the same column/row parallel layers; DeepSeek-V2's experts are whole on every rank), the
    router [hidden, experts] (replicated; before the experts with ``router_first``), then the shared experts
    and Qwen2-MoE's shared-expert gate [hidden, 1]. The dense layers are ``stage_parameters``'
    (``dense_layer_ids``)."""
    d = shape.hidden_size
    router: Shapes = [("gate.weight", (d, shape.experts))] + ([("gate.bias", (shape.experts,))] * shape.router_bias)
    expert_tp = tp if shape.experts_split_by_tensor_parallel else 1
    shapes: Shapes = []
    for e in range(shape.experts // ep):
        shapes += _mlp_shapes(f"experts.{e}.", d, shape.expert_width, expert_tp, True, fused_ffn, False)
    shapes = router + shapes if shape.router_first else shapes + router
    if shape.shared_expert_width:
        shapes += _mlp_shapes("shared_expert.", d, shape.shared_expert_width, tp, True, fused_ffn, False)
    if shape.shared_expert_gate:
        shapes.append(("shared_expert_gate.weight", (d, 1)))
    return shapes


def outer_shapes(shape: DecoderShape, tp: int, pp: int) -> dict:
    """``{"embedding" | "final_norm" | "head": [(name, per-rank shape)]}``: the tensors outside the layers.

    The embedding and head are split by vocabulary rows when the vocabulary divides by ``tp``
    (``VocabParallelEmbedding``; LLaMA and Qwen2 keep a full copy otherwise). A head tied to the
    embedding has no tensor of its own, except on the last stage of a pipeline (``SharedLayerDesc``).
    """
    d, vocab = shape.hidden_size, shape.vocab_size
    vocab_rows = _split(vocab, tp) if vocab % tp == 0 else vocab
    embedding = [("embed_tokens.weight", (vocab_rows, d))]
    if shape.position_rows:
        embedding.append(("embed_positions.weight", (shape.position_rows, d)))
    final_norm = [("norm.weight", (d,))] + ([("norm.bias", (d,))] if shape.norm_has_bias else [])
    head = [] if (shape.tie_word_embeddings and pp == 1) else [("lm_head.weight", (d, vocab_rows))]
    return {"embedding": embedding, "final_norm": final_norm, "head": head}


def stage_parameters(
    shape: DecoderShape, tp: int, pp: int, virtual_pp: int, fused_qkv: bool, fused_ffn: bool, ep: int = 1
) -> list:
    """``StageParameters`` of each pipeline stage, stage 0 first (``ep``: the expert-parallel degree).

    Raises:
        ValueError: (from paddle's SegmentLayers) fewer items than stages, or virtual stages whose
            chunk count does not divide the layer count.
    """
    outer_parts = outer_shapes(shape, tp, pp)
    outer = {part: _numel(shapes) for part, shapes in outer_parts.items()}
    embedding, final_norm, head = outer["embedding"], outer["final_norm"], outer["head"]
    shapes = layer_shapes(shape, tp, fused_qkv, fused_ffn, ep)
    layer = _numel(shapes)
    layer_experts = sum(numel for (name, _), numel in zip(shapes, layer) if name.startswith("experts."))
    # a mixture of experts' dense layers (``dense_layer_ids``) hold a dense MLP
    dense_shapes = layer_shapes(
        dataclasses.replace(shape, experts=0, mlp_width=shape.dense_mlp_width), tp, fused_qkv, fused_ffn
    )
    dense_layer = _numel(dense_shapes) if shape.dense_layers else layer
    layer_replicated, final_norm_replicated = _replicated(shapes), _replicated(outer_parts["final_norm"])
    dense_replicated = _replicated(dense_shapes) if shape.dense_layers else layer_replicated

    # paddle partitions items by name: one marker object per item, as PipelineLayer's layer list.
    items = [_Item("Embedding")] + [_Item("DecoderLayer")] * shape.num_hidden_layers + [_Item("Norm"), _Item("Head")]
    layers_divide = shape.num_hidden_layers % (pp * virtual_pp) == 0
    chunks = pp * virtual_pp if layers_divide else pp
    bounds = SegmentLayers(
        items, pp, method="layer:DecoderLayer" if layers_divide else "uniform", num_virtual_pipeline_stage=virtual_pp
    ).do_segment()

    stages = []
    for stage in range(pp):
        tensors, layers, moe_layers, has_embedding, has_head, replicated = [], 0, 0, False, False, 0
        for chunk in range(stage, chunks, pp):  # interleaved: stage s runs chunks s, s + pp, ...
            for index in range(bounds[chunk], bounds[chunk + 1]):
                item = items[index]
                if item.__name__ == "Embedding":
                    tensors += embedding
                    has_embedding = True
                elif item.__name__ == "DecoderLayer":
                    dense_here = index - 1 in shape.dense_layer_ids  # items[0]: the embedding
                    tensors += dense_layer if dense_here else layer
                    layers += 1
                    moe_layers += not dense_here
                    replicated += dense_replicated if dense_here else layer_replicated
                elif item.__name__ == "Norm":
                    # DeepSeek-V3's MTP modules (pretrain.mtp), after the layers: a layer, enorm and hnorm, and
                    # eh_proj [2d, d] whole on every tensor-parallel rank
                    for _ in range(shape.prediction_layers):
                        d = shape.hidden_size
                        tensors += layer + [d, d, 2 * d * d]
                        layers += 1
                        moe_layers += 1
                        replicated += layer_replicated + 2 * d
                    tensors += final_norm
                    replicated += final_norm_replicated
                else:
                    tensors += head
                    has_head = True
        stages.append(
            StageParameters(
                tuple(tensors),
                layers,
                has_embedding,
                has_head,
                sum(layer),
                moe_layers * layer_experts,
                replicated,
                moe_layers if shape.experts else 0,
            )
        )
    return stages


REPLICATED = ("layernorm.weight", "layernorm.bias", "norm.weight", "norm.bias", "o_proj.bias", "down_proj.bias")


def _replicated(shapes: Shapes) -> int:
    """Elements of the norms and row-parallel biases among ``shapes``: the tensors every tensor-parallel rank
    holds whole, whose gradients sequence parallelism all-reduces (paddle's ``mark_as_sequence_parallel_parameter``)."""
    return sum(math.prod(dims) for name, dims in shapes if name.endswith(REPLICATED))


@dataclass(frozen=True)
class _Item:
    """A stand-in for one LayerDesc: SegmentLayers reads only ``__name__``."""

    __name__: str


def partition(tensors: tuple, degree: int, sort_by_size: bool) -> list:
    """Indices of ``tensors`` each sharding rank owns after paddle's greedy partition: each tensor goes whole
    to the rank with the fewest elements so far, in descending size for stage 1
    (``DygraphShardingOptimizer._partition_parameters``), in model order for stage 2
    (``GroupShardedOptimizerStage2._segment_params``)."""
    owned: list = [[] for _ in range(degree)]
    sizes = [0] * degree
    order = sorted(range(len(tensors)), key=lambda i: -tensors[i]) if sort_by_size else range(len(tensors))
    for index in order:
        rank = sizes.index(min(sizes))
        owned[rank].append(index)
        sizes[rank] += tensors[index]
    return owned


def sharded_numel(tensors: tuple, degree: int, sort_by_size: bool) -> int:
    """Elements of the sharding rank that owns the most, after paddle's greedy partition (``partition``)."""
    if degree <= 1:
        return sum(tensors)
    return max(sum(tensors[i] for i in indices) for indices in partition(tensors, degree, sort_by_size))


STAGE2_BUFFER_MAX = 2**23  # elements of a gradient buffer: group_sharded_parallel's default (paddlenlp passes none)
SHARDING_ALIGNMENT = {"gpu": 256, "cpu": 4096}  # bytes: paddle 3.3.1 group_sharded_utils.alignment


def aligned(numel: int, element_bytes: int, alignment: int) -> int:
    """``numel`` elements of ``element_bytes`` padded to a multiple of ``alignment`` bytes (paddle's
    group-sharded buffers: ``group_sharded_utils.alignment``)."""
    return numel + (-numel * element_bytes) % alignment // element_bytes


def stage2_buffers(tensors: tuple, degree: int, element_bytes: int, alignment: int) -> tuple:
    """(gradient elements reduced per micro-batch, parameter elements broadcast per step) of paddle 3.3.1's
    sharding stage2 over ``degree`` ranks, payload as ``pretrain.planner.communication`` counts it.

    ``GroupShardedOptimizerStage2`` pads each tensor to ``alignment`` bytes (elements of ``element_bytes``)
    and keeps each rank's parameters in one buffer, which its owner broadcasts after the update.
    ``GroupShardedStage2`` gives every rank a gradient buffer of the largest rank's padded size (at most
    ``STAGE2_BUFFER_MAX`` elements), fills it with that rank's gradients smallest first while they fit, and
    reduces each buffer whole to its owner; a gradient that does not fit is reduced alone.
    """
    owners, capacity = _stage2_owners(tensors, degree, element_bytes, alignment)
    rank_of = {index: rank for rank, indices in enumerate(owners) for index in indices}
    padded = partial(aligned, element_bytes=element_bytes, alignment=alignment)
    rank_sizes = [sum(padded(tensors[i]) for i in indices) for indices in owners]
    fill, alone = [0] * degree, 0
    for index in sorted(range(len(tensors)), key=lambda i: tensors[i]):
        rank = rank_of[index]
        if fill[rank] + padded(tensors[index]) <= capacity:
            fill[rank] += padded(tensors[index])
        else:
            alone += tensors[index]
    return capacity * sum(1 for used in fill if used) + alone, sum(rank_sizes)


def _stage2_owners(tensors: tuple, degree: int, element_bytes: int, alignment: int) -> tuple:
    """(the tensor indices each of ``degree`` sharding ranks owns, the elements of one gradient buffer: the
    largest rank's padded size, at most ``STAGE2_BUFFER_MAX``) of paddle 3.3.1's sharding stage2."""
    owners = partition(tensors, degree, sort_by_size=False)
    padded = partial(aligned, element_bytes=element_bytes, alignment=alignment)
    return owners, min(max(sum(padded(tensors[i]) for i in indices) for indices in owners), STAGE2_BUFFER_MAX)


def stage2_gradient_storage_numel(tensors: tuple, degree: int, element_bytes: int, alignment: int) -> int:
    """Elements of the gradient buffers paddle 3.3.1's ``GroupShardedStage2`` allocates on each card of a
    sharding stage2 over ``degree`` ranks: one ``GradStorage`` per rank that owns a tensor
    (``group_sharded_stage2.py`` ``_setup_use_grad_storage``, lines 564-580), each ``paddle.zeros`` of the
    largest rank's padded size capped at ``STAGE2_BUFFER_MAX`` (``_rank_buffer_size``, line 632;
    ``group_sharded_storage.py:67``). A rank that owns nothing (more ranks than tensors) gets none, so the total
    is at most the tensors' count x the cap, however many ranks."""
    owners, capacity = _stage2_owners(tensors, degree, element_bytes, alignment)
    return capacity * sum(1 for indices in owners if indices)


STAGE3_SEGMENT_SIZE = 2**20  # elements: GroupShardedStage3's default segment_size (paddlenlp passes none)


def stage3_buffers(tensors: tuple, degree: int, element_bytes: int, alignment: int) -> tuple:
    """(sliced tensors, their buffer elements, unsliced gradient-storage elements) of paddle 3.3.1's sharding
    stage3 (``GroupShardedStage3``; 3.0.0 the same) over ``degree`` ranks.

    A tensor of more than ``STAGE3_SEGMENT_SIZE`` elements is sliced: its buffer is the tensor padded to
    ``alignment`` bytes (elements of ``element_bytes``) and then to a multiple of ``degree`` elements, gathered
    whole before the forward and again before the backward, and its full gradient (a buffer of that size) is
    all-reduced per micro-batch, each rank keeping its slice (``_get_allreduce_fn``). The smaller tensors stay
    whole on every rank; their gradients, each padded to ``alignment``, sit in one storage all-reduced once a
    step (``_redefine_opt_step``)."""
    padded = partial(aligned, element_bytes=element_bytes, alignment=alignment)
    sliced = [padded(numel) + (-padded(numel)) % degree for numel in tensors if numel > STAGE3_SEGMENT_SIZE]
    unsliced = sum(padded(numel) for numel in tensors if numel <= STAGE3_SEGMENT_SIZE)
    return len(sliced), sum(sliced), unsliced


def owned_numel(tensors: tuple, degree: int, stage: int, element_bytes: int, alignment: int) -> int:
    """Elements whose optimizer states (Adam's moments, master weights) the busiest of ``degree`` sharding ranks
    owns, of a pipeline stage's ``tensors``: all of them without sharding (``stage`` 0 or ``degree`` 1); whole
    tensors by paddle's greedy ``partition`` under stage 1 and 2; under stage 3 (``GroupShardedStage3``) a
    tensor above ``STAGE3_SEGMENT_SIZE`` elements its rank's slice of the padded buffer (``stage3_buffers``;
    ``_param_storage``), a smaller one whole on every rank (``_unslice_params``: the optimizer updates it on every
    rank)."""
    if degree <= 1 or stage == 0:
        return sum(tensors)
    if stage < 3:
        return sharded_numel(tensors, degree, sort_by_size=stage == 1)
    padded = partial(aligned, element_bytes=element_bytes, alignment=alignment)
    sliced = sum((padded(n) + (-padded(n)) % degree) // degree for n in tensors if n > STAGE3_SEGMENT_SIZE)
    return sliced + sum(n for n in tensors if n <= STAGE3_SEGMENT_SIZE)


def held_elements(tensors: tuple, degree: int, stage: int, element_bytes: int, alignment: int, master: bool) -> dict:
    """``{"parameters": n, "optimizer": n}``: elements the busiest sharding rank of a pipeline stage holds between
    optimizer steps (``pretrain.optimizer_chain.held_elements`` counts them on a run). Parameters: every tensor
    but under stage 3, whose rank keeps ``owned_numel`` (the sliced tensors gathered for a layer's forward and
    backward only); optimizer states: two Adam moments per owned element, and a float32 master weight with ``master``
    (16-bit parameters under O2). Arguments as ``owned_numel``'s."""
    owned = owned_numel(tensors, degree, stage, element_bytes, alignment)
    return {"parameters": owned if degree > 1 and stage == 3 else sum(tensors), "optimizer": owned * (2 + master)}
