"""What the planner estimates: one training configuration on one cluster (``Workload``).

A Workload holds the model config, the parallel layout, the batch and sequence, the memory and
speed knobs paddlenlp exposes (recompute and its granularity, flash attention, fused kernels,
precision and AMP level, fp32 master gradients) and the GPU. ``Workload.from_arguments`` reads
them from the parsed arguments of a run (``pretrain.arguments.parse_arguments``), so the forecast (tools/plan.py) and
a real launch read the same flags.

Precision (dtype, AMP level, fp32 main gradients) is ``pretrain.precision.Precision`` of the run's
arguments; its docstring says how paddlenlp's Trainer holds each tensor at each level.
"""

from __future__ import annotations

from dataclasses import dataclass

from paddlenlp.transformers import PretrainedConfig

from pretrain.errors import UserError
from pretrain.layout import ParallelLayout
from pretrain.layout_rules import expert_parallel_degree
from pretrain.metrics.hardware import GpuSpec, find_gpu
from pretrain.precision import Precision

PRECISIONS = ("fp32", "fp16", "bf16")
AMP_LEVELS = ("O1", "O2")
RECOMPUTE_GRANULARITIES = ("full", "full_attn", "core_attn")


@dataclass(frozen=True)
class Workload:
    """One configuration to estimate. Sizes: samples (micro batch), tokens (sequence)."""

    model_config: PretrainedConfig  # paddlenlp config; vocab_size as the run sets it
    layout: ParallelLayout
    gpu: GpuSpec
    micro_batch_size: int  # samples per card per forward (per_device_train_batch_size)
    gradient_accumulation_steps: int  # micro-batches per optimizer step (pipeline: per step)
    seq_length: int  # tokens per sample
    recompute: bool = False
    recompute_granularity: str = "full"  # "full", "full_attn" or "core_attn"
    use_flash_attention: bool = False
    precision: str = "bf16"  # "fp32", "fp16" or "bf16"
    amp_level: str = "O2"  # "O1" or "O2"; ignored for fp32
    amp_master_grad: bool = False  # float32 main gradients under O2
    use_fused_rms_norm: bool = False  # the fused_ln op for RMSNorm / LayerNorm
    use_fused_rope: bool = False  # paddle's fused rotary embedding (GPU)
    fuse_attention_qkv: bool = False  # one column-parallel matmul for Q, K and V
    fuse_attention_ffn: bool = False  # one column-parallel matmul for the MLP gate and up
    dense_document_mask: bool = False  # reset_attention_mask without flash attention: a [b, 1, s, s] mask
    expert_parallel: bool = False  # use_expert_parallel: the experts spread over the data-parallel ranks
    # mixture of experts: the busiest expert's tokens / the mean (1.0: balanced routing); a run logs it as
    # expert_imbalance (pretrain.routing). Scales the dropless dispatch's all-to-all (pretrain.planner.experts)
    routing_imbalance: float = 1.0

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise UserError(f"precision {self.precision!r} is not one of {PRECISIONS}")
        if self.amp_level not in AMP_LEVELS:
            raise UserError(f"amp_level {self.amp_level!r} is not one of {AMP_LEVELS}")
        if self.recompute_granularity not in RECOMPUTE_GRANULARITIES:
            raise UserError(
                f"recompute_granularity {self.recompute_granularity!r} is not one of {RECOMPUTE_GRANULARITIES}"
            )
        for name in ("micro_batch_size", "gradient_accumulation_steps", "seq_length"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.routing_imbalance < 1:
            raise UserError(
                f"routing_imbalance must be >= 1 (the busiest expert's tokens / the mean), got {self.routing_imbalance}"
            )

    @property
    def pure_low_precision(self) -> bool:
        """AMP O2: 16-bit parameters, float32 master weights in the optimizer."""
        return self.precision != "fp32" and self.amp_level == "O2"

    @property
    def activation_bytes(self) -> int:
        """Bytes per activation element: 2 under AMP (O1 autocasts matmul inputs to 16 bit), 4 in fp32.

        O1 keeps float32 residuals and norms; the planner counts them as 16 bit (a known limit).
        """
        return 4 if self.precision == "fp32" else 2

    @property
    def param_bytes(self) -> int:
        """Bytes per parameter element as the model holds it: 2 under O2, else 4."""
        return 2 if self.pure_low_precision else 4

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element: 4 with float32 gradients (fp32, O1, O2 + amp_master_grad), else 2."""
        return 4 if (not self.pure_low_precision or self.amp_master_grad) else 2

    @property
    def expert_parallel_degree(self) -> int:
        """Ranks each MoE layer's experts are spread over (``layout_rules.expert_parallel_degree``; 1: none)."""
        return expert_parallel_degree(self.layout, self.expert_parallel)

    @property
    def tokens_per_micro_batch(self) -> int:
        """Tokens one card processes per forward: micro batch x sequence."""
        return self.micro_batch_size * self.seq_length

    @property
    def global_batch_samples(self) -> int:
        """Samples per optimizer step over all cards: micro batch x accumulation x data-parallel replicas."""
        return self.layout.global_batch_samples(self.micro_batch_size, self.gradient_accumulation_steps)

    @classmethod
    def from_arguments(cls, model_config, layout, model_args, data_args, training_args, gpu) -> Workload:
        """The Workload of a parsed run.

        Args:
            model_config: the run's paddlenlp config from ``build_model_config`` (flags and ``vocab_size``
                as the run sets them).
            layout: ``ParallelLayout.from_arguments(training_args, nnodes)`` (under
                ``simulated_launch`` for a cluster other than this machine).
            model_args, data_args, training_args: from ``pretrain.arguments.parse_arguments``.
            gpu: a ``GpuSpec`` or a part / CUDA name for ``pretrain.metrics.hardware.find_gpu``.

        Kernel and recompute flags (``use_flash_attention``, ``use_fused_rms_norm``,
        ``use_fused_rope``, ``fuse_attention_qkv``, ``fuse_attention_ffn``,
        ``recompute_granularity``) are read from the model config, their one holder once
        ``pretrain.model_config.build_model_config`` has set them (paddlenlp's ``LlmMetaConfig``
        fields from the training arguments, ``fuse_attention_qkv/ffn`` from the model arguments);
        None counts as unset. ``model_args`` reach the planner through that config only.

        Raises:
            UserError: unknown GPU name, or a value the planner does not model.
        """
        if isinstance(gpu, str):
            spec = find_gpu(gpu)
            if spec is None:
                raise UserError(
                    f"GPU {gpu!r} is not in pretrain.metrics.hardware.GPU_SPECS; name an A100, A800, H100, H800 or H200"
                )
            gpu = spec

        def flag(name: str, default):
            value = getattr(model_config, name, None)
            return default if value is None else value

        precision = Precision.from_arguments(training_args)
        document_masked = bool(getattr(data_args, "reset_attention_mask", False))  # fine-tuning data has none
        return cls(
            model_config=model_config,
            layout=layout,
            gpu=gpu,
            micro_batch_size=training_args.per_device_train_batch_size,
            gradient_accumulation_steps=training_args.gradient_accumulation_steps,
            seq_length=data_args.max_seq_length,
            recompute=bool(training_args.recompute),
            recompute_granularity=flag("recompute_granularity", "full"),
            use_flash_attention=bool(flag("use_flash_attention", False)),
            precision=precision.amp,
            amp_level=precision.level,
            amp_master_grad=precision.amp_master_grad,
            use_fused_rms_norm=bool(flag("use_fused_rms_norm", False)),
            use_fused_rope=bool(flag("use_fused_rope", False)),
            fuse_attention_qkv=bool(flag("fuse_attention_qkv", False)),
            fuse_attention_ffn=bool(flag("fuse_attention_ffn", False)),
            dense_document_mask=document_masked and not flag("use_flash_attention", False),
            expert_parallel=bool(getattr(training_args, "use_expert_parallel", False)),
        )
