"""Resolving a run: everything the parsed arguments name, looked up once, before anything is built.

``resolve_run`` turns the three argument dataclasses into a ``RunPlan``: the parallel layout, the
tokenizer, the model config and its parameter count, the data sources as ``(weight, prefix)``
pairs and the checkpoint to resume from. It loads small files only (tokenizer, config.json, file
listings); it never indexes data or builds a model. What cannot be resolved is recorded as a
problem (one line naming the key and the fix) so that preflight reports it together with its own.
Checking the plan is ``pretrain.preflight``; printing it is ``pretrain.report``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from paddlenlp.transformers import PretrainedConfig

from pretrain import checkpoint
from pretrain.data import resolve_data_sources
from pretrain.errors import UserError
from pretrain.layout import ParallelLayout, launched_nnodes
from pretrain.model_config import build_model_config
from pretrain.param_count import count_config_parameters
from pretrain.tokenizers import load_tokenizer


@dataclass
class RunPlan:
    """A resolved run. Fields that could not be resolved are None and explained in ``problems``."""

    model_args: object
    data_args: object
    training_args: object
    layout: ParallelLayout
    tokenizer: object = None
    model_config: Optional[PretrainedConfig] = None
    num_parameters: Optional[int] = None  # full model, every parallel rank together (elements)
    # Parameters the optimizer updates when not all of num_parameters (a LoRA adapter's), None: all (elements).
    trained_parameters: Optional[int] = None
    data: list = field(default_factory=list)  # [DataSource(weight, prefix)]
    resume_checkpoint: Optional[str] = None  # checkpoint-<step> folder, None for a fresh start
    problems: list = field(default_factory=list)  # one line each: what could not be resolved

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


def resolve_run(model_args, data_args, training_args, layout: Optional[ParallelLayout] = None) -> RunPlan:
    """Resolve a parsed run into a ``RunPlan`` (see the module docstring).

    Args:
        layout: the parallel layout; default the one paddlenlp resolved for this launch
            (``ParallelLayout.from_arguments``). Plan mode passes a simulated cluster's.
    """
    if layout is None:
        layout = ParallelLayout.from_arguments(training_args, launched_nnodes())
    plan = RunPlan(model_args, data_args, training_args, layout)
    resolve_model(plan)
    try:
        plan.data = resolve_data_sources(data_args.input_dir)
    except UserError as e:
        plan.problems.append(str(e))
    resolve_resume(plan)
    return plan


def resolve_model(plan: RunPlan) -> None:
    """Set the plan's tokenizer, model config and parameter count, or record why not in ``plan.problems``."""
    try:
        plan.tokenizer = load_tokenizer(plan.model_args)
        plan.model_config = build_model_config(plan.model_args, plan.data_args, plan.training_args, len(plan.tokenizer))
        plan.num_parameters = count_config_parameters(plan.model_config)[0]
    except UserError as e:
        plan.problems.append(str(e))


def resolve_resume(plan: RunPlan) -> None:
    """Set the checkpoint the plan resumes from (``checkpoint.resolve_resume_checkpoint``), or record why not."""
    try:
        plan.resume_checkpoint = checkpoint.resolve_resume_checkpoint(plan.training_args)
    except UserError as e:
        plan.problems.append(str(e))
