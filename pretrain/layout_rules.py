"""What paddle and paddlenlp require of a model, a parallel layout and the flags that go with them.

Each rule is an assertion (or a silent fallback) inside paddle's or paddlenlp's code that would
otherwise fire minutes into a GPU job, at model build or at the first step. One source for
preflight (``pretrain.preflight``: a run's layout), the forecast and the planner's search (every
candidate layout). Messages start with the key to change.
"""

from __future__ import annotations

from typing import NamedTuple

from pretrain.mtp import prediction_depth
from pretrain.param_count import decoder_shape, experts_text
from pretrain.precision import Precision
from pretrain.registry import implementation_for


class RunFlags(NamedTuple):
    """The flags besides the layout that the rules read."""

    seq_length: int  # tokens per sample
    use_flash_attention: bool
    fuse_attention_qkv: bool
    amp_master_grad: bool  # float32 main gradients under 16-bit AMP (any level: paddlenlp keeps it at O1 too)
    half_precision: bool  # fp16 or bf16 AMP (any level): activations reach attention in 16 bits

    @classmethod
    def of(cls, seq_length: int, precision: Precision, use_flash_attention, fuse_attention_qkv) -> RunFlags:
        """The flags of a run (``pretrain.preflight``) or a planner workload: the one place they are built.

        Args:
            seq_length: tokens per sample.
            precision: the run's ``Precision``.
            use_flash_attention, fuse_attention_qkv: the kernel flags as the model config holds them
                after ``pretrain.model_config.build_model_config`` (None counts as false).
        """
        return cls(
            seq_length=seq_length,
            use_flash_attention=bool(use_flash_attention),
            fuse_attention_qkv=bool(fuse_attention_qkv),
            amp_master_grad=precision.amp_master_grad,
            half_precision=precision.half,
        )


def _degrees_multiply_to_the_cards(config, layout, flags: RunFlags) -> list:
    """The degrees multiply to the card count (fleet asserts it at ``fleet.init``)."""
    product = (
        layout.tensor_parallel_degree
        * layout.pipeline_parallel_degree
        * layout.sharding_parallel_degree
        * layout.data_parallel_degree
        * layout.sep_parallel_degree
        * layout.context_parallel_degree
    )
    if product == layout.world_size:
        return []
    return [
        f"sharding_parallel_degree: the parallel degrees multiply to {product}, not the {layout.world_size} "
        "cards; set degrees whose product is the card count (or -1 to let paddlenlp derive sharding)"
    ]


def _tensor_parallel_divides_heads_and_mlp(config, layout, flags: RunFlags) -> list:
    """``num_attention_heads`` and the MLP width divide by tensor_parallel_degree (LlamaAttention /
    QWenAttention and ``ColumnParallelLinear`` assert)."""
    tp = layout.tensor_parallel_degree
    if tp == 1:
        return []
    sizes = (
        ("num_attention_heads", config.num_attention_heads),
        ("intermediate_size (MLP width)", decoder_shape(config).mlp_width),
    )
    return [
        f"tensor_parallel_degree: {tp} does not divide {name} {value}; choose a divisor"
        for name, value in sizes
        if value % tp
    ]


def _vocabulary_divides_where_always_split(config, layout, flags: RunFlags) -> list:
    """The vocabulary divides by tensor_parallel_degree where the embedding is always split (GPT,
    QWen: ``VocabParallelEmbedding``)."""
    tp = layout.tensor_parallel_degree
    if tp == 1 or not config.vocab_size % tp or implementation_for(config.model_type).vocab_replicated_when_indivisible:
        return []
    return [
        f"vocab_size: {config.vocab_size} is not divisible by tensor_parallel_degree {tp}; "
        "unset vocab_size (the default pads the tokenizer's vocabulary to a multiple of 128)"
    ]


def _fused_qkv_divides_key_value_heads(config, layout, flags: RunFlags) -> list:
    """Key/value heads divide by tensor_parallel_degree with ``fuse_attention_qkv`` (LlamaAttention raises)."""
    tp = layout.tensor_parallel_degree
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    if tp == 1 or not kv_heads % tp or not flags.fuse_attention_qkv:
        return []
    return [
        f"fuse_attention_qkv: {kv_heads} key/value heads do not divide over tensor_parallel_degree {tp}; "
        "set fuse_attention_qkv false (paddlenlp then replicates K/V) or choose a divisor"
    ]


