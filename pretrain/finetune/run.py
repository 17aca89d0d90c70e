"""A LoRA fine-tuning run: what ``run_finetune.py`` resolves, checks and reports beyond pretraining's.

The run is a ``FinetunePlan``: pretraining's ``RunPlan`` (layout, tokenizer, model config and size,
resume point: ``pretrain.resolve``) plus the LoRA arguments and the src/tgt examples. Preflight is
pretraining's ``check_run`` (devices, fused ops, sequence length, saved weights, output space for
an adapter checkpoint, ...) plus the checks below; the run summary is pretraining's
``build_summary`` plus ``finetune_summary``.

Fine-tuning checks (one line each, naming the key and the fix):

- ``continue_training`` is true: an adapter is trained on saved weights (the ranges of ``lora_rank``,
  ``lora_alpha``, ``lora_dropout`` are their fields' metadata, checked while parsing: ``pretrain.schema``);
- a resumed adapter checkpoint has this run's ``lora_rank`` and ``lora_target_modules``;
- every ``lora_target_modules`` pattern matches a linear layer (LLaMA-style models, see
  ``pretrain.finetune.lora.linear_layer_shapes``);
- no tensor or pipeline parallelism: under TP each rank would save its own shard of the adapter
  (which tools/merge_lora.py refuses) and ``merge_lora`` merges single-card layers only; under PP
  the merge runs on global rank 0 alone, which holds stage 0's layers only; the adapter and
  parameter counts of the summary (and the MFU built on them) would be one rank's shard;
- ``merge_lora`` with room in output_dir for the merged model;
- ``dataset_name_or_path`` holds train.json (and dev.json with do_eval) in the src/tgt format.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Optional

from pretrain.checkpoint import DTYPE_BYTES, checkpoint_bytes
from pretrain.errors import UserError
from pretrain.finetune.lora import adapter_parameter_count, unmatched_targets
from pretrain.finetune.lora_arguments import FinetuneDataArguments, LoRAArguments
from pretrain.finetune.pairs import read_examples, split_file
from pretrain.layout import ParallelLayout, launched_nnodes
from pretrain.log import logger
from pretrain.precision import Precision
from pretrain.preflight import check_output_dir, check_run
from pretrain.report import non_default
from pretrain.resolve import RunPlan, resolve_model, resolve_resume


@dataclass(kw_only=True)
class FinetunePlan(RunPlan):
    """A resolved fine-tuning run: a ``RunPlan`` (its ``data`` stays empty, its ``data_args`` are the
    fine-tuning ones) plus the adapter and the examples."""

    data_args: FinetuneDataArguments  # type: ignore[assignment]  # the fine-tuning data arguments
    lora_args: LoRAArguments
    train_file: Optional[str] = None
    eval_file: Optional[str] = None
    train_examples: list = field(default_factory=list)  # [pretrain.finetune.pairs.Example]
    eval_examples: list = field(default_factory=list)


def _read_split(plan: FinetunePlan, split: str, needed: bool) -> tuple:
    """(path, examples) of one split of ``dataset_name_or_path`` when the run ``needed`` it, else (None, []);
    a missing or bad file is recorded as a problem."""
    if not needed:
        return None, []
    folder = plan.data_args.dataset_name_or_path
    path = split_file(folder, split)
    if path is None:
        plan.problems.append(
            f"dataset_name_or_path: {folder} has no {split}.json (or {split}.jsonl); write one "
            '{"src": ..., "tgt": ...} object per line' + (" or set do_eval false" if split == "dev" else "")
        )
        return None, []
    try:
        return path, read_examples(path)
    except UserError as e:
        plan.problems.append(str(e))
        return path, []


def resolve_finetune_run(model_args, data_args, training_args, lora_args) -> FinetunePlan:
    """Resolve a parsed fine-tuning run (the four dataclasses of ``FINETUNE_ARGUMENT_CLASSES``).

    Reads the src/tgt files (not yet tokenized) and counts the adapter's parameters from the model
    config where ``pretrain.finetune.lora`` knows the model's layers (``trained_parameters``: checkpoints
    hold only the adapter and its optimizer state).
    """
    layout = ParallelLayout.from_arguments(training_args, launched_nnodes())
    plan = FinetunePlan(
        model_args=model_args, data_args=data_args, training_args=training_args, layout=layout, lora_args=lora_args
    )
    resolve_model(plan)
    plan.train_file, plan.train_examples = _read_split(plan, "train", needed=training_args.do_train)
    plan.eval_file, plan.eval_examples = _read_split(plan, "dev", needed=training_args.do_eval)
    if plan.model_config is not None:
        plan.trained_parameters = adapter_parameter_count(plan.model_config, lora_args)
    resolve_resume(plan)
    return plan


def check_lora(plan: FinetunePlan) -> list:
    """Problems with continue_training, the LoRA arguments and merge_lora's layout (see the module docstring)."""
    lora_args, problems = plan.lora_args, []
    if not plan.model_args.continue_training:
        problems.append(
            "continue_training: LoRA fine-tuning trains an adapter on saved weights; set continue_training true "
            "and model_name_or_path to a folder written by run_pretrain.py or save_pretrained"
        )
    if plan.model_config is not None:
        for pattern in unmatched_targets(plan.model_config, lora_args.lora_target_modules) or []:
            problems.append(
                f"lora_target_modules: {pattern!r} matches no linear layer of {plan.model_args.model_name_or_path} "
                "(names look like llama.layers.0.self_attn.q_proj, ...mlp.down_proj); fix it, e.g. '.*q_proj'"
            )
    problems += check_resumed_adapter(plan)
    layout = plan.layout
    if layout.tensor_parallel_degree > 1 or layout.pipeline_parallel_degree > 1:
        problems.append(
            f"tensor_parallel_degree: LoRA fine-tuning runs data parallel (and sharding) only, not with tensor "
            f"parallel {layout.tensor_parallel_degree} x pipeline {layout.pipeline_parallel_degree} (the adapter, "
            "its merge and its counts would be one rank's shard); set both degrees to 1"
        )
    return problems


