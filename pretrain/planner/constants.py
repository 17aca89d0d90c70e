"""Every constant of the planner, in one table, each with its source or the calibration that set it.

Calibrated constants were fitted once, by ``benchmarks/planner_accuracy.py --fit``, on the
published cases of FlagPerf ``training/nvidia/llama1_7B-paddle/README.md`` (LLaMA-7B, eight
strategies on 8 x A100 40/80 GB), PaddleNLP ``llm/docs/pretrain.rst`` (Llama-2-7B/13B, Qwen-7B,
Baichuan2-7B at sequence 4096) and FlagPerf ``training/nvidia/llama2_7b-megatron-deepspeed``;
the same values serve every model and layout (no per-case constants). docs/planner.md shows the
table with the fit's residuals.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


def _c(value: float, unit: str, source: str):
    return field(default=value, metadata={"unit": unit, "source": source})


@dataclass(frozen=True)
class ArchitectureEfficiency:
    """Achieved fractions of a GPU's datasheet rates, per GPU architecture (``GpuSpec.architecture``)."""

    gemm: float  # fraction of dense 16-bit peak FLOP/s that training matmuls achieve
    flash_attention: float  # fraction of peak that causal flash attention achieves, fwd + bwd
    hbm: float  # fraction of datasheet HBM bandwidth that elementwise kernels achieve


@dataclass(frozen=True)
class PlannerConstants:
    """The planner's constants. Units: fractions, seconds, GiB (2**30 bytes)."""

    # -- memory ------------------------------------------------------------------------------------
    device_overhead_gib: float = _c(
        2.33,
        "GiB",
        "device memory beyond paddle's max_memory_allocated (CUDA context, NCCL buffers, allocator reserve): "
        "PaddleNLP llm/docs/pretrain.rst, footnote to its benchmark table: physical memory is 'about 2-3 GB "
        "more' than max_memory_allocated; 2.5 GB = 2.33 GiB",
    )
    unmodeled_allocated_gib: float = _c(
        2.86,
        "GiB",
        "allocations the tensor-by-tensor count misses (framework buffers, kernel workspaces, and what the "
        "paddle/paddlenlp versions of the published runs kept beyond the installed ones); calibrated: the "
        "median of published - modelled memory over the 18 published memory figures",
    )
    # -- throughput --------------------------------------------------------------------------------
    backward_traffic_factor: float = _c(
        2.0,
        "backward bytes / forward bytes",
        "an elementwise op's backward reads its saved inputs and the output gradient and writes the input "
        "gradients: about twice its forward's bytes (as backward matmuls cost 2x forward FLOPs)",
    )
    collective_efficiency: float = _c(
        0.75,
        "NCCL bus bandwidth / link bandwidth",
        "assumed, not fitted: NCCL's ring collectives on DGX A100 reach a bus bandwidth of about 230 GB/s "
        "(nccl-tests all_reduce_perf, large messages) of NVLink's 300 GB/s per direction",
    )
    collective_latency_sec: float = _c(
        20e-6, "seconds per collective", "assumed: NCCL ring latency on 8 GPUs, order 10-30 us (nccl-tests small sizes)"
    )
    architectures: dict = field(
        default_factory=lambda: {
            "ampere": ArchitectureEfficiency(gemm=0.625, flash_attention=0.55, hbm=0.90),
            "hopper": ArchitectureEfficiency(gemm=0.72, flash_attention=0.22, hbm=0.90),
        },
        metadata={"unit": "fraction of the datasheet rate", "source": "per entry: ARCHITECTURE_SOURCES"},
    )

    def efficiency(self, architecture: str) -> ArchitectureEfficiency:
        """The efficiencies of a GPU architecture; unknown architectures use Ampere's."""
        return self.architectures.get(architecture, self.architectures["ampere"])


DEFAULT_CONSTANTS = PlannerConstants()

_H100 = "measured on one H100 SXM5 80GB (benchmarks/gpu_efficiency.py, torch 2.11 + CUDA 13, two runs, 2026-11-22)"
ARCHITECTURE_SOURCES = {
    "ampere.gemm": "calibrated: grid search on the published tokens/card/s (benchmarks/planner_accuracy.py --fit); "
    "absorbs what paddle's step loses beyond the modelled terms",
    "ampere.flash_attention": "Dao 2023, FlashAttention-2, Fig. 5: ~165-175 TFLOP/s causal forward + backward, head "
    "size 128, sequence 2k-4k, on an A100 80GB (of 312)",
    "ampere.hbm": "the H100 measurement's fraction (same copy kernels; no A100 was at hand)",
    "hopper.gemm": f"{_H100}: cuBLAS fp16/bf16 at decoder shapes (M 2048-16384 tokens), mean 0.72 (0.60-0.82) of "
    "989 TFLOP/s; cuBLAS alone, without the framework losses ampere.gemm absorbs, so likely optimistic",
    "hopper.flash_attention": f"{_H100}: FlashAttention-2 (SDPA) causal forward + backward, head 128, sequence "
    "2048-4096, mean 0.22 (0.17-0.25) of 989 TFLOP/s",
    "hopper.hbm": f"{_H100}: device copy and add, mean 3.0 TB/s of 3.35",
}


def constants_table(constants: PlannerConstants = DEFAULT_CONSTANTS) -> list:
    """Rows (name, value, unit, source) of every constant, for docs and the accuracy script."""
    rows = []
    for f in fields(constants):
        value = getattr(constants, f.name)
        if isinstance(value, dict):
            for arch, eff in value.items():
                for g in fields(eff):
                    name = f"{arch}.{g.name}"
                    rows.append((name, getattr(eff, g.name), f.metadata["unit"], ARCHITECTURE_SOURCES.get(name, "")))
        else:
            rows.append((f.name, value, f.metadata["unit"], f.metadata["source"]))
    return rows
