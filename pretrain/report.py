"""What a resolved run is: the dry run of ``run_pretrain.py --dry_run true`` and the plan of
``tools/plan.py`` (text, and JSON for scripts), the short header a run prints, and the full
configuration it writes to ``<output_dir>/run_config.json``."""

from __future__ import annotations

import dataclasses
import json
import os

from pretrain.atomic import atomic_outputs
from pretrain.checkpoint import checkpoint_bytes
from pretrain.corpus import index_counts, prefix_format, summarize_prefix
from pretrain.data import num_samples_per_split
from pretrain.document_mask import describe as describe_documents
from pretrain.lr_schedule import describe_schedule
from pretrain.metrics.summary import precision
from pretrain.param_count import decoder_shape
from pretrain.planner.parameters import layer_shapes, outer_shapes, stage_parameters
from pretrain.registry import implementation_for

GIB = 2**30
# Model config fields shown in the dry run: the architecture as built.
CONFIG_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "seq_length",
)


def non_default(args) -> dict:
    """Fields of a dataclass instance whose value differs from the field's default (JSON-safe values)."""
    changed = {}
    for f in dataclasses.fields(args):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        value = getattr(args, f.name, None)
        value = getattr(value, "value", value)  # enums (paddlenlp's IntervalStrategy, ...) by their value
        if value != default and value != getattr(default, "value", default):
            changed[f.name] = value if isinstance(value, (bool, int, float, str, type(None))) else str(value)
    return changed


def format_dry_run(plan, predicted=None) -> str:
    """The dry-run text of a checked ``RunPlan``: resolved arguments (non-default), model size,
    layout and batch, checkpoint size, resume point, data, and the planner's ``predicted`` Estimate
    for this process's GPU when there is one."""
    args, config, layout = plan.training_args, plan.model_config, plan.layout
    resolved = {
        "model": non_default(plan.model_args),
        "data": non_default(plan.data_args),
        "training": non_default(args),
        # QWen v1 has no num_key_value_heads (every head has its own K and V)
        "model_config": {name: getattr(config, name, None) for name in CONFIG_FIELDS},
    }
    train_samples = num_samples_per_split(args, layout)[0]
    lines = [
        "dry run: preflight passed",
        "resolved arguments (values that differ from the defaults):",
        json.dumps(resolved, indent=2),
        f"model: {plan.num_parameters:,} parameters ({plan.num_parameters / 1e6:.2f} M, counted from the config)",
        f"layout {layout.name} on {layout.world_size} card(s), data-parallel replicas {layout.dataset_world_size}; "
        f"global batch {plan.global_batch_samples} samples = {plan.global_batch_tokens:,} tokens per step; "
        f"{train_samples:,} train samples for {args.max_steps} steps",
        f"one checkpoint: about {checkpoint_bytes(plan.num_parameters, args) / GIB:.3f} GiB in {args.output_dir}",
        f"resume from: {plan.resume_checkpoint or 'nothing (fresh start)'}",
        "data:",
    ]
    for source in plan.data:
        d = summarize_prefix(source.prefix, plan.data_args.split)
        lines.append(
            f"  {d.prefix} (weight {source.weight:g}): {d.documents} documents, {d.tokens} tokens, dtype {d.dtype}, "
            f"split documents [train, valid, test] {d.split_documents}, "
            f"max token id {d.max_token_id} ({d.max_token_id_source})"
        )
    if predicted is not None:
        lines += format_parameters(plan) + format_estimate(predicted)
    return "\n".join(lines)


RUN_CONFIG_FILE = "run_config.json"


def format_data_mix(mix: dict, sources: list) -> str:
    """The header line of a blend's realized mix (``pretrain.data.data_mix``) beside its normalised weights."""
    total = sum(source.weight for source in sources)
    weights = {source.prefix: source.weight / total for source in sources}
    shares = [f"{prefix} {100 * share:.1f}% (weight {100 * weights[prefix]:.1f}%)" for prefix, share in mix.items()]
    return "data mix (realized share of training tokens): " + ", ".join(shares)