def check_resumed_adapter(plan: FinetunePlan) -> list:
    """Problems resuming the adapter of ``plan.resume_checkpoint`` with this run's LoRA shape: its
    ``lora_config.json`` must have the same rank (``r``) and target modules (paddle would stop with an
    AssertionError on the first mismatched tensor)."""
    if plan.resume_checkpoint is None:
        return []
    path = os.path.join(plan.resume_checkpoint, "lora_config.json")
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return []  # not an adapter checkpoint: paddlenlp's own loading reports it
    lora_args, problems = plan.lora_args, []
    fix = "to continue that adapter, or set overwrite_output_dir true (or another output_dir) to train a new one"
    if saved.get("r") != lora_args.lora_rank:
        problems.append(
            f"lora_rank: {lora_args.lora_rank} differs from the adapter this run resumes ({path}: r={saved.get('r')}); "
            f"set lora_rank {saved.get('r')} {fix}"
        )
    if saved.get("target_modules") is not None and list(saved["target_modules"]) != list(lora_args.lora_target_modules):
        problems.append(
            f"lora_target_modules: {lora_args.lora_target_modules} differ from the adapter this run resumes "
            f"({path}: {saved['target_modules']}); set them back {fix}"
        )
    return problems


def merged_model_bytes(plan: FinetunePlan) -> Optional[int]:
    """Bytes of the merged model ``merge_lora`` writes: every parameter in the model's dtype."""
    if plan.num_parameters is None:
        return None
    return plan.num_parameters * DTYPE_BYTES[Precision.from_arguments(plan.training_args).param_dtype]