def _pipeline_stages_fit_the_layers(config, layout, flags: RunFlags) -> list:
    """At most one decoder layer per pipeline x virtual stage; layers divisible by pipeline x virtual
    stages when virtual stages are used (paddle's ``SegmentLayers`` asserts)."""
    pp, vpp, layers = layout.pipeline_parallel_degree, layout.virtual_pp_degree, config.num_hidden_layers
    if pp * vpp > layers:
        return [f"pipeline_parallel_degree: {pp} stages x {vpp} virtual stages exceed the {layers} layers; lower them"]
    if vpp > 1 and layers % (pp * vpp):
        return [
            f"virtual_pp_degree: {layers} layers do not divide into {pp} pipeline stages x {vpp} virtual stages; "
            "choose degrees whose product divides num_hidden_layers"
        ]
    return []


def _pipeline_needs_a_pipe_class(config, layout, flags: RunFlags) -> list:
    """Pipeline parallelism runs the model type's ``*Pipe`` class; paddlenlp 3.0.0b4 has none for some
    (Mixtral: ``registry.Implementation.pipe_class`` None). A mixture of experts is refused too: its
    load-balancing loss is added in ``PretrainingTrainer.compute_loss``, which the pipeline schedule
    does not call (``pretrain.routing``)."""
    pp, impl = layout.pipeline_parallel_degree, implementation_for(config.model_type)
    if pp > 1 and impl.pipe_class is None:
        return [
            f"pipeline_parallel_degree: {pp}, but paddlenlp has no pipeline-parallel class for model_type "
            f"{config.model_type!r}; use 1 (tensor parallel and sharding instead)"
        ]
    if pp > 1 and impl.routing is not None:
        return [
            f"pipeline_parallel_degree: {pp}, but a mixture of experts ({config.model_type}) adds its "
            "load-balancing loss outside the pipeline schedule; use 1 (tensor parallel and sharding instead)"
        ]
    return []


def _sharded(layout) -> bool:
    """Whether optimizer states are sharded at all (a sharding stage over more than one rank)."""
    return layout.sharding_parallel_degree > 1 and layout.sharding_stage > 0


def _pipeline_with_sharding_stage1_only(config, layout, flags: RunFlags) -> list:
    """Pipeline parallel only with sharding stage1 (paddlenlp ``TrainingArguments`` raises)."""
    if layout.pipeline_parallel_degree > 1 and _sharded(layout) and layout.sharding_stage >= 2:
        return [f"sharding: pipeline parallelism works with sharding stage1 only, not stage{layout.sharding_stage}"]
    return []


def _sharding_stage3_without_tensor_parallel(config, layout, flags: RunFlags) -> list:
    """Sharding stage3 only without tensor parallelism (paddlenlp's ``Trainer._wrap_model`` asserts
    "Only support tensor parallel + sharding stage1/stage2")."""
    if _sharded(layout) and layout.sharding_stage == 3 and layout.tensor_parallel_degree > 1:
        return [
            "sharding: stage3 does not combine with tensor parallelism (paddlenlp supports stage1 or stage2 "
            "there); use stage2, which shards gradients and optimizer states, or tensor_parallel_degree 1"
        ]
    return []


def _master_grad_sharding_without_data_parallel(config, layout, flags: RunFlags) -> list:
    """Sharding stage2/3 with ``amp_master_grad`` only without plain data parallelism (``_wrap_model`` asserts)."""
    if not (
        flags.amp_master_grad and _sharded(layout) and layout.sharding_stage >= 2 and layout.data_parallel_degree > 1
    ):
        return []
    return [
        f"sharding_parallel_degree: sharding stage{layout.sharding_stage} with amp_master_grad does not "
        f"support {layout.data_parallel_degree} plain data-parallel replicas; shard over them too "
        "(sharding_parallel_degree -1) or set amp_master_grad false"
    ]


def _sep_divides_heads(config, layout, flags: RunFlags) -> list:
    """Heads divisible by sep_parallel_degree (upstream PaddleNLP's run_pretrain.py asserts)."""
    sep, heads = layout.sep_parallel_degree, config.num_attention_heads
    return (
        [f"sep_parallel_degree: {sep} does not divide num_attention_heads {heads}"] if sep > 1 and heads % sep else []
    )


def _context_parallel_divides_the_sequence(config, layout, flags: RunFlags) -> list:
    """The sequence divisible by context_parallel_degree (upstream PaddleNLP's run_pretrain.py asserts)."""
    cp = layout.context_parallel_degree
    if cp > 1 and flags.seq_length % cp:
        return [f"context_parallel_degree: {cp} does not divide max_seq_length {flags.seq_length}"]
    return []


