"""Preflight: refuse a bad run in seconds, before any data indexing or model build.

``check_run(plan)`` checks a ``RunPlan`` (``pretrain.resolve``) and returns every problem, one line
each, naming the key (or file) and the fix; ``raise_problems`` turns them into one ``UserError``.
Nothing here loads, builds or prints what the run is: that is ``pretrain.resolve`` and
``pretrain.report``. ``warn_run(plan)`` lists what runs but is probably not what the user wants
(one line each, logged as warnings). (Parallel degrees vs world size are checked earlier, while parsing:
paddlenlp's TrainingArguments asserts that tensor x pipeline divides the world size and fleet
asserts the full product; ``parse_arguments`` turns both into a UserError.) Checks:

- arguments: max_steps > 0, a supported ``lr_scheduler_type`` (each key's range, e.g. batch sizes >= 1,
  and the relations between keys are checked earlier, while parsing: ``pretrain.schema``);
- devices: flash attention, fused RoPE and the other fused GPU ops and sep/context parallel need GPUs
  (tensor, pipeline and sequence parallelism run on CPU processes through ``pretrain.cpu_comm``, and so
  do sharding stage2 and stage3: ``pretrain.cpu_comm.sharding``; stage3 there without gradient
  clipping); fp16/bf16 must be supported by the device;
- ``fused_ln`` importable and, on the run's device, callable when ``use_fused_rms_norm``;
- ``max_seq_length <= max_position_embeddings``; saved weights fit the layout when continuing;
- the model divides over the layout, and the layout combines with the flags, as paddle's and
  paddlenlp's code requires (``check_layout``: the rules are ``pretrain.layout_rules``);
- data: each ``.idx`` (or legacy ``_idx.npz``) parses, is readable and agrees with its token file;
  no split is empty that the run needs; the largest token id is < ``vocab_size`` (from a stats
  sidecar only while it still describes the token file); the tokenizer the sidecar records (class,
  vocabulary size, EOS id) is the run's, unless ``allow_tokenizer_mismatch``;
- ``output_dir`` is writable and has room for the checkpoints rotation keeps at once
  (``save_total_limit + 1`` of ``checkpoint.checkpoint_bytes``), counting the space of the
  checkpoints already there (a resumed run replaces or rotates them away);
- the values that would fail late: ``eval_iters`` 0 with do_eval, ``save_steps`` 0, heads that do not
  divide the hidden size (or KV heads the heads), a mixture of experts' routing keys, so few DeepSeek
  layers that none after ``first_k_dense_replace`` has experts (the router watch would fail once the
  model is built), ``use_async_save`` (it would let a checkpoint be marked complete before its files are written);
- the index cache folder is writable and has room for the run's sample index;
- ``output_dir`` is not the folder ``continue_training`` loads from (the run would resume that run's
  checkpoints and overwrite its model);
- the checkpoint a run resumes holds the run's model (``config.json``: model type, vocabulary, layers,
  widths, heads), and its files were written by a layout this one can load (``pretrain.resume_layout``);
- document-aware packing (``reset_position_ids``, ``reset_attention_mask``, ``eod_mask_loss``): an EOS
  id, and a model type, attention kernel and layout that honour it (``pretrain.document_mask``);
- whatever ``resolve_run`` could not resolve (tokenizer, model config, data sources, resume checkpoint).

``check_run(plan, gpu)`` runs, from the same list, the checks that can be answered on another
machine for a GPU cluster (the forecast, ``pretrain.forecast``).
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import tempfile
from typing import NamedTuple, Optional

import paddle
from paddlenlp.utils.env import CONFIG_NAME

from pretrain import errors, layout_rules
from pretrain.checkpoint import (
    checkpoint_bytes,
    checkpoints_on_disk,
    reused_checkpoint_bytes,
    saved_max_steps,
    step_of,
)
from pretrain.corpus import current_stats, index_counts, summarize_prefix, verify
from pretrain.data import index_cache_root, num_samples_per_split
from pretrain.document_mask import document_masking_problems
from pretrain.enums import plain
from pretrain.errors import UserError
from pretrain.fused_ops import fused_ln_problem
from pretrain.layout import has_fleet_groups, runs_on_gpu, sharding_options
from pretrain.lr_schedule import stretched_schedule
from pretrain.metrics.peak_memory import GIB
from pretrain.model import saved_weights_problem
from pretrain.model_config import (
    architecture_difference,
    describe_token_id_differences,
    load_local_config,
    padded_vocab_size,
    token_id_differences,
)
from pretrain.param_count import decoder_shape, experts_text
from pretrain.precision import Precision
from pretrain.registry import find_model_size, implementation_for
from pretrain.resume_layout import resume_layout_problems
from pretrain.tokenizers import special_token_ids

# Bytes of paddlenlp's sample index, per sample (sample_idx: 2 x int32, shuffle_idx: int64, a
# blend's two index arrays) and per document of each epoch (doc_idx: int32).
INDEX_BYTES_PER_SAMPLE = 8 + 8 + 9
INDEX_BYTES_PER_DOCUMENT_EPOCH = 4
# Training flags that need a GPU build of paddle: (attribute, description).
GPU_ONLY_FLAGS = (
    ("use_flash_attention", "flash attention"),
    ("use_fused_rope", "fused rotary embedding"),
    ("use_fused_linear", "fused linear layers"),
    ("use_fused_dropout_add", "fused dropout + residual add"),
    ("use_fused_linear_cross_entropy", "fused linear + cross-entropy"),
)
# ParallelLayout degrees that need GPUs (NCCL): (attribute, description).
GPU_ONLY_DEGREES = (
    ("sep_parallel_degree", "sep (segment) parallelism"),
    ("context_parallel_degree", "context parallelism"),
)


def check_arguments(training_args) -> list:
    """Problems with max_steps (each key's range and choices alone are checked while parsing,
    ``pretrain.schema``: ``lr_scheduler_type`` is one of ``pretrain.lr_schedule.SCHEDULERS`` there)."""
    if training_args.max_steps <= 0:
        return ["max_steps: must be a positive number of optimizer steps for pretraining; set e.g. --max_steps 1000"]
    return []


def check_values(training_args) -> list:
    """Values that would fail late or silently: ``eval_iters`` 0 with do_eval (evaluation fails after all
    the training), ``save_steps`` 0 (no checkpoint)."""
    args = training_args
    problems = []
    if args.do_eval and args.eval_iters < 1:
        problems.append(
            f"eval_iters: {args.eval_iters} must be >= 1 with do_eval (evaluation would fail after "
            "the training); raise it or set do_eval false"
        )
    if str(plain(args.save_strategy)) == "steps" and args.save_steps <= 0:
        problems.append(
            f"save_steps: {args.save_steps} saves no checkpoint; give the optimizer steps between checkpoints "
            "(e.g. 1000), or set save_strategy no to train without any"
        )
    return problems


def check_async_save(training_args) -> list:
    """paddlenlp's asynchronous saves finish after ``_save_checkpoint`` returns, so the completion marker
    could be written before the files it vouches for: refused."""
    args = training_args
    if args.use_async_save or "async_save" in (args.unified_checkpoint_config or []):
        return [
            "use_async_save: asynchronous checkpoint writes are not supported (a checkpoint could be marked "
            "complete before its files are written); set use_async_save false and remove async_save from "
            "unified_checkpoint_config"
        ]
    return []


def check_distributed_dataloader(training_args) -> list:
    """``distributed_dataloader`` (data read on tensor/pipeline rank 0 and broadcast): refused, as it
    breaks resume. paddlenlp 3.0.0b4's ``Trainer.train`` moves the loading ranks' DistributedBatchSampler
    straight to ``consumed_samples``, while the other ranks' ``DistDataLoader`` has no length, so they
    compute ``steps_trained_in_current_epoch = global_step x accumulation`` and skip that many batches
    by receiving them: after a restart the ranks of one tensor/pipeline group would train on
    different batches (``trainer.py`` ``_inner_training_loop``; ``data/dist_dataloader.py`` ``__len__``)."""
    if training_args.distributed_dataloader:
        return [
            "distributed_dataloader: not supported (a resumed run would give the tensor- and pipeline-parallel "
            "ranks different batches); remove it: every rank then reads its own batches"
        ]
    return []


def check_attention_heads(model_config) -> list:
    """Heads that do not divide the hidden size, or key/value heads that do not divide the heads."""
    if model_config is None:
        return []
    hidden, heads = model_config.hidden_size, model_config.num_attention_heads
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    if heads < 1 or hidden % heads:
        return [
            f"num_attention_heads: {heads} does not divide hidden_size {hidden}; "
            "choose a head count that divides it (head size = hidden_size / heads)"
        ]
    if kv_heads < 1 or heads % kv_heads:
        return [
            f"num_key_value_heads: {kv_heads} does not divide num_attention_heads {heads}; "
            "choose a divisor of it (each key/value head serves heads / kv_heads query heads)"
        ]
    return []


# paddlenlp gates that route within expert groups (moe_gate.py: _topk_group_limited_greedy, _topk_noaux_tc)
GROUPED_TOPK_METHODS = ("group_limited_greedy", "noaux_tc")


def first_moe_layer(first_k_dense_replace: Optional[int], moe_layer_freq: Optional[int]) -> int:
    """Index of DeepSeek's first layer with experts: layer i has them when i >= ``first_k_dense_replace`` and
    i % ``moe_layer_freq`` == 0 (``DeepseekV2DecoderLayer``, paddlenlp transformers/deepseek_v2/modeling.py:1080);
    0 when both are None (every other mixture of experts)."""
    dense, every = int(first_k_dense_replace or 0), int(moe_layer_freq or 1)
    return -(-dense // every) * every


def check_experts(model_config, source: str) -> list:
    """A mixture of experts (``Implementation.routing``) with fewer than 1 expert or top-k, a top-k
    (``Routing.top_k_key``) above the experts per layer, a ``topk_method`` its gate has no branch for
    (``Routing.topk_methods``), a load-balancing coefficient (``Routing.aux_loss_coef_key``) that is negative or
    not finite, or (DeepSeek) so few layers that none has experts (``first_moe_layer``); ``source``: where the
    model config came from."""
    routing = implementation_for(model_config.model_type).routing if model_config is not None else None
    if routing is None:
        return []
    dense = getattr(model_config, "first_k_dense_replace", None)
    first = first_moe_layer(dense, getattr(model_config, "moe_layer_freq", None))
    if model_config.num_hidden_layers <= first:
        return [
            f"num_hidden_layers: {model_config.num_hidden_layers} leaves no layer with experts in {source} (its "
            f"first {first} layers are dense: first_k_dense_replace {dense}); give num_hidden_layers {first + 1} "
            "or more"
        ]
    experts, top_k = getattr(model_config, routing.experts_key), getattr(model_config, routing.top_k_key)
    if experts < 1:
        return [
            f"{routing.experts_key}: {experts} in the model config of {source}; a mixture of experts needs 1 or more"
        ]
    if not 1 <= top_k <= experts:
        return [
            f"{routing.top_k_key}: {top_k} in the model config of {source} is outside [1, {routing.experts_key} "
            f"{experts}]; each token goes to 1 to {experts_text(experts)}"
        ]
    method = getattr(model_config, "topk_method", None)
    groups, used_groups = getattr(model_config, "n_group", None) or 1, getattr(model_config, "topk_group", None) or 1
    if method in GROUPED_TOPK_METHODS and (experts % groups or used_groups * (experts // groups) < top_k):
        return [
            f"{routing.experts_key}: {experts} experts in the model config of {source} do not split into n_group "
            f"{groups} equal groups of which topk_group {used_groups} hold {routing.top_k_key} {top_k} "
            f"(paddlenlp moe_gate.py routes {method} so); choose a multiple of {groups} of at least "
            f"{groups * -(-top_k // used_groups)}"
        ]
    if routing.topk_methods and method not in routing.topk_methods:
        return [
            f"topk_method: {method!r} in the model config of {source} is not one paddlenlp's gate computes "
            f"(moe_gate.topkgating would fail); use {' or '.join(map(repr, routing.topk_methods))}"
        ]
    coef = getattr(model_config, routing.aux_loss_coef_key)
    if not (isinstance(coef, (int, float)) and math.isfinite(coef) and coef >= 0):
        return [
            f"{routing.aux_loss_coef_key}: {coef} in the model config of {source} is not a coefficient >= 0 (a "
            "negative one rewards the routers for collapsing onto few experts, nan makes every loss nan); give "
            "e.g. 0.001, or 0 for no load-balancing loss"
        ]
    return []


def check_bias_balancing(model_config, args) -> list:
    """``moe_bias_update_rate`` above 0 for a model without routing biases (``pretrain.bias_balancing``: only
    DeepSeek-V3's ``topk_method: noaux_tc`` gate has ``e_score_correction_bias``)."""
    rate = args.moe_bias_update_rate
    if not rate or model_config is None or getattr(model_config, "topk_method", None) == "noaux_tc":
        return []
    return [
        f"moe_bias_update_rate: {rate} moves routing biases, which only a DeepSeek-V3 gate (topk_method noaux_tc) "
        f"has, not {model_config.model_type}'s; leave it unset"
    ]


def check_reentrant_recompute_of_router_loss(model_config, args) -> list:
    """``recompute_use_reentrant`` true under ``recompute`` for a mixture of experts whose load-balancing loss the
    trainer adds (``Routing.aux_loss_in_model`` empty) with a coefficient above 0: ``pretrain.routing`` reads the
    router logits from a forward hook, and paddle's reentrant recompute (``recompute_use_reentrant``, read by
    paddlenlp's decoders as ``use_reentrant``) runs the first forward of a recomputed layer under no_grad, so
    the loss built from them has ``stop_gradient`` True and its gradient is dropped, silently."""
    routing = implementation_for(model_config.model_type).routing if model_config is not None else None
    if routing is None or routing.aux_loss_in_model or not args.recompute:
        return []
    if not getattr(model_config, "recompute_use_reentrant", False):
        return []
    if not float(getattr(model_config, routing.aux_loss_coef_key, 0) or 0):
        return []
    return [
        f"recompute_use_reentrant: true drops the gradient of {model_config.model_type}'s load-balancing loss "
        "(its router logits are read in a forward hook, which reentrant recompute runs under no_grad); set "
        f"recompute_use_reentrant false (paddlenlp's default), or {routing.aux_loss_coef_key} 0"
    ]


def check_spike_rollback_layout(plan) -> list:
    """``loss_spike_policy rollback`` under sharding stage3: the rollback reloads the checkpoint into parameters
    paddle's ``GroupShardedStage3`` has released outside forward and backward (it keeps this rank's slice in
    ``fw_storage``), then ``broadcast_sharding_parameters`` coalesces them and fails (``Tensor holds no memory``
    on CPU, a hang on NCCL); the values would not reach the slices either."""
    layout = plan.layout
    if plan.training_args.loss_spike_policy != "rollback" or layout.sharding_parallel_degree <= 1:
        return []
    if layout.sharding_stage != 3:
        return []
    return [
        "loss_spike_policy: rollback cannot reload weights into sharding stage3's released parameters (they "
        "live as per-rank slices); use loss_spike_policy skip, or sharding stage1 or stage2 with rollback"
    ]


class DeviceSupport(NamedTuple):
    """What the run's device can do, for ``check_device``: this process's, or a planned cluster's GPU."""

    name: str  # "cpu", "gpu", or a part name such as "A100-SXM4-80GB"
    on_gpu: bool
    fp16: bool
    bf16: bool


def local_device(training_args) -> DeviceSupport:
    """This process's device and its fp16/bf16 support (``paddle.amp.is_*_supported``; on CPU also a matmul in
    the dtype: paddle 3.3.1's CPU build reports bfloat16 supported on a CPU with AVX512-BF16, yet registers its
    CPU matmul for float32/float64/int/complex only, so the first linear layer of a bf16 run fails)."""
    name = "gpu" if runs_on_gpu(training_args) else "cpu"
    on_gpu = name == "gpu"
    return DeviceSupport(
        name,
        on_gpu,
        paddle.amp.is_float16_supported(name) and (on_gpu or _cpu_matmul_runs("float16")),
        paddle.amp.is_bfloat16_supported(name) and (on_gpu or _cpu_matmul_runs("bfloat16")),
    )


@functools.lru_cache(maxsize=None)
def _cpu_matmul_runs(dtype: str) -> bool:
    """Whether paddle has a CPU matmul kernel for ``dtype`` (a [2, 2] x [2, 2] product)."""
    operand = paddle.ones([2, 2], dtype="float32").cpu().astype(dtype)
    try:
        paddle.matmul(operand, operand)
    except (RuntimeError, NotImplementedError):
        return False
    return True


def cluster_device(gpu) -> DeviceSupport:
    """A planned cluster's GPU (a ``pretrain.metrics.hardware.GpuSpec``): fp16 everywhere, bf16 from Ampere on."""
    return DeviceSupport(gpu.part, True, True, gpu.supports_bf16)


def check_device(plan, device: DeviceSupport) -> list:
    """Problems with GPU-only features on CPU, and with fp16/bf16 on the run's device."""
    args, layout = plan.training_args, plan.layout
    problems = []
    if not device.on_gpu:
        for name, what in GPU_ONLY_FLAGS:
            if getattr(args, name, False):
                problems.append(f"{name}: {what} needs a GPU build of paddle and device gpu; set {name} false on CPU")
        for name, what in GPU_ONLY_DEGREES:
            if getattr(layout, name) > 1:
                problems.append(
                    f"{name}: {what} is not supported on CPU here (needs GPUs); set it to 1 (see docs/distributed.md)"
                )
        if layout.sharding_stage >= 2 and "offload" in sharding_options(
            getattr(args, "sharding_configured", args.sharding)
        ):
            problems.append(
                f"sharding: stage{layout.sharding_stage} offload moves optimizer states from the GPUs to the host; "
                "on CPU they are there already: remove offload"
            )
        if layout.sharding_stage == 2 and "enable_stage2_overlap" in (args.sharding_parallel_config or ""):
            problems.append(
                "sharding_parallel_config: enable_stage2_overlap is not supported on CPU (paddlenlp waits for the "
                "overlapped parameter broadcasts with paddle.device.synchronize, which takes GPUs only); remove it"
            )
        if layout.sharding_stage == 3 and layout.sharding_parallel_degree > 1 and args.max_grad_norm > 0:
            problems.append(
                f"max_grad_norm: {args.max_grad_norm} cannot be applied under sharding stage3 on CPU (paddle 3.3.1's "
                "GroupShardedClipGrad moves the global gradient norm to a GPU); set max_grad_norm 0, or use "
                "sharding stage2"
            )
    if args.fp16 and not device.fp16:
        problems.append(
            f"fp16: float16 training is not supported on {device.name}; set fp16 false (or bf16 true where supported)"
        )
    if args.bf16 and not device.bf16:
        problems.append(
            f"bf16: bfloat16 training is not supported on {device.name}"
            + ("" if device.on_gpu else " (paddle's CPU matmul has no bfloat16 kernel)")
            + "; set bf16 false (fp16 on older GPUs)"
        )
    return problems


def check_fused_ln(training_args, place) -> list:
    """The ``fused_ln`` problem when ``use_fused_rms_norm`` is on: the op called once on ``place``
    (None: the import only)."""
    if not training_args.use_fused_rms_norm:
        return []
    problem = fused_ln_problem(place)
    return [f"use_fused_rms_norm: {problem}"] if problem else []


def check_model(plan) -> list:
    """Problems with the model config against the run: the sequence length, and the saved weights
    when continuing (they must exist and fit the run's tensor/pipeline layout)."""
    config = plan.model_config
    if config is None:
        return []
    problems = []
    limit = config.max_position_embeddings
    if plan.seq_length > limit:
        problems.append(
            f"max_seq_length: {plan.seq_length} exceeds max_position_embeddings {limit} of "
            f"{plan.model_args.model_name_or_path}; lower max_seq_length or raise max_position_embeddings"
        )
    if plan.model_args.continue_training:
        problem = saved_weights_problem(plan.model_args.model_name_or_path, plan.layout, config)
        problems += [problem] if problem else []
    return problems


def check_expert_parallel(plan) -> list:
    """Problems with ``use_expert_parallel``, one line each (the experts and top-k themselves: ``check_experts``).

    paddlenlp 3.0.0b4's ``MoELayer`` (Qwen2-MoE) spreads the experts over the data-parallel group whenever
    fleet's groups exist (``transformers/moe_layer.py:163``: a hybrid layout, or ``unified_checkpoint``
    with several processes), whatever ``use_expert_parallel`` says: the expert-parallel degree is the
    data-parallel degree. ``use_expert_parallel`` must say the same (the trainer and the CPU all-to-all
    follow it) and the experts must divide over those ranks (``moe_layer.py:200`` asserts it). Expert
    parallelism is verified beside data parallelism and sharding stage1 (tests/test_expert_parallel.py). The
    rules that depend on the layout alone are ``layout_rules.expert_parallel_problems``, which the planner applies too.
    """
    config, args, layout = plan.model_config, plan.training_args, plan.layout
    routing = implementation_for(config.model_type).routing if config is not None else None
    if routing is None:  # a dense model (or none known): one line when expert parallelism is asked for
        return layout_rules.expert_parallel_problems(config, layout) if args.use_expert_parallel and config else []
    problems = []
    ranks = layout.data_parallel_degree
    fleet_groups = has_fleet_groups(args, layout.world_size)
    spread = not routing.no_expert_parallel and fleet_groups and ranks > 1
    if spread and not args.use_expert_parallel:
        problems.append(
            f"use_expert_parallel: false, but paddlenlp spreads {config.model_type}'s experts over the {ranks} "
            "data-parallel ranks when fleet's groups exist (moe_layer.py:163; here: unified_checkpoint or a "
            "hybrid layout); set use_expert_parallel true (or unified_checkpoint false to replicate them)"
        )
    if not args.use_expert_parallel:
        return problems
    layout_problems = layout_rules.expert_parallel_problems(config, layout)  # one process too: a model that
    if layout_problems or layout.world_size <= 1:  # cannot spread its experts is refused before any launch
        return problems + layout_problems
    if not fleet_groups:
        problems.append(
            "use_expert_parallel: paddlenlp takes the expert-parallel group from fleet's (moe_layer.py:163), "
            "which a data-parallel run creates only with unified_checkpoint; set unified_checkpoint true"
        )
    return problems


def check_layout(plan) -> list:
    """Problems dividing the model over the layout (``pretrain.layout_rules.problems``): each is
    otherwise an assertion inside paddle's or paddlenlp's layers, minutes into a GPU job. The kernel
    flags are read from the model config, which holds them after ``build_model_config``."""
    config = plan.model_config
    if config is None:
        return []
    flags = layout_rules.RunFlags.of(
        plan.seq_length,
        Precision.from_arguments(plan.training_args),
        getattr(config, "use_flash_attention", None),
        getattr(config, "fuse_attention_qkv", None),
    )
    return layout_rules.problems(config, plan.layout, flags)


def warn_run(plan) -> list:
    """What runs but probably wastes memory or precision, one line each (logged as warnings):

    - K/V heads or the vocabulary not divisible by tensor_parallel_degree: paddlenlp keeps a full copy
      on every rank (LLaMA family, Qwen2);
    - layers not divisible by the pipeline degree: paddle splits them unevenly ("uniform");
    - fp16/bf16 AMP O2 with gradient accumulation and no ``amp_master_grad``: gradients of every
      micro-batch are summed in 16 bits (stage2 keeps fp32 main gradients only with it);
    - ``recompute`` on at a ``recompute_granularity`` the model ignores (GPT without pipeline
      parallelism and ``full``; QWen v1 and ``full_attn``);
    - a model vocabulary that differs from the named published architecture's (beyond the padding to
      a multiple of 128), e.g. Baichuan2-7B built from a 32,000-token tokenizer;
    - expert parallelism from scratch: the initial weights are not those one process draws at the same seed;
    - continue_training from a config.json whose begin/end-of-text ids are not the tokenizer's (the run saves
      the tokenizer's: ``model_config.set_token_ids``);
    - a resume with a larger ``max_steps`` than the checkpoint's run, which stretches a decay that
      follows max_steps (``pretrain.lr_schedule.stretched_schedule``: how the rate jumps).
    """
    config, layout, args = plan.model_config, plan.layout, plan.training_args
    if config is None:
        return []
    warnings = layout_rules.replications(config, layout)
    pp = layout.pipeline_parallel_degree
    if pp > 1 and config.num_hidden_layers % pp:
        warnings.append(
            f"pipeline_parallel_degree: {config.num_hidden_layers} layers do not divide into {pp} stages; "
            "paddle splits them unevenly and the largest stage sets the pace"
        )
    weights = Precision.from_arguments(args).param_dtype
    if weights != "float32" and args.gradient_accumulation_steps > 1 and not args.amp_master_grad:
        warnings.append(
            f"amp_master_grad: {weights} weights with gradient_accumulation_steps "
            f"{args.gradient_accumulation_steps} sum every micro-batch's gradients in 16 bits; "
            "set amp_master_grad true for fp32 gradients (as the family recipes do)"
        )
    if args.recompute:
        units = implementation_for(config.model_type).recomputed_units[pp > 1]
        if not units.get(args.recompute_granularity):
            useful = ", ".join(granularity for granularity, recomputed in units.items() if recomputed)
            warnings.append(
                f"recompute_granularity: {args.recompute_granularity!r} recomputes nothing in paddlenlp's "
                f"{type(plan.model_config).__name__.replace('Config', '')} model"
                f"{' with pipeline parallelism' if pp > 1 else ''}; recompute is on but saves no memory. "
                f"Use one of: {useful}"
            )
    arch = find_model_size(plan.model_args.model_name_or_path)
    if arch is not None and arch.published_params and not plan.model_args.continue_training:
        published = padded_vocab_size(arch.config["vocab_size"])
        if padded_vocab_size(config.vocab_size) != published:
            warnings.append(
                f"vocab_size: the model gets {config.vocab_size} embedding rows, {arch.name} has "
                f"{arch.config['vocab_size']}: the tokenizer in {plan.model_args.tokenizer_name_or_path} is not "
                f"{arch.name}'s; use its tokenizer, or set vocab_size {arch.config['vocab_size']} to keep the "
                "architecture's shape"
            )
    ep = layout_rules.expert_parallel_degree(layout, args.use_expert_parallel)
    if ep > 1 and not plan.model_args.continue_training and plan.resume_checkpoint is None:
        experts = experts_text(decoder_shape(config).experts // ep)
        warnings.append(
            f"use_expert_parallel: from scratch, the {ep} ranks start from other weights than one process at the "
            f"same seed, every weight included: each rank builds only its {experts} per MoE layer "
            "(paddlenlp's MoELayer, moe_layer.py:185), so the random draws of every later weight shift, and each rank "
            "draws its experts from its own seed (paddlenlp's set_seed adds the data-parallel rank; expert weights "
            "are not broadcast); for the same start as one process, give model_name_or_path the output_dir of a "
            "one-process run with max_steps 1 and learning_rate 0, and continue_training true"
        )
    source = plan.model_args.model_name_or_path
    if plan.model_args.continue_training and plan.tokenizer is not None and os.path.isdir(source):
        differences = token_id_differences(load_local_config(source), special_token_ids(plan.tokenizer))
        if differences:
            warnings.append(
                f"continue_training: {os.path.join(source, CONFIG_NAME)} has "
                f"{describe_token_id_differences(differences)}; the run saves the tokenizer's, which its data ends "
                "documents with"
            )
    if plan.resume_checkpoint is not None and args.do_train:
        saved = saved_max_steps(plan.resume_checkpoint)
        stretched = saved and stretched_schedule(args, step_of(plan.resume_checkpoint), saved)
        if stretched:
            warnings.append(stretched)
    return warnings


def check_data_source(prefix: str, split: str, vocab_size: Optional[int], need_valid: bool) -> list:
    """Problems with one data prefix (.bin/.idx or legacy _ids.npy/_idx.npz): unreadable files, index vs
    token file, empty splits the run needs, token ids vs ``vocab_size``."""
    try:
        found = verify(prefix)
    except UserError as e:
        found = [str(e)]
    except OSError as e:
        return [f"input_dir: cannot read {e.filename} ({e.strerror}); fix its permissions or re-copy it"]
    if found:
        return [f"input_dir: {problem}; re-copy it or re-run create_pretraining_data.py" for problem in found]
    try:
        summary = summarize_prefix(prefix, split)
    except UserError as e:
        return [str(e)]
    except OSError as e:
        return [f"input_dir: cannot read {e.filename} ({e.strerror}); fix its permissions or re-copy it"]
    problems = []
    names = ("train", "validation") if need_valid else ("train",)
    for name, documents in zip(names, summary.split_documents):
        if documents == 0:
            problems.append(
                f"split: '{split}' leaves the {name} split of {prefix} ({summary.documents} documents) empty; "
                f"raise its share of split" + (" or set do_eval false" if name == "validation" else "")
            )
    if vocab_size is not None and summary.max_token_id is not None and summary.max_token_id >= vocab_size:
        problems.append(
            f"vocab_size: {prefix}.bin ({summary.dtype}) holds token id {summary.max_token_id} but the model has "
            f"{vocab_size} embedding rows; tokenize with this run's tokenizer or raise vocab_size above it"
        )
    return problems


def check_data(plan) -> list:
    """``check_data_source`` for every data source of the plan, then ``check_tokenizer_agreement``; a
    blend needs validation documents in one source only (``pretrain.data.build_datasets`` leaves the
    others out of the validation blend)."""
    if not plan.data:  # fine-tuning: no pretraining sources
        return []
    vocab_size = plan.model_config.vocab_size if plan.model_config is not None else None
    split, need_valid, blend = plan.data_args.split, plan.training_args.do_eval, len(plan.data) > 1
    problems = []
    for source in plan.data:
        # a blend leaves a source with no validation documents out of its validation blend
        problems += check_data_source(source.prefix, split, vocab_size, need_valid=need_valid and not blend)
    if need_valid and blend and not problems:
        if all(summarize_prefix(source.prefix, split).split_documents[1] == 0 for source in plan.data):
            problems.append(
                f"split: '{split}' leaves the validation split of every source empty; raise its share of split "
                "or set do_eval false"
            )
    return problems or check_tokenizer_agreement(plan)


def _tokenizer_record(tokenizer_class: str, vocab_size, eos_token_id) -> dict:
    """What must agree between the data and the run: class (a fast twin counts as the same), vocabulary
    size and EOS id (None when the data has no EOS appended: not compared)."""
    return {
        "tokenizer class": tokenizer_class.removesuffix("Fast"),
        "vocabulary size": vocab_size,
        "EOS id": eos_token_id,
    }


def check_tokenizer_agreement(plan) -> list:
    """Each data prefix's tokenizer, as its current ``.stats.json`` records it (``tokenizer_class``,
    ``vocab_size``, ``eos_token_id``, written by create_pretraining_data.py), against the run's
    tokenizer (``len(tokenizer)``: the vocabulary with added tokens, as preprocessing counts it).
    Waived by ``allow_tokenizer_mismatch``; a prefix without a current sidecar is not compared."""
    tokenizer = plan.tokenizer
    if tokenizer is None or getattr(plan.data_args, "allow_tokenizer_mismatch", True):
        return []
    path = plan.model_args.tokenizer_name_or_path or plan.model_args.model_name_or_path
    # a tokenizer.json folder's TokenizerJson names the class its config names, as its data records it
    ours = _tokenizer_record(
        getattr(tokenizer, "tokenizer_class", type(tokenizer).__name__), len(tokenizer), tokenizer.eos_token_id
    )
    problems = []
    for source in plan.data:
        try:
            stats = current_stats(source.prefix)
        except UserError as e:
            problems.append(str(e))
            continue
        if stats is None or "tokenizer_class" not in stats:
            continue
        theirs = _tokenizer_record(stats["tokenizer_class"], stats.get("vocab_size"), stats.get("eos_token_id"))
        differ = [
            f"{what} {theirs[what]} vs {ours[what]}"
            for what in theirs
            if theirs[what] is not None and theirs[what] != ours[what]
        ]
        if differ:
            problems.append(
                f"tokenizer_name_or_path: {source.prefix}.stats.json records the data's tokenizer "
                f"({stats.get('tokenizer')}) and this run's ({path}) differs: {', '.join(differ)}; tokenize the "
                "data with this run's tokenizer, or train with the data's; allow_tokenizer_mismatch true waives this"
            )
    return problems


def writable_folder_problem(key: str, folder: str) -> tuple:
    """(nearest existing folder of ``folder``, None) when a file can be created there, else (None, problem):
    a line starting with ``key`` (e.g. ``output_dir`` or a tool's ``--output``) when ``folder`` or one of
    its parents is a file, or the nearest existing folder is not writable."""
    existing = os.path.abspath(folder)
    while not os.path.isdir(existing):
        if os.path.exists(existing):
            return None, f"{key}: {existing} is a file, not a folder; choose another {key}"
        existing = os.path.dirname(existing)
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".preflight-"):
            pass
    except OSError as e:
        return None, f"{key}: cannot write to {existing} ({e.strerror}); choose a writable {key}"
    return existing, None


def check_output_dir(output_dir: str, needed_bytes: Optional[int], checkpoints: int = 1, reused_bytes: int = 0) -> list:
    """Problems writing ``output_dir`` (or its nearest existing parent) and fitting ``checkpoints``
    checkpoints of ``needed_bytes`` each, in its free space plus ``reused_bytes`` (checkpoints already
    there, which the run replaces or rotates away)."""
    existing, problem = writable_folder_problem("output_dir", output_dir)
    if problem:
        return [problem]
    free = shutil.disk_usage(existing).free
    if needed_bytes is not None and free + reused_bytes < needed_bytes * checkpoints:
        what = "one checkpoint needs" if checkpoints == 1 else f"{checkpoints} checkpoints on disk at once need"
        reused = f" (plus {reused_bytes / GIB:.2f} GiB in its checkpoints)" if reused_bytes else ""
        return [
            f"output_dir: {what} about {needed_bytes * checkpoints / GIB:.2f} GiB but {existing} has "
            f"{free / GIB:.2f} GiB free{reused}; free space, lower save_total_limit or choose another output_dir"
        ]
    return []


def index_cache_bytes(plan) -> int:
    """About how many bytes paddlenlp's sample index of the run takes (every split, every source)."""
    counts = [index_counts(source.prefix)[:2] for source in plan.data]  # (documents, tokens) per source
    total = 0
    for samples in num_samples_per_split(plan.training_args, plan.layout):
        total += INDEX_BYTES_PER_SAMPLE * samples
        for documents, tokens in counts:
            epochs = math.ceil(samples * plan.seq_length / max(tokens, 1)) + 1
            total += INDEX_BYTES_PER_DOCUMENT_EPOCH * documents * epochs
    return total


def check_index_cache(plan) -> list:
    """Problems writing the index cache folder (``data_cache`` or ``<data folder>/index-cache``) and fitting
    the sample index."""
    if not plan.data:
        return []
    existing, problem = writable_folder_problem("data_cache", index_cache_root(plan.data_args, plan.data))
    if problem:
        return [problem]
    needed, free = index_cache_bytes(plan), shutil.disk_usage(existing).free
    if free < needed:
        return [
            f"data_cache: the sample index needs about {needed / GIB:.2f} GiB but {existing} has {free / GIB:.2f} GiB "
            "free; free space or point data_cache at a bigger disk"
        ]
    return []


def check_continue_training_output(model_args, training_args) -> list:
    """The problem of writing into the folder that ``continue_training`` loads its weights from."""
    source, output_dir = model_args.model_name_or_path, training_args.output_dir
    if not (model_args.continue_training and os.path.isdir(source)):
        return []
    if os.path.realpath(source) != os.path.realpath(output_dir):
        return []
    return [
        f"output_dir: {output_dir} is the folder continue_training loads from (model_name_or_path); the run "
        "would resume that run's checkpoints and overwrite its model; set output_dir to a new folder"
    ]


def check_resume_architecture(plan) -> list:
    """The problem of resuming a checkpoint whose model (its ``config.json``) is not the run's: paddle
    would refuse the weights only after the data index and the model are built, with a traceback."""
    folder, config = plan.resume_checkpoint, plan.model_config
    if folder is None or config is None or not os.path.isfile(os.path.join(folder, CONFIG_NAME)):
        return []
    try:
        difference = architecture_difference(load_local_config(folder), config)
    except UserError as e:
        return [str(e)]
    if difference is None:
        return []
    name, saved, value = difference
    return [
        f"{name}: this run asks for {value}, but {folder}, the checkpoint it resumes, holds a model with "
        f"{name} {saved}; keep {name} {saved} to resume it, or pass --overwrite_output_dir true to start "
        "afresh (the old run is moved aside)"
    ]


def _output_checks(plan, data_problems: list) -> list:
    """The checks only the machine that runs the plan can answer: room in output_dir for a checkpoint,
    room for the sample index (when the data passed), the continue-training output, the architecture
    and layout of the checkpoint to resume from."""
    args = plan.training_args
    parameters = plan.checkpoint_parameters
    needed = checkpoint_bytes(parameters, args) if parameters is not None else None
    return [
        *check_output_dir(args.output_dir, needed, checkpoints_on_disk(args), reused_checkpoint_bytes(args)),
        *([] if data_problems else check_index_cache(plan)),
        *check_continue_training_output(plan.model_args, args),
        *check_resume_architecture(plan),
        *resume_layout_problems(plan),
    ]


def _this_place(device: DeviceSupport):
    """This process's paddle place: its GPU when the run uses one, else the CPU."""
    return paddle.CUDAPlace(paddle.distributed.ParallelEnv().dev_id) if device.on_gpu else paddle.CPUPlace()


def check_run(plan, gpu=None) -> list:
    """Every problem of a ``RunPlan``: what resolution could not resolve, then each check above.

    On this machine (``gpu`` None) the ``fused_ln`` op is called once on this process's device and
    the output checks run (``_output_checks``). For a GPU cluster the plan was resolved for
    (``resolve_run(..., on_cluster=True)``; ``gpu`` its ``GpuSpec``) the checks are those that can be
    answered here, for the cluster's GPU: not the ``fused_ln`` build, the output folder's space or
    data files that are not on this machine.

    Returns:
        One line per problem (empty when the run may start).
    """
    args = plan.training_args
    here = gpu is None
    device = local_device(args) if here else cluster_device(gpu)
    data_problems = check_data(plan)
    return [
        *plan.problems,
        *check_arguments(args),
        *check_values(args),
        *check_async_save(args),
        *check_distributed_dataloader(args),
        *check_device(plan, device),
        *(check_fused_ln(args, _this_place(device)) if here else []),
        *check_model(plan),
        *check_attention_heads(plan.model_config),
        *check_experts(plan.model_config, plan.model_args.model_name_or_path),
        *check_bias_balancing(plan.model_config, plan.training_args),
        *check_reentrant_recompute_of_router_loss(plan.model_config, plan.training_args),
        *check_spike_rollback_layout(plan),
        *check_layout(plan),
        *check_expert_parallel(plan),
        *document_masking_problems(plan),
        *data_problems,
        *(_output_checks(plan, data_problems) if here else []),
    ]


def raise_problems(problems: list) -> None:
    """``pretrain.errors.raise_problems`` of the preflight: one ``UserError`` listing ``problems``.

    Raises:
        UserError: there is at least one problem.
    """
    errors.raise_problems(problems, "preflight")