HEADER_MAX_DATA_SOURCES = 3  # data sources named one per line in the header; the rest are counted


def _data_line(source) -> str:
    """``<prefix> (weight w, N documents, T tokens)`` from the index alone (no token scan)."""
    weight = f"weight {source.weight:g}, " if source.weight != 1 else ""
    if prefix_format(source.prefix) != (".bin", ".idx"):
        return f"{source.prefix} ({weight}older _ids.npy/_idx.npz format)"
    documents, tokens, _ = index_counts(source.prefix)
    return f"{source.prefix} ({weight}{documents:,} documents, {tokens / 1e6:.2f} M tokens)"


def _strategy(value) -> str:
    """A paddlenlp IntervalStrategy (or its string) as a plain string: "no", "steps" or "epoch"."""
    return str(getattr(value, "value", value))


def format_header(plan) -> list:
    """The lines a run prints before it builds anything: model, layout and batch, data, schedule, output.

    Everything else resolved about the run is in ``<output_dir>/run_config.json`` (``run_config``).
    """
    args, config, layout = plan.training_args, plan.model_config, plan.layout
    steps = args.max_steps
    resume = plan.resume_checkpoint or "nothing (fresh start)"
    sources = [_data_line(source) for source in plan.data[:HEADER_MAX_DATA_SOURCES]]
    if len(plan.data) > HEADER_MAX_DATA_SOURCES:
        sources.append(f"and {len(plan.data) - HEADER_MAX_DATA_SOURCES} more")
    evaluation = f"eval every {args.eval_steps} steps" if args.do_eval else "no evaluation"
    if args.do_eval and _strategy(args.evaluation_strategy) == "no":
        evaluation = "eval at the end"
    saving = f"checkpoint every {args.save_steps} steps" if _strategy(args.save_strategy) != "no" else "no checkpoints"
    documents = describe_documents(plan.data_args, args.use_flash_attention)
    documents = f"; {documents}" if documents else ""
    return [
        f"model: {plan.model_args.model_name_or_path} ({config.model_type}), {plan.num_parameters / 1e6:,.2f} M "
        f"parameters: {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_attention_heads} heads, vocab {config.vocab_size:,}; {precision(args)}",
        f"layout: {layout.name} on {layout.world_size} card(s); global batch {plan.global_batch_samples} x "
        f"{plan.seq_length} = {plan.global_batch_tokens:,} tokens; {steps} steps = "
        f"{steps * plan.global_batch_tokens:,} tokens",
        f"data: {'; '.join(sources)}; split {plan.data_args.split}{documents}",
        f"schedule: {describe_schedule(args)}; {evaluation}, {saving}",
        f"output: {args.output_dir} (every setting: {RUN_CONFIG_FILE}); resume from {resume}",
    ]


def _json_safe(value):
    """``value`` with enums by their value and anything JSON cannot hold as its string."""
    value = getattr(value, "value", value)
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    return str(value)


def run_config(plan) -> dict:
    """The full resolved configuration of a ``RunPlan``: every argument (defaults included), the model
    config as built, the parallel layout, batch, data sources and resume point."""
    return {
        "model_arguments": _json_safe(dataclasses.asdict(plan.model_args)),
        "data_arguments": _json_safe(dataclasses.asdict(plan.data_args)),
        "training_arguments": _json_safe(plan.training_args.to_dict()),
        "model_config": _json_safe(plan.model_config.to_dict()),
        "num_parameters": plan.num_parameters,
        "layout": {"name": plan.layout.name, **dataclasses.asdict(plan.layout)},
        "global_batch_samples": plan.global_batch_samples,
        "global_batch_tokens": plan.global_batch_tokens,
        "data_sources": [{"weight": source.weight, "prefix": source.prefix} for source in plan.data],
        "resume_checkpoint": plan.resume_checkpoint,
    }