def _flash_attention_in_half_precision(config, layout, flags: RunFlags) -> list:
    """Flash attention only with fp16 or bf16 (paddle registers its ``flash_attn`` GPU kernel for
    float16 and bfloat16 only, and ``scaled_dot_product_attention`` picks it without looking at the dtype)."""
    if flags.use_flash_attention and not flags.half_precision:
        return [
            "use_flash_attention: flash attention runs in fp16 or bf16 only; set bf16 true (or fp16 true), "
            "or use_flash_attention false"
        ]
    return []


def _context_parallel_needs_flash_attention(config, layout, flags: RunFlags) -> list:
    """Context parallel only with flash attention (LLaMA raises)."""
    if layout.context_parallel_degree > 1 and not flags.use_flash_attention:
        return ["context_parallel_degree: context parallelism needs use_flash_attention true"]
    return []


def _sequence_parallel_needs_tensor_parallel(config, layout, flags: RunFlags) -> list:
    """Sequence parallel only with tensor parallelism (upstream asserts)."""
    if layout.sequence_parallel and layout.tensor_parallel_degree == 1:
        return ["sequence_parallel: needs tensor_parallel_degree > 1 (it splits activations over TP ranks)"]
    return []


def _experts_without_sequence_parallel(config, layout, flags: RunFlags) -> list:
    """No sequence parallelism for a mixture of experts: paddlenlp 3.0.0b4's ``MoELayer.forward`` unpacks a
    [batch, seq, hidden] input (``transformers/moe_layer.py:244``) and Mixtral's sparse block likewise
    (``mixtral/modeling.py:501``), but sequence parallelism hands them this TP rank's [seq x batch / tp, hidden]
    shard: a crash at the first forward (and each TP rank would route other tokens)."""
    if layout.sequence_parallel and implementation_for(config.model_type).routing is not None:
        return [
            f"sequence_parallel: {config.model_type}'s MoE layers take [batch, seq, hidden] inputs, not the 2-D "
            "sequence shards of sequence parallelism; set sequence_parallel false (tensor parallelism alone works)"
        ]
    return []


def _skipped_experts_without_sharding_stage3(config, layout, flags: RunFlags) -> list:
    """No sharding stage3 where the MoE block runs only the experts some token chose
    (``Routing.skips_idle_experts``): paddle's ``GroupShardedStage3`` gathers each layer's parameters in a
    forward hook and reduces its gradients in a backward hook, collectives every rank must call alike; a rank
    whose tokens chose other experts calls others, and the run hangs (measured: Mixtral, sharding stage3 x 2 on
    CPU, a gloo timeout in the first backward, 4 runs of 4; on GPU NCCL waits until its watchdog)."""
    routing = implementation_for(config.model_type).routing
    if _sharded(layout) and layout.sharding_stage == 3 and routing is not None and routing.skips_idle_experts:
        return [
            f"sharding: stage3 hangs with {config.model_type}: {routing.skips_idle_experts}, so ranks call "
            "stage3's per-layer gathers for different experts; use sharding stage2 (gradients and optimizer "
            "states sharded) or stage1"
        ]
    return []


def _multi_token_prediction_without_sequence_splits(config, layout, flags: RunFlags) -> list:
    """No sep or context parallelism with DeepSeek's multi-token prediction (``pretrain.mtp``): paddlenlp's
    ``DeepseekV2Model.forward`` takes the D tokens its MTP depths read off the end of the input it is given
    (deepseek_v2/modeling.py:1643), which would be each rank's piece of the sequence, not the sample's."""
    depth = prediction_depth(config)
    for key, degree in (
        ("sep_parallel_degree", layout.sep_parallel_degree),
        ("context_parallel_degree", layout.context_parallel_degree),
    ):
        if depth and degree > 1:
            return [
                f"{key}: {degree} splits each sample's sequence, but the multi-token prediction of "
                f"{config.model_type} (num_nextn_predict_layers {depth}) reads the tokens past the whole sample; "
                f"set {key} 1, or num_nextn_predict_layers 0"
            ]
    return []


