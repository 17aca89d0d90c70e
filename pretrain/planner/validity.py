"""Whether paddlenlp can run a Workload at all: divisibility, degree products, unsupported combinations.

The rules are paddlenlp's and paddle's own checks (cited per rule), found before a GPU is spent.
"""

from __future__ import annotations

from pretrain.param_count import decoder_shape


def problems(workload) -> list:
    """Sentences naming each reason the workload cannot run; empty when it can."""
    config, layout = workload.model_config, workload.layout
    shape = decoder_shape(config)
    tp, pp, v = layout.tensor_parallel_degree, layout.pipeline_parallel_degree, layout.virtual_pp_degree
    sharded = layout.sharding_parallel_degree > 1 and layout.sharding_stage > 0
    found = []
    product = (
        tp
        * pp
        * layout.sharding_parallel_degree
        * layout.data_parallel_degree
        * layout.sep_parallel_degree
        * layout.context_parallel_degree
    )
    if product != layout.world_size:
        found.append(f"the parallel degrees multiply to {product}, not the {layout.world_size} cards")
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    # Column/row-parallel layers split heads, MLP width and vocabulary evenly (paddle mp_layers asserts).
    for what, count in (
        ("attention heads", config.num_attention_heads),
        ("key/value heads", kv_heads),
        ("MLP width", shape.mlp_width),
        ("vocabulary", shape.vocab_size),
    ):
        if count % tp:
            found.append(f"{what} ({count}) is not divisible by tensor_parallel_degree {tp}")
    if pp > 1 and shape.num_hidden_layers + 3 < pp:
        found.append(f"{shape.num_hidden_layers} layers cannot fill {pp} pipeline stages")
    if v > 1 and (pp == 1 or shape.num_hidden_layers % (pp * v)):
        found.append(
            f"virtual_pp_degree {v} needs pipeline parallelism and layers ({shape.num_hidden_layers}) divisible by "
            f"pipeline x virtual degree ({pp * v}) (paddle SegmentLayers)"
        )
    if pp > 1 and sharded and layout.sharding_stage >= 2:
        found.append("pipeline parallel is not compatible with sharding stage2 or stage3 (paddlenlp TrainingArguments)")
    if tp > 1 and pp == 1 and sharded and layout.sharding_stage == 3:
        found.append("tensor parallel works with sharding stage1 or stage2 only (paddlenlp Trainer._wrap_model)")
    if workload.amp_master_grad and sharded and layout.sharding_stage >= 2 and layout.data_parallel_degree > 1:
        found.append("sharding stage2/3 with amp_master_grad does not support data parallelism (paddlenlp Trainer)")
    if workload.use_flash_attention and workload.precision == "fp32":
        found.append("flash attention needs fp16 or bf16")
    return found
