"""Resolving a run: everything the parsed arguments name, looked up once, before anything is built.

``resolve_run`` turns the three argument dataclasses into a ``RunPlan``: the parallel layout, the
tokenizer, the model config and its parameter count, the data sources as ``(weight, prefix)``
pairs and the checkpoint to resume from. It loads small files only (tokenizer, config.json, file
listings); it never indexes data or builds a model. What cannot be resolved is recorded as a
problem (one line naming the key and the fix) so that preflight reports it together with its own.
Checking the plan is ``pretrain.preflight``; printing it is ``pretrain.report``.

Resolved for another machine (a forecast: a GPU cluster's run resolved on a laptop, ``on_cluster=True``),
files that live on the cluster may be absent here: a missing tokenizer folder gives the
architecture's published vocabulary, missing data is skipped, and the resume point is left to the
cluster; each is recorded in ``notes`` instead of ``problems``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from paddlenlp.transformers import PretrainedConfig, PretrainedTokenizer

from pretrain import checkpoint
from pretrain.arguments import DataArguments, ModelArguments, PreTrainingArguments
from pretrain.data import resolve_data_sources
from pretrain.errors import UserError
from pretrain.layout import ParallelLayout, launched_nnodes
from pretrain.model_config import build_model_config, resolve_model_config, set_token_ids
from pretrain.param_count import count_config_parameters
from pretrain.tokenizers import load_tokenizer, special_token_ids


@dataclass
class RunPlan:
    """A resolved run. Fields that could not be resolved are None and explained in ``problems``."""

    model_args: ModelArguments
    data_args: DataArguments
    training_args: PreTrainingArguments
    layout: ParallelLayout
    tokenizer: Optional[PretrainedTokenizer] = None
    model_config: Optional[PretrainedConfig] = None
    num_parameters: Optional[int] = None  # full model, every parallel rank together (elements)
    # Parameters the optimizer updates when not all of num_parameters (a LoRA adapter's), None: all (elements).
    trained_parameters: Optional[int] = None
    data: list = field(default_factory=list)  # [DataSource(weight, prefix)]
    resume_checkpoint: Optional[str] = None  # checkpoint-<step> folder, None for a fresh start
    problems: list = field(default_factory=list)  # one line each: what could not be resolved
    notes: list = field(default_factory=list)  # forecast: what was taken from elsewhere or left unchecked

    @property
    def seq_length(self) -> int:
        """Tokens per training sample (``max_seq_length``)."""
        return self.data_args.max_seq_length

    @property
    def checkpoint_parameters(self) -> Optional[int]:
        """Parameters a checkpoint holds with their optimizer state: ``trained_parameters``, else ``num_parameters``."""
        return self.trained_parameters if self.trained_parameters is not None else self.num_parameters

    @property
    def global_batch_samples(self) -> int:
        """Samples one optimizer step consumes across all cards (see ``ParallelLayout.global_batch_samples``)."""
        args = self.training_args
        return self.layout.global_batch_samples(args.per_device_train_batch_size, args.gradient_accumulation_steps)

    @property
    def global_batch_tokens(self) -> int:
        """Tokens one optimizer step consumes across all cards: global_batch_samples x seq_length."""
        return self.global_batch_samples * self.seq_length


def resolve_run(
    model_args, data_args, training_args, layout: Optional[ParallelLayout] = None, on_cluster: bool = False
) -> RunPlan:
    """Resolve a parsed run into a ``RunPlan`` (see the module docstring).

    Args:
        layout: the parallel layout; default the one paddlenlp resolved for this launch
            (``ParallelLayout.from_arguments``). A forecast passes a simulated cluster's.
        on_cluster: the run is for another machine; files absent here become notes, not problems.
    """
    if layout is None:
        layout = ParallelLayout.from_arguments(training_args, launched_nnodes())
    plan = RunPlan(model_args, data_args, training_args, layout)
    resolve_model(plan, on_cluster)
    try:
        plan.data = resolve_data_sources(data_args.input_dir)
    except UserError as e:
        (plan.notes if on_cluster else plan.problems).append(str(e) + (" (data checks skipped)" if on_cluster else ""))
    if on_cluster:
        plan.notes.append("resume point: decided on the cluster (the newest complete checkpoint in output_dir)")
        return plan
    resolve_resume(plan)
    return plan


def resolve_model(plan: RunPlan, on_cluster: bool = False) -> None:
    """Set the plan's tokenizer, model config (with the tokenizer's begin- and end-of-text ids:
    ``model_config.set_token_ids``) and parameter count, or record why not in ``plan.problems``
    (``on_cluster``: a tokenizer folder absent here gives the architecture's vocabulary and ids, noted)."""
    model_args = plan.model_args
    tokenizer_path = model_args.tokenizer_name_or_path or model_args.model_name_or_path
    try:
        if on_cluster and not os.path.isdir(tokenizer_path):
            vocab = resolve_model_config(model_args.model_name_or_path, model_args.continue_training).vocab_size
            plan.notes.append(f"tokenizer: {tokenizer_path} is not here; vocabulary of the architecture ({vocab})")
        else:
            plan.tokenizer = load_tokenizer(model_args)
            vocab = len(plan.tokenizer)
        plan.model_config = build_model_config(model_args, plan.data_args, plan.training_args, vocab)
        if plan.tokenizer is not None:
            set_token_ids(plan.model_config, special_token_ids(plan.tokenizer), not model_args.continue_training)
        plan.num_parameters = count_config_parameters(plan.model_config)[0]
    except UserError as e:
        plan.problems.append(str(e))


def resolve_resume(plan: RunPlan) -> None:
    """Set the checkpoint the plan resumes from (``checkpoint.resolve_resume_checkpoint``), or record why not."""
    try:
        plan.resume_checkpoint = checkpoint.resolve_resume_checkpoint(plan.training_args)
    except UserError as e:
        plan.problems.append(str(e))