def write_run_config(plan) -> str:
    """Write ``run_config(plan)`` to ``<output_dir>/run_config.json`` (atomically); return the path."""
    output_dir = plan.training_args.output_dir
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, RUN_CONFIG_FILE)
    with atomic_outputs(path) as (tmp_path,):
        with open(tmp_path, "w", encoding="utf-8") as f:
            json.dump(run_config(plan), f, indent=2)
            f.write("\n")
    return path


def format_estimate(estimate) -> list:
    """Lines describing a planner ``Estimate``: memory per pipeline stage with its terms, speed with its terms."""
    lines = [
        f"predicted (pretrain.planner): {estimate.tokens_per_card_per_sec:,.0f} tokens/card/s, MFU "
        f"{estimate.mfu:.1%}, {estimate.step_seconds:.2f} s per step; peak {estimate.peak_memory_gib:.1f} of "
        f"{estimate.usable_memory_gib:.1f} GiB per card ({'fits' if estimate.fits else 'DOES NOT FIT'})",
        "  memory per card, GiB (device, as nvidia-smi shows; max_memory_allocated in brackets):",
    ]
    for stage, (device, allocated, terms) in enumerate(
        zip(estimate.memory_gib, estimate.allocated_gib, estimate.memory_breakdown)
    ):
        shown = ", ".join(f"{name} {value:.2f}" for name, value in terms.items() if value >= 0.005)
        lines.append(f"    stage {stage}: {device:.1f} [{allocated:.1f}] = {shown}")
    shown = ", ".join(
        f"{name} {value / estimate.step_seconds:.0%}" for name, value in estimate.time_breakdown.items() if value > 0
    )
    lines.append(f"  step time: {shown}")
    return lines


def _parameter_layout(plan) -> tuple:
    """``(DecoderShape, tp, pp, fused_qkv, fused_ffn)`` of a plan, as ``pretrain.planner.parameters`` takes them."""
    config, layout = plan.model_config, plan.layout
    fused_qkv = implementation_for(config.model_type).fused_qkv(getattr(config, "fuse_attention_qkv", False))
    fused_ffn = bool(getattr(config, "fuse_attention_ffn", False))
    return decoder_shape(config), layout.tensor_parallel_degree, layout.pipeline_parallel_degree, fused_qkv, fused_ffn


def _stages(plan) -> list:
    """``StageParameters`` of each pipeline stage of a plan, stage 0 first."""
    shape, tp, pp, fused_qkv, fused_ffn = _parameter_layout(plan)
    return stage_parameters(shape, tp, pp, plan.layout.virtual_pp_degree, fused_qkv, fused_ffn)


def format_parameters(plan) -> list:
    """Lines with the per-rank parameter shapes of one decoder layer, the embedding and head, and the
    parameters each pipeline stage holds on one card (``pretrain.planner.parameters``)."""
    shape, tp, pp, fused_qkv, fused_ffn = _parameter_layout(plan)
    outer = outer_shapes(shape, tp, pp)
    lines = [f"parameter shapes on one card (tensor_parallel_degree {tp}; [in, out] for weights):"]
    layer = layer_shapes(shape, tp, fused_qkv, fused_ffn)
    lines.append("  each decoder layer: " + ", ".join(f"{name} {list(dims)}" for name, dims in layer))
    for part in ("embedding", "final_norm", "head"):
        if outer[part]:
            lines.append(f"  {part}: " + ", ".join(f"{name} {list(dims)}" for name, dims in outer[part]))
    for index, stage in enumerate(_stages(plan)):
        parts = [f"{stage.decoder_layers} layers"]
        parts += ["embedding"] * stage.has_embedding + ["norm + head"] * stage.has_head
        lines.append(f"  pipeline stage {index}: {stage.numel:,} parameters per card ({' + '.join(parts)})")
    return lines