# Each rule: (model config, layout, RunFlags) -> its problems, one line each; checked in this order.
RULES = (
    _degrees_multiply_to_the_cards,
    _tensor_parallel_divides_heads_and_mlp,
    _vocabulary_divides_where_always_split,
    _fused_qkv_divides_key_value_heads,
    _pipeline_stages_fit_the_layers,
    _pipeline_needs_a_pipe_class,
    _pipeline_with_sharding_stage1_only,
    _sharding_stage3_without_tensor_parallel,
    _master_grad_sharding_without_data_parallel,
    _sep_divides_heads,
    _context_parallel_divides_the_sequence,
    _flash_attention_in_half_precision,
    _context_parallel_needs_flash_attention,
    _sequence_parallel_needs_tensor_parallel,
    _experts_without_sequence_parallel,
    _skipped_experts_without_sharding_stage3,
    _multi_token_prediction_without_sequence_splits,
)


def problems(config, layout, flags: RunFlags) -> list:
    """Why ``config`` cannot train in ``layout`` with ``flags``, one line each (empty: it can): every
    rule of ``RULES``, each a small function whose docstring names the paddle or paddlenlp check it
    anticipates."""
    return [line for rule in RULES for line in rule(config, layout, flags)]


def replications(config, layout) -> list:
    """What paddlenlp keeps whole on every tensor-parallel rank because it does not divide, one line
    each: key/value heads (LLaMA family, Qwen2) and the vocabulary (LLaMA family, Qwen2)."""
    found = []
    tp = layout.tensor_parallel_degree
    if tp == 1:
        return found
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    if kv_heads % tp:
        found.append(
            f"num_key_value_heads: {kv_heads} key/value heads do not divide over tensor_parallel_degree {tp}; "
            "paddlenlp keeps all of them on every rank"
        )
    if config.vocab_size % tp and implementation_for(config.model_type).vocab_replicated_when_indivisible:
        found.append(
            f"vocab_size: {config.vocab_size} is not divisible by tensor_parallel_degree {tp}; the embedding and "
            "LM head are not split (a full copy on every rank)"
        )
    return found


def expert_parallel_problems(config, layout) -> list:
    """Why ``config``'s experts cannot be spread over ``layout``'s data-parallel ranks (``use_expert_parallel``),
    one line each (empty: they can), as this app runs expert parallelism: paddlenlp 3.0.0b4's ``MoELayer`` takes
    the data-parallel group as its expert-parallel group (``transformers/moe_layer.py:163``), asserts that the
    experts divide over it (line 200), and Mixtral's block is no ``MoELayer`` (``registry.Routing.no_expert_parallel``);
    it is verified beside data parallelism and sharding stage1 (tests/test_expert_parallel.py). One source for
    the preflight (``check_expert_parallel``, which adds the fleet-group condition of a real launch) and the
    planner."""
    routing = implementation_for(config.model_type).routing
    if routing is None:
        return ["use_expert_parallel: the model has no experts; set it false"]
    if routing.no_expert_parallel:
        return [f"use_expert_parallel: {routing.no_expert_parallel}; set it false"]
    if max(layout.tensor_parallel_degree, layout.pipeline_parallel_degree) > 1 or (
        layout.sharding_parallel_degree > 1 and layout.sharding_stage != 1
    ):
        return [
            f"use_expert_parallel: verified beside data parallelism and sharding stage1, not with {layout.name}; "
            "use those only, or set it false"
        ]
    experts, ranks = decoder_shape(config).experts, layout.data_parallel_degree
    if ranks == 1 and layout.world_size > 1:
        return [
            f"use_expert_parallel: {layout.world_size} ranks with 1 data-parallel rank leave every expert on "
            "every rank, and "
            "paddlenlp's unified checkpoint cannot save such a run (unified_checkpoint/utils.py:687 "
            "rename_shard_file numbers the shards over the tensor, pipeline and data groups only: ValueError at "
            "the first save); set it false, or launch data-parallel ranks"
        ]
    if ranks > 1 and experts % ranks:
        return [
            f"use_expert_parallel: the {experts_text(experts)} {'does' if experts == 1 else 'do'} not divide over the "
            f"{ranks} data-parallel ranks "
            f"(paddlenlp's expert-parallel degree is the data-parallel degree); launch a number of ranks that "
            f"divides {experts}"
        ]
    return []


def expert_parallel_degree(layout, use_expert_parallel: bool) -> int:
    """Ranks one MoE layer's experts are spread over: the data-parallel degree under ``use_expert_parallel``
    (paddlenlp's ``MoELayer``), else 1 (every expert on every rank)."""
    return layout.data_parallel_degree if use_expert_parallel else 1
