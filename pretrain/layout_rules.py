"""What paddle and paddlenlp require of a model, a parallel layout and the flags that go with them.

Each rule is an assertion (or a silent fallback) inside paddle's or paddlenlp's code that would
otherwise fire minutes into a GPU job, at model build or at the first step. One source for
preflight (``pretrain.preflight``: a run's layout), the forecast and the planner's search (every
candidate layout). Messages start with the key to change.
"""

from __future__ import annotations

from typing import NamedTuple

from pretrain.param_count import decoder_shape
from pretrain.registry import implementation_for


class RunFlags(NamedTuple):
    """The flags besides the layout that the rules read."""

    seq_length: int  # tokens per sample
    use_flash_attention: bool
    fuse_attention_qkv: bool
    amp_master_grad: bool
    half_precision: bool  # fp16 or bf16 AMP (any level): activations reach attention in 16 bits


def problems(config, layout, flags: RunFlags) -> list:
    """Why ``config`` cannot train in ``layout`` with ``flags``, one line each (empty: it can).

    - the degrees multiply to the card count (fleet asserts it at ``fleet.init``);
    - ``num_attention_heads`` and the MLP width divide by tensor_parallel_degree (LlamaAttention /
      QWenAttention and ``ColumnParallelLinear`` assert);
    - the vocabulary divides where the embedding is always split (GPT, QWen: ``VocabParallelEmbedding``);
    - key/value heads divide by tensor_parallel_degree with ``fuse_attention_qkv`` (LlamaAttention raises);
    - at most one decoder layer per pipeline x virtual stage, layers divisible by pipeline x virtual
      stages when virtual stages are used (paddle's ``SegmentLayers`` asserts);
    - pipeline parallel only with sharding stage1 (paddlenlp ``TrainingArguments`` raises);
    - no sharding stage3 (refused here, not by paddle): ``GroupShardedStage3`` frees every parameter
      outside its forward and backward (``_release_param``: the tensor holds no memory) and keeps
      gradients in its own buffers, sliced to this rank's shard, so the NaN guard's weight check would
      crash at the first checkpoint and its gradient check would see nothing (``pretrain.nan_guard``);
      paddlenlp also asserts stage1 or 2 with tensor parallelism (``Trainer._wrap_model``);
    - sharding stage2/3 with ``amp_master_grad`` only without plain data parallelism (``_wrap_model`` asserts);
    - heads divisible by sep_parallel_degree and the sequence by context_parallel_degree (upstream
      PaddleNLP's run_pretrain.py asserts), context parallel only with flash attention (LLaMA raises);
    - flash attention only with fp16 or bf16 (paddle registers its ``flash_attn`` GPU kernel for
      float16 and bfloat16 only, and ``scaled_dot_product_attention`` picks it without looking at the dtype);
    - sequence parallel only with tensor parallelism (upstream asserts).
    """
    found = []
    tp, pp, vpp = layout.tensor_parallel_degree, layout.pipeline_parallel_degree, layout.virtual_pp_degree
    product = (
        tp
        * pp
        * layout.sharding_parallel_degree
        * layout.data_parallel_degree
        * layout.sep_parallel_degree
        * layout.context_parallel_degree
    )
    if product != layout.world_size:
        found.append(
            f"sharding_parallel_degree: the parallel degrees multiply to {product}, not the {layout.world_size} "
            "cards; set degrees whose product is the card count (or -1 to let paddlenlp derive sharding)"
        )
    heads = config.num_attention_heads
    if tp > 1:
        for name, value in (
            ("num_attention_heads", heads),
            ("intermediate_size (MLP width)", decoder_shape(config).mlp_width),
        ):
            if value % tp:
                found.append(f"tensor_parallel_degree: {tp} does not divide {name} {value}; choose a divisor")
        if config.vocab_size % tp and not implementation_for(config.model_type).vocab_replicated_when_indivisible:
            found.append(
                f"vocab_size: {config.vocab_size} is not divisible by tensor_parallel_degree {tp}; "
                "unset vocab_size (the default pads the tokenizer's vocabulary to a multiple of 128)"
            )
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        if kv_heads % tp and flags.fuse_attention_qkv:
            found.append(
                f"fuse_attention_qkv: {kv_heads} key/value heads do not divide over tensor_parallel_degree {tp}; "
                "set fuse_attention_qkv false (paddlenlp then replicates K/V) or choose a divisor"
            )
    layers = config.num_hidden_layers
    if pp * vpp > layers:
        found.append(
            f"pipeline_parallel_degree: {pp} stages x {vpp} virtual stages exceed the {layers} layers; lower them"
        )
    elif vpp > 1 and layers % (pp * vpp):
        found.append(
            f"virtual_pp_degree: {layers} layers do not divide into {pp} pipeline stages x {vpp} virtual stages; "
            "choose degrees whose product divides num_hidden_layers"
        )
    sharded = layout.sharding_parallel_degree > 1 and layout.sharding_stage > 0
    if pp > 1 and sharded and layout.sharding_stage >= 2:
        found.append(
            f"sharding: pipeline parallelism works with sharding stage1 only, not stage{layout.sharding_stage}"
        )
    if sharded and layout.sharding_stage == 3:
        found.append(
            "sharding: stage3 is not supported (the NaN guard cannot check the parameters and gradients it "
            "releases); use stage2, which shards gradients and optimizer states, or stage1"
        )
    if flags.amp_master_grad and sharded and layout.sharding_stage >= 2 and layout.data_parallel_degree > 1:
        found.append(
            f"sharding_parallel_degree: sharding stage{layout.sharding_stage} with amp_master_grad does not "
            f"support {layout.data_parallel_degree} plain data-parallel replicas; shard over them too "
            "(sharding_parallel_degree -1) or set amp_master_grad false"
        )
    if layout.sep_parallel_degree > 1 and heads % layout.sep_parallel_degree:
        found.append(f"sep_parallel_degree: {layout.sep_parallel_degree} does not divide num_attention_heads {heads}")
    cp = layout.context_parallel_degree
    if cp > 1 and flags.seq_length % cp:
        found.append(f"context_parallel_degree: {cp} does not divide max_seq_length {flags.seq_length}")
    if flags.use_flash_attention and not flags.half_precision:
        found.append(
            "use_flash_attention: flash attention runs in fp16 or bf16 only; set bf16 true (or fp16 true), "
            "or use_flash_attention false"
        )
    if cp > 1 and not flags.use_flash_attention:
        found.append("context_parallel_degree: context parallelism needs use_flash_attention true")
    if layout.sequence_parallel and tp == 1:
        found.append("sequence_parallel: needs tensor_parallel_degree > 1 (it splits activations over TP ranks)")
    return found


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