def format_cluster_plan(cluster) -> str:
    """The human-readable plan of a ``pretrain.forecast.ClusterPlan``."""
    plan, gpu, layout, args = cluster.run, cluster.gpu, cluster.run.layout, cluster.run.training_args
    per_replica = plan.global_batch_samples // layout.dataset_world_size
    lines = [
        f"plan: {layout.nnodes} x {layout.nproc_per_node} {gpu.part} ({gpu.memory_gib:.1f} GiB, "
        f"{gpu.peak_flops_per_sec / 1e12:.0f} TFLOP/s dense bf16/fp16): preflight passed",
        f"layout {layout.name}: tensor {layout.tensor_parallel_degree}, pipeline {layout.pipeline_parallel_degree} "
        f"(virtual {layout.virtual_pp_degree}), sharding stage {layout.sharding_stage} over "
        f"{layout.sharding_parallel_degree}, data {layout.data_parallel_degree}, sep {layout.sep_parallel_degree}, "
        f"context {layout.context_parallel_degree}, sequence parallel {'on' if layout.sequence_parallel else 'off'}",
        f"global batch {plan.global_batch_samples} samples x {plan.seq_length} tokens = {plan.global_batch_tokens:,} "
        f"tokens per step; each of {layout.dataset_world_size} data ranks reads {per_replica} samples "
        f"({args.per_device_train_batch_size} per micro batch x {args.gradient_accumulation_steps} accumulation)",
        f"model {plan.model_args.model_name_or_path}: {plan.num_parameters:,} parameters, vocabulary "
        f"{plan.model_config.vocab_size}",
        *format_parameters(plan),
    ]
    if cluster.estimate is not None:
        lines += format_estimate(cluster.estimate)
    lines += [f"warning: {line}" for line in cluster.warnings]
    lines += [f"note: {line}" for line in plan.notes]
    return "\n".join(lines)


def cluster_plan_json(cluster) -> dict:
    """The machine-readable plan: layout, batch, parameters per card, and the planner's predictions
    (null where the planner gives no estimate). Memory in GiB per card, one entry per pipeline stage."""
    plan, layout, estimate = cluster.run, cluster.run.layout, cluster.estimate
    stages = _stages(plan)
    return {
        "layout": {
            "tensor_parallel_degree": layout.tensor_parallel_degree,
            "pipeline_parallel_degree": layout.pipeline_parallel_degree,
            "virtual_pp_degree": layout.virtual_pp_degree,
            "sharding_stage": layout.sharding_stage,
            "sharding_parallel_degree": layout.sharding_parallel_degree,
            "data_parallel_degree": layout.data_parallel_degree,
            "sep_parallel_degree": layout.sep_parallel_degree,
            "context_parallel_degree": layout.context_parallel_degree,
            "sequence_parallel": layout.sequence_parallel,
            "world_size": layout.world_size,
            "nnodes": layout.nnodes,
        },
        "gpu": cluster.gpu.part,
        "global_batch_size": plan.global_batch_samples,
        "global_batch_tokens": plan.global_batch_tokens,
        "seq_length": plan.seq_length,
        "num_params": plan.num_parameters,
        "params_per_card": max(stage.numel for stage in stages),
        "params_per_card_per_stage": [stage.numel for stage in stages],
        "tokens_per_card_per_sec": estimate.tokens_per_card_per_sec if estimate else None,
        "mfu": estimate.mfu if estimate else None,
        "memory_gib": list(estimate.memory_gib) if estimate else None,
        "memory_allocated_gib": list(estimate.allocated_gib) if estimate else None,
        "memory_breakdown": (
            {f"stage {i}": terms for i, terms in enumerate(estimate.memory_breakdown)} if estimate else None
        ),
        "fits": estimate.fits if estimate else None,
        "warnings": cluster.warnings,
        "notes": plan.notes,
    }