def check_finetune_run(plan: FinetunePlan) -> list:
    """Every problem of a fine-tuning plan: pretraining's ``check_run`` (whose data check finds no
    ``.bin/.idx`` sources to check), then ``check_lora``, then room for the merged model."""
    problems = check_run(plan) + check_lora(plan)
    merged = merged_model_bytes(plan) if plan.lora_args.merge_lora else None
    if merged is not None and not any(problem.startswith("output_dir:") for problem in problems):
        assert plan.checkpoint_parameters is not None  # merged is known: so is the model's size
        adapter = checkpoint_bytes(plan.checkpoint_parameters, plan.training_args)
        problems += check_output_dir(plan.training_args.output_dir, adapter + merged)
    return problems


def format_finetune_dry_run(plan: FinetunePlan) -> str:
    """The dry-run text of a checked ``FinetunePlan``: non-default arguments, model and adapter size, batch,
    resume point and data files."""
    args = plan.training_args
    resolved = {
        "model": non_default(plan.model_args),
        "data": non_default(plan.data_args),
        "lora": non_default(plan.lora_args),
        "training": non_default(args),
    }
    assert plan.num_parameters is not None, "a checked plan has its model's size"
    adapter = plan.trained_parameters
    adapter_text = f"{adapter:,} adapter parameters" if adapter is not None else "adapter size known after the build"
    return "\n".join(
        [
            "dry run: preflight passed",
            "resolved arguments (values that differ from the defaults):",
            json.dumps(resolved, indent=2),
            f"model: {plan.num_parameters:,} frozen parameters ({plan.num_parameters / 1e6:.2f} M); {adapter_text}",
            f"layout {plan.layout.name} on {plan.layout.world_size} card(s); global batch {plan.global_batch_samples} "
            f"sequences of {plan.seq_length} tokens per step, {args.max_steps} steps",
            f"resume from: {plan.resume_checkpoint or 'nothing (fresh start)'}",
            f"train: {plan.train_file} ({len(plan.train_examples)} examples); "
            f"eval: {plan.eval_file} ({len(plan.eval_examples)} examples)",
        ]
    )


def evaluate_base_model(trainer, model, eval_loss: float) -> dict:
    """Evaluate the base model (the adapter switched off: every LoRA layer computes x @ W alone) on the
    trainer's eval set, and log it against ``eval_loss``, the fine-tuned model's.

    Returns:
        ``{"eval_loss_base", "eval_loss_reduction"}`` (reduction = 1 - fine-tuned / base, a fraction).
    """
    model.disable_lora()
    try:
        base = trainer.evaluate(metric_key_prefix="eval_base")["eval_base_loss"]
    finally:
        model.enable_lora()
    reduction = 1 - eval_loss / base
    logger.info(
        "held-out loss on the response tokens: base model %.4f, fine-tuned %.4f (%.1f%% lower)",
        base,
        eval_loss,
        100 * reduction,
    )
    return {"eval_loss_base": base, "eval_loss_reduction": reduction}


def finetune_summary(plan: FinetunePlan, trainable: int, total: int, splits: dict, extra: dict) -> dict:
    """The run-summary keys fine-tuning adds to ``pretrain.metrics.summary.build_summary``'s.

    Args:
        trainable, total: parameters of the built LoRA model (``pretrain.finetune.lora.parameter_counts``).
        splits: ``{"train": TokenizedSplit, "eval": TokenizedSplit or None}``.
        extra: further keys (eval_loss_base, merged_model_dir).
    """
    summary = {
        "model_name_or_path": plan.model_args.model_name_or_path,
        "trainable_params": trainable,
        "total_params_with_adapter": total,
        "trainable_fraction": trainable / total,
        "lora_rank": plan.lora_args.lora_rank,
        "lora_alpha": plan.lora_args.lora_alpha,
        "lora_dropout": plan.lora_args.lora_dropout,
        "lora_target_modules": list(plan.lora_args.lora_target_modules),
        "zero_padding": plan.data_args.zero_padding,
        "flops_form": "frozen weights: 4N + 6 x trainable + 12LHQT per token (pretrain.metrics.flops)",
    }
    for name, split in splits.items():
        if split is not None:
            summary.update(split.summary(name, plan.seq_length))
    summary.update(extra)
    return summary
