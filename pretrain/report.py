"""What a resolved run is: the dry run of ``run_pretrain.py --dry_run true``, the short header a run
prints, the settings its VisualDL board shows, and the full configuration it writes to
``<output_dir>/run_config.json``. The forecast for a GPU cluster (``tools/plan.py``) is
``pretrain.forecast``'s."""

from __future__ import annotations

import dataclasses
import json
import os

from pretrain.atomic import write_json
from pretrain.checkpoint import checkpoint_bytes
from pretrain.corpus import index_counts, prefix_format, summarize_prefix
from pretrain.data import num_samples_per_split
from pretrain.document_mask import describe as describe_documents
from pretrain.enums import plain
from pretrain.forecast import format_estimate, format_parameters
from pretrain.lr_schedule import describe_schedule, scheduler_name
from pretrain.metrics.board import BoardContent
from pretrain.metrics.peak_memory import GIB
from pretrain.model_config import model_label
from pretrain.mtp import prediction_depth
from pretrain.param_count import count_shape_parameters, decoder_shape, experts_text
from pretrain.precision import Precision
from pretrain.registry import implementation_for

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
        value = plain(value)  # enums (paddlenlp's IntervalStrategy, ...) by their value
        if value != default and value != plain(default):
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
        f"resume from: {resume_source(plan)}",
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
    return str(plain(value))


def _prediction(config) -> str:
    """`` + 1 multi-token-prediction module (loss weight 0.3)`` for DeepSeek's MTP (``pretrain.mtp``), else empty."""
    depth = prediction_depth(config)
    if not depth:
        return ""
    modules = f"{depth} multi-token-prediction module{'s' if depth > 1 else ''}"
    return f" + {modules} (loss weight {config.num_nextn_predict_lambda})"


def _experts(config) -> str:
    """``, 4 experts (top-2: 7.08 M parameters per token), aux-loss coefficient 0.02`` for a mixture of
    experts (``pretrain.routing``), else empty."""
    shape = decoder_shape(config)
    routing = implementation_for(config.model_type).routing
    if not shape.experts or routing is None:
        return ""
    per_token = count_shape_parameters(shape, activated=True)[0]
    return (
        f", {experts_text(shape.experts)} (top-{shape.experts_per_token}: {per_token / 1e6:,.2f} M parameters per "
        "token), "
        f"aux-loss coefficient {getattr(config, routing.aux_loss_coef_key)}"
    )


def resume_source(plan) -> str:
    """What a run starts from, for its header and dry run: the checkpoint it resumes, else with
    continue_training the weights it loads ("nothing (weights from <model_name_or_path>: continue_training)"),
    else "nothing (fresh start)"."""
    if plan.resume_checkpoint:
        return plan.resume_checkpoint
    if plan.model_args.continue_training:
        return f"nothing (weights from {plan.model_args.model_name_or_path}: continue_training)"
    return "nothing (fresh start)"


def format_header(plan) -> list:
    """The lines a run prints before it builds anything: model, layout and batch, data, schedule, output.

    Everything else resolved about the run is in ``<output_dir>/run_config.json`` (``run_config``).
    """
    args, config, layout = plan.training_args, plan.model_config, plan.layout
    steps = args.max_steps
    resume = resume_source(plan)
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
        f"model: {model_label(plan.model_args, config)}, {plan.num_parameters / 1e6:,.2f} M "
        f"parameters: {config.num_hidden_layers} layers{_prediction(config)}, hidden {config.hidden_size}, "
        f"{config.num_attention_heads} heads, vocab {config.vocab_size:,}{_experts(config)}; "
        f"{Precision.from_arguments(args).label}",
        f"layout: {layout.name} on {layout.world_size} card(s); global batch {plan.global_batch_samples} x "
        f"{plan.seq_length} = {plan.global_batch_tokens:,} tokens; {steps} steps = "
        f"{steps * plan.global_batch_tokens:,} tokens",
        f"data: {'; '.join(sources)}; split {plan.data_args.split}{documents}",
        f"schedule: {describe_schedule(args)}; {evaluation}, {saving}",
        f"output: {args.output_dir} (every setting: {RUN_CONFIG_FILE}); resume from {resume}",
    ]


def _json_safe(value):
    """``value`` with enums by their value and anything JSON cannot hold as its string."""
    value = plain(value)
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
    write_json(path, run_config(plan), indent=2, end="\n")
    return path


def board_content(plan) -> BoardContent:
    """The key settings (model, layout, batch, learning rate, sequence length) and non-default
    settings of a ``RunPlan`` (``pretrain.resolve``)."""
    args, config = plan.training_args, plan.model_config
    hparams = {  # most telling first: the hyper-parameters table shows the first columns without scrolling
        "model": plan.model_args.model_name_or_path,
        "layout": plan.layout.name,
        "global_batch_tokens": plan.global_batch_tokens,
        "seq_length": plan.seq_length,
        "learning_rate": args.learning_rate,
        "precision": Precision.from_arguments(args).label,
        "max_steps": args.max_steps,
        "micro_batch": args.per_device_train_batch_size,
        "gradient_accumulation": args.gradient_accumulation_steps,
        "cards": plan.layout.world_size,
        "num_parameters": plan.num_parameters,
        "lr_scheduler": scheduler_name(args),
    }
    sections = {
        "model": non_default(plan.model_args),
        "data": non_default(plan.data_args),
        "training": non_default(args),
        "model_config": {name: getattr(config, name, None) for name in ("model_type", *CONFIG_FIELDS)},
    }
    return BoardContent(hparams, {name: json.dumps(values) for name, values in sections.items()})
