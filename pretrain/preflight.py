"""Preflight: refuse a bad run in seconds, before any data indexing or model build.

Every check adds one line naming the key (or file) and the fix; all are collected and raised
together as one ``UserError``. (Parallel degrees vs world size are checked earlier, while parsing:
paddlenlp's TrainingArguments asserts that tensor x pipeline divides the world size and fleet
asserts the full product; ``parse_arguments`` turns both into a UserError. In a single process
paddlenlp resets every degree to -1 on purpose, so a multi-card config can be debugged on one card.)
Checks:

- schedule and batch arithmetic: max_steps > 0, warmup <= decay, batch sizes >= 1;
- devices: flash attention, fused RoPE, TP, PP, sequence parallel and sharding stage2/3 need GPUs;
  fp16/bf16 must be supported by the device (``paddle.amp.is_*_supported``);
- ``fused_ln`` importable when ``use_fused_rms_norm`` (``pretrain.fused_ops.fused_ln_problem``);
- tokenizer and model config load; ``max_seq_length <= max_position_embeddings``;
- data: prefixes exist; each ``.idx`` parses and agrees with its ``.bin`` size; no split is empty
  that the run needs; the largest token id is < ``vocab_size`` (from the ``<prefix>.stats.json``
  sidecar written by preprocessing, else a bounded scan of the first and last ``SCAN_BYTES``);
- ``output_dir`` is writable and has room for one checkpoint (``checkpoint_bytes``);
- ``resume_from_checkpoint`` (if given) is a complete checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import paddle
from paddlenlp.data.causal_dataset import get_train_valid_test_split_

from pretrain import checkpoint
from pretrain.data import num_samples_per_split, prefix_format, resolve_data_prefixes
from pretrain.errors import UserError
from pretrain.fused_ops import fused_ln_problem
from pretrain.modeling import build_model_config, model_dtype
from pretrain.param_count import count_config_parameters
from pretrain.preprocess.indexed import read_index, read_stats, verify
from pretrain.throughput import global_tokens_per_step
from pretrain.tokenizers import load_tokenizer

GIB = 2**30
SCAN_BYTES = 64 * 2**20  # bytes read from each end of a .bin without a stats sidecar
# Bytes per parameter held in a checkpoint besides the weights: AdamW's two fp32 moments.
ADAM_MOMENT_BYTES = 2 * 4
FP32_MASTER_BYTES = 4  # the fp32 master copy kept under AMP O2
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# Features that need a GPU build of paddle: (where it is set, attribute, description).
GPU_ONLY_FLAGS = (
    ("model", "use_flash_attention", "flash attention"),
    ("model", "use_fused_rope", "fused rotary embedding"),
    ("training", "sequence_parallel", "sequence parallelism"),
)
GPU_ONLY_DEGREES = (
    ("tensor_parallel_degree", "tensor parallelism"),
    ("pipeline_parallel_degree", "pipeline parallelism"),
)
GPU_ONLY_SHARDING = ("stage2", "stage3")


@dataclass
class DataSummary:
    """One tokenized file pair as preflight saw it (token counts in tokens, sizes in bytes)."""

    prefix: str
    documents: Optional[int] = None
    tokens: Optional[int] = None
    dtype: Optional[str] = None
    max_token_id: Optional[int] = None
    max_token_id_source: str = "not checked"  # "sidecar", "full scan" or "bounded scan ..."
    split_documents: Optional[list] = None  # [train, valid, test] documents


@dataclass
class PreflightReport:
    """What the run will use, resolved without indexing data or building the model."""

    tokenizer: object = None
    model_config: object = None
    num_parameters: Optional[int] = None
    checkpoint_bytes: Optional[int] = None
    resume_checkpoint: Optional[str] = None
    data: list = field(default_factory=list)
    problems: list = field(default_factory=list)


def checkpoint_bytes(num_parameters: int, training_args) -> int:
    """Estimated bytes of one checkpoint: parameters x (weight bytes + 2 fp32 Adam moments + fp32 master under O2)."""
    weight_bytes = DTYPE_BYTES[model_dtype(training_args)]
    master = FP32_MASTER_BYTES if weight_bytes < DTYPE_BYTES["float32"] else 0
    return num_parameters * (weight_bytes + ADAM_MOMENT_BYTES + master)


def _degree(training_args, name: str) -> int:
    return max(int(getattr(training_args, name, 1) or 1), 1)


def check_schedule(training_args) -> list:
    """Problems with max_steps, warmup/decay steps and batch sizes."""
    problems = []
    if training_args.max_steps <= 0:
        problems.append(
            "max_steps: must be a positive number of optimizer steps for pretraining; set e.g. --max_steps 1000"
        )
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps"):
        if getattr(training_args, name) < 1:
            problems.append(f"{name}: {getattr(training_args, name)} must be >= 1")
    warmup = (
        training_args.warmup_steps
        if training_args.warmup_steps > 0
        else int(training_args.warmup_ratio * training_args.max_steps)
    )
    decay = training_args.decay_steps if training_args.decay_steps is not None else training_args.max_steps
    if warmup > decay:
        problems.append(
            f"warmup_steps: {warmup} warmup steps exceed the {decay} decay steps; "
            "lower warmup_steps or raise decay_steps"
        )
    return problems


def check_device(model_args, training_args) -> list:
    """Problems with GPU-only features on a CPU-only paddle, and fp16/bf16 on this device."""
    problems = []
    on_cpu = training_args.device == "cpu" or not paddle.is_compiled_with_cuda()
    if on_cpu:
        sources = {"model": model_args, "training": training_args}
        for where, name, what in GPU_ONLY_FLAGS:
            if getattr(sources[where], name):
                problems.append(f"{name}: {what} needs a GPU build of paddle and device gpu; set {name} false on CPU")
        for name, what in GPU_ONLY_DEGREES:
            if _degree(training_args, name) > 1:
                problems.append(
                    f"{name}: {what} is not supported on CPU here (needs GPUs); set it to 1 (see docs/distributed.md)"
                )
        stages = [str(getattr(s, "value", s)) for s in training_args.sharding]
        for stage in GPU_ONLY_SHARDING:
            if stage in stages:
                problems.append(f"sharding: {stage} needs GPUs; use sharding stage1 or plain data parallel on CPU")
    device = "cpu" if on_cpu else "gpu"
    if training_args.fp16 and not paddle.amp.is_float16_supported(device):
        problems.append(
            f"fp16: float16 training is not supported on {device}; set fp16 false (or bf16 true where supported)"
        )
    if training_args.bf16 and not paddle.amp.is_bfloat16_supported(device):
        problems.append(f"bf16: bfloat16 training is not supported on {device}; set bf16 false (fp16 on older GPUs)")
    return problems


def _max_token_id(prefix: str, dtype, bin_bytes: int) -> tuple:
    """(largest token id, how it was found): the stats sidecar, or a scan bounded to SCAN_BYTES per end."""
    sidecar = prefix + ".stats.json"
    stats = read_stats(prefix)
    if stats is not None:
        if stats.get("dtype", np.dtype(dtype).name) != np.dtype(dtype).name:
            raise UserError(
                f"input_dir: {sidecar} says dtype {stats['dtype']} but {prefix}.idx says {np.dtype(dtype).name}; "
                "the sidecar is stale: re-run create_pretraining_data.py"
            )
        try:
            return int(stats["max_token_id"]), "sidecar"
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(
                f"input_dir: {sidecar} has no usable max_token_id ({e}); delete it or re-run create_pretraining_data.py"
            ) from e
    itemsize = np.dtype(dtype).itemsize
    count = bin_bytes // itemsize
    per_end = SCAN_BYTES // itemsize
    tokens = np.memmap(prefix + ".bin", dtype=dtype, mode="r", shape=(count,))
    if count <= 2 * per_end:
        return int(tokens.max()), "full scan"
    largest = max(int(tokens[:per_end].max()), int(tokens[-per_end:].max()))
    return largest, f"bounded scan of the first and last {SCAN_BYTES // 2**20} MiB (no {os.path.basename(sidecar)})"


def summarize_prefix(prefix: str, split: str, vocab_size: Optional[int], need_valid: bool) -> tuple:
    """(DataSummary, problems) for one data prefix: index vs .bin, split, token ids vs ``vocab_size``."""
    summary = DataSummary(prefix)
    if prefix_format(prefix) != (".bin", ".idx"):
        summary.max_token_id_source = "not checked (older _ids.npy/_idx.npz format)"
        return summary, []
    try:
        found = verify(prefix)
    except UserError as e:
        found = [str(e)]
    if found:
        return summary, [f"input_dir: {problem}; re-copy it or re-run create_pretraining_data.py" for problem in found]
    index = read_index(prefix + ".idx")
    summary.dtype = np.dtype(index.dtype).name
    summary.documents = len(index.doc_idx) - 1
    summary.tokens = int(index.sizes.sum(dtype=np.int64))
    bin_bytes = os.path.getsize(prefix + ".bin")
    problems = []
    try:
        bounds = get_train_valid_test_split_(split, summary.documents)
        summary.split_documents = [int(b - a) for a, b in zip(bounds[:-1], bounds[1:])]
    except (ValueError, AssertionError) as e:
        return summary, [f"split: '{split}' is not three comma-separated non-negative numbers ({e})"]
    names = ("train", "validation") if need_valid else ("train",)
    for name, documents in zip(names, summary.split_documents):
        if documents == 0:
            problems.append(
                f"split: '{split}' leaves the {name} split of {prefix} ({summary.documents} documents) empty; "
                f"raise its share of split{' or set do_eval false' if name == 'validation' else ''}"
            )
    if summary.tokens:
        try:
            summary.max_token_id, summary.max_token_id_source = _max_token_id(prefix, index.dtype, bin_bytes)
        except UserError as e:
            return summary, problems + [str(e)]
        if vocab_size is not None and summary.max_token_id >= vocab_size:
            problems.append(
                f"vocab_size: {prefix}.bin ({summary.dtype}) holds token id {summary.max_token_id} but the model has "
                f"{vocab_size} embedding rows; tokenize with this run's tokenizer or raise vocab_size above it"
            )
    return summary, problems


def check_output_dir(output_dir: str, needed_bytes: Optional[int]) -> list:
    """Problems writing ``output_dir`` (or its nearest existing parent) and fitting one checkpoint."""
    existing = os.path.abspath(output_dir)
    while not os.path.isdir(existing):
        if os.path.exists(existing):
            return [f"output_dir: {existing} is a file, not a folder; choose another output_dir"]
        existing = os.path.dirname(existing)
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".preflight-"):
            pass
    except OSError as e:
        return [f"output_dir: cannot write to {existing} ({e.strerror}); choose a writable output_dir"]
    free = shutil.disk_usage(existing).free
    if needed_bytes is not None and free < needed_bytes:
        return [
            f"output_dir: one checkpoint needs about {needed_bytes / GIB:.2f} GiB but {existing} has "
            f"{free / GIB:.2f} GiB free; free space or choose another output_dir"
        ]
    return []


def _model_problems(model_args, data_args, training_args, report: PreflightReport) -> list:
    """Load tokenizer and model config into ``report``; problems with them and the sequence length."""
    try:
        report.tokenizer = load_tokenizer(model_args)
        report.model_config = build_model_config(model_args, data_args, training_args, len(report.tokenizer))
    except UserError as e:
        return [str(e)]
    report.num_parameters, _ = count_config_parameters(report.model_config)
    report.checkpoint_bytes = checkpoint_bytes(report.num_parameters, training_args)
    limit = report.model_config.max_position_embeddings
    if data_args.max_seq_length > limit:
        return [
            f"max_seq_length: {data_args.max_seq_length} exceeds max_position_embeddings {limit} of "
            f"{model_args.model_name_or_path}; lower max_seq_length or raise max_position_embeddings"
        ]
    return []


def run_preflight(model_args, data_args, training_args) -> PreflightReport:
    """Run every check; return the report (tokenizer and model config included) or raise.

    Raises:
        UserError: one line per problem found, all of them together.
    """
    report = PreflightReport()
    problems = report.problems
    problems += check_schedule(training_args)
    problems += check_device(model_args, training_args)
    if model_args.use_fused_rms_norm and fused_ln_problem():
        problems.append(f"use_fused_rms_norm: {fused_ln_problem()}")
    problems += _model_problems(model_args, data_args, training_args, report)

    vocab_size = report.model_config.vocab_size if report.model_config is not None else None
    try:
        prefixes = resolve_data_prefixes(data_args.input_dir)
    except UserError as e:
        problems.append(str(e))
        prefixes = []
    for prefix in prefixes[1::2] if len(prefixes) > 1 else prefixes:
        summary, found = summarize_prefix(prefix, data_args.split, vocab_size, training_args.do_eval)
        report.data.append(summary)
        problems += found

    problems += check_output_dir(training_args.output_dir, report.checkpoint_bytes)
    try:
        report.resume_checkpoint = checkpoint.resolve_resume_checkpoint(training_args)
    except UserError as e:
        problems.append(str(e))
    if len(problems) == 1:
        raise UserError(problems[0])
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise UserError(f"preflight found {len(problems)} problems, nothing was started:\n{lines}")
    return report


def _non_default(args) -> dict:
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


def format_report(report: PreflightReport, model_args, data_args, training_args) -> str:
    """The dry-run text: resolved arguments (non-default), model size, batch, checkpoint, data."""
    samples = num_samples_per_split(training_args)
    config = report.model_config
    resolved = {
        "model": _non_default(model_args),
        "data": _non_default(data_args),
        "training": _non_default(training_args),
        "model_config": {
            k: getattr(config, k)
            for k in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "max_position_embeddings",
                "seq_length",
            )
        },
    }
    tokens_per_step = global_tokens_per_step(
        training_args.per_device_train_batch_size,
        training_args.gradient_accumulation_steps,
        training_args.dataset_world_size,
        data_args.max_seq_length,
    )
    lines = [
        "dry run: preflight passed",
        "resolved arguments (values that differ from the defaults):",
        json.dumps(resolved, indent=2),
        f"model: {report.num_parameters:,} parameters ({report.num_parameters / 1e6:.2f} M, counted from the config)",
        f"world size {training_args.world_size}, data-parallel replicas {training_args.dataset_world_size}; "
        f"global batch {tokens_per_step // data_args.max_seq_length} samples = {tokens_per_step:,} tokens per step; "
        f"{samples[0]:,} train samples for {training_args.max_steps} steps",
        f"one checkpoint: about {report.checkpoint_bytes / GIB:.3f} GiB in {training_args.output_dir}",
        f"resume from: {report.resume_checkpoint or 'nothing (fresh start)'}",
        "data:",
    ]
    for d in report.data:
        lines.append(
            f"  {d.prefix}: {d.documents} documents, {d.tokens} tokens, dtype {d.dtype}, "
            f"split documents [train, valid, test] {d.split_documents}, "
            f"max token id {d.max_token_id} ({d.max_token_id_source})"
        )
    return "\n".join(lines)
