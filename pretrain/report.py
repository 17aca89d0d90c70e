"""What a resolved run is, in words: the dry-run text of ``run_pretrain.py --dry_run true``."""

from __future__ import annotations

import dataclasses
import json

from pretrain.checkpoint import checkpoint_bytes
from pretrain.data import num_samples_per_split, summarize_prefix

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


def format_dry_run(plan) -> str:
    """The dry-run text of a checked ``RunPlan``: resolved arguments (non-default), model size,
    layout and batch, checkpoint size, resume point and data."""
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
    return "\n".join(lines)
