"""Peak dense FLOP/s per card, the denominator of MFU.

GPU: a table of NVIDIA's datasheet figures for 16-bit (bf16 and fp16, equal on these parts)
tensor-core math *without* structured sparsity, looked up by the CUDA device name. Benchmark
tables quote MFU against this figure whatever the run's precision, and so do we.

Sources (NVIDIA datasheets; the datasheets print the sparse figure, dense = sparse / 2):
- A100 SXM4 and PCIe, 40 and 80 GB: 312 TFLOP/s bf16/fp16 dense ("NVIDIA A100 Tensor Core GPU"
  datasheet, 2021: 312 | 624 with sparsity).
- A800 SXM4 and PCIe: 312 TFLOP/s (NVIDIA A800 datasheet: 624 with sparsity); the export
  variant of A100 with slower NVLink, same compute.
- H100 SXM5: 989 TFLOP/s; H100 PCIe: 756; H100 NVL: 835 ("NVIDIA H100 Tensor Core GPU" datasheet,
  2023: 1,979 / 1,513 / 1,671 with sparsity).
- H800 SXM5: 989; H800 PCIe: 756 (NVIDIA H800 datasheet: 1,979 / 1,513 with sparsity).
- H200 SXM: 989; H200 NVL: 835 ("NVIDIA H200 Tensor Core GPU" datasheet, 2024: 1,979 / 1,671
  with sparsity).

CPU: there is no table. ``measure_peak_flops`` runs a float32 matmul microbenchmark and reports
the best FLOP/s it achieves (an achievable peak, not a datasheet one). On a shared machine other
jobs only ever slow the probe down, so the best of several sizes and repeats (about 2 s) is the
figure closest to what the cores can do; the 1-minute load average is kept in the source string.
If the probe still ran slow, the run's MFU comes out above 1 and is reported as null
(``pretrain.metrics.flops.MFU_CREDIBLE_MAX``). Without it and without ``peak_flops_per_card``, MFU is null.
"""

from __future__ import annotations

import os
import re
import time
from typing import NamedTuple, Optional

import paddle

# (regex on the CUDA device name, part, peak bf16/fp16 dense FLOP/s). First match wins, so the
# PCIe and NVL variants come before the bare name (the SXM part reports e.g. "NVIDIA H100 80GB HBM3").
PEAK_FLOPS_TABLE = (
    (r"\bA100\b", "A100", 312e12),
    (r"\bA800\b", "A800", 312e12),
    (r"\bH100\b.*PCIe", "H100 PCIe", 756e12),
    (r"\bH100\b.*NVL", "H100 NVL", 835e12),
    (r"\bH100\b", "H100 SXM", 989e12),
    (r"\bH800\b.*PCIe", "H800 PCIe", 756e12),
    (r"\bH800\b", "H800 SXM", 989e12),
    (r"\bH200\b.*NVL", "H200 NVL", 835e12),
    (r"\bH200\b", "H200 SXM", 989e12),
)


class PeakFlops(NamedTuple):
    """A peak FLOP/s per card and where it came from (``override``, ``datasheet: <part>``, ``measured: ...``)."""

    flops_per_sec: float
    source: str


def datasheet_peak_flops(device_name: str) -> Optional[PeakFlops]:
    """Dense bf16/fp16 peak FLOP/s of a GPU from its CUDA name (e.g. "NVIDIA A100-SXM4-80GB"), or None if unknown."""
    for pattern, part, peak in PEAK_FLOPS_TABLE:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return PeakFlops(peak, f"datasheet: {part} bf16/fp16 dense")
    return None


# Square matmul sizes the CPU peak probe tries: small enough that one call is quick on 2 cores,
# large enough (>= 512) that the FLOPs dominate the call overhead.
PROBE_SIZES = (512, 1024, 2048)
PROBE_REPEATS = 3  # timed trials per size
PROBE_TRIAL_SECONDS = 0.2  # each trial repeats the matmul for at least this long


def _timed_matmuls(a, b, min_seconds: float) -> float:
    """Achieved FLOP/s of ``a @ b`` (square float32) repeated for at least ``min_seconds``."""
    size = a.shape[0]
    calls, start = 0, time.perf_counter()
    while True:
        c = paddle.matmul(a, b)
        calls += 1
        float(c[0, 0])  # reading a value waits for the device
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return calls * 2.0 * size**3 / elapsed  # 2 * size**3 FLOPs per call: a multiply and an add per term


def measure_matmul_flops(
    sizes: tuple = PROBE_SIZES, repeats: int = PROBE_REPEATS, min_seconds: float = PROBE_TRIAL_SECONDS
) -> float:
    """The best achieved FLOP/s of float32 square matmuls ``[size, size] x [size, size]`` on the current
    device, over ``repeats`` rounds of one timed trial (at least ``min_seconds``) per size in ``sizes``,
    after one untimed call per size: about ``len(sizes) x (repeats + 1) x min_seconds`` seconds or more.

    The best, not the mean: load from other processes only ever lowers a trial's rate. Rounds go
    over all sizes in turn, so a burst of load spoils one trial of each size rather than one size.
    """
    operands = [(paddle.randn([n, n], dtype="float32"), paddle.randn([n, n], dtype="float32")) for n in sizes]
    for a, b in operands:
        float(paddle.matmul(a, b)[0, 0])  # warm-up: kernel selection, allocation
    return max(_timed_matmuls(a, b, min_seconds) for _ in range(repeats) for a, b in operands)


def gpu_name() -> Optional[str]:
    """The CUDA device name of this process's card, or None when paddle runs without a GPU."""
    if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
        return paddle.device.cuda.get_device_name()
    return None


def resolve_peak_flops(peak_flops_per_card: Optional[float], measure_peak_flops: bool) -> Optional[PeakFlops]:
    """The peak FLOP/s per card used for MFU.

    Order: the ``peak_flops_per_card`` argument if set; else the datasheet figure of a known GPU;
    else, if ``measure_peak_flops``, the matmul microbenchmark (``measure_matmul_flops``, about 2 s);
    else None.
    """
    if peak_flops_per_card:
        return PeakFlops(float(peak_flops_per_card), "override: peak_flops_per_card")
    name = gpu_name()
    if name is not None:
        known = datasheet_peak_flops(name)
        if known is not None:
            return known
    if measure_peak_flops:
        load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"  # 1 minute, before the probe
        return PeakFlops(
            measure_matmul_flops(),
            f"measured: float32 matmul on {name or 'cpu'}, best of {len(PROBE_SIZES)} sizes x {PROBE_REPEATS}; {load}",
        )
    return None


# ---------------------------------------------------------------------------------------------
# GPU specifications for the planner (pretrain.planner): memory, HBM and interconnect bandwidths.
#
# Bandwidths are bytes/s (decimal: 1 GB/s = 1e9 B/s) per GPU and per direction. NVIDIA's
# datasheets quote NVLink and PCIe as the bidirectional total (A100: "NVLink 600 GB/s", "PCIe
# Gen4 64 GB/s"); one direction is half of that. Memory is GiB (2**30 bytes) as the driver reports
# it: the datasheet's "40GB"/"80GB" A100 parts expose 40 / 80 GiB (nvidia-smi memory.total 40960 /
# 81920 MiB); the H100 SXM5 80GB exposes 81,559 MiB (nvidia-smi on an H100 80GB HBM3, measured for
# this table); other parts use the datasheet figure read as GiB.
#
# Sources (NVIDIA datasheets): "NVIDIA A100 Tensor Core GPU" (2021): HBM2 1,555 GB/s (40GB),
# HBM2e 2,039 GB/s (SXM4 80GB), 1,935 GB/s (PCIe 80GB), NVLink 600 GB/s, PCIe Gen4 64 GB/s;
# "NVIDIA A800" (2022): NVLink 400 GB/s, memory as A100; "NVIDIA H100 Tensor Core GPU" (2023):
# HBM3 3.35 TB/s (SXM5), 2 TB/s (PCIe), 3.9 TB/s (NVL 94GB), NVLink 900 GB/s (SXM5), PCIe Gen5
# 128 GB/s; "NVIDIA H800": NVLink 400 GB/s; "NVIDIA H200 Tensor Core GPU" (2024): 141 GB HBM3e
# 4.8 TB/s, NVLink 900 GB/s. PCIe cards join at most pairs (or fours) with NVLink bridges, so
# across 8 cards they talk over PCIe: their table entry has no NVLink.
# Between machines: the NIC per GPU of the reference system, DGX A100 (8 x 200 Gb/s HDR
# InfiniBand, 25e9 B/s per GPU per direction: the published FlagPerf cases ran there) and DGX
# H100/H200 (8 x 400 Gb/s NDR, 50e9 B/s) ("NVIDIA DGX A100 / DGX H100 system" datasheets).
# ---------------------------------------------------------------------------------------------


class GpuSpec(NamedTuple):
    """One GPU part as the planner sees it; bandwidths in bytes/s per direction, memory in GiB."""

    part: str  # e.g. "A100-SXM4-80GB"
    architecture: str  # "ampere" or "hopper": keys the planner's per-architecture efficiencies
    memory_gib: float  # device memory (GiB, 2**30 bytes) as the driver reports it
    hbm_bytes_per_sec: float  # HBM bandwidth, datasheet
    nvlink_bytes_per_sec: float  # NVLink per GPU per direction; 0 when cards talk over PCIe
    pcie_bytes_per_sec: float  # PCIe per direction
    internode_bytes_per_sec: float  # network per GPU per direction on the reference system

    @property
    def peak_flops_per_sec(self) -> float:
        """Dense bf16/fp16 peak FLOP/s, from PEAK_FLOPS_TABLE (one table for MFU and the planner)."""
        return datasheet_peak_flops(self.part).flops_per_sec

    @property
    def supports_bf16(self) -> bool:
        """bfloat16 tensor cores: from Ampere (compute capability 8.0) on."""
        return self.architecture in ("ampere", "hopper")

    @property
    def intranode_bytes_per_sec(self) -> float:
        """Per-direction bandwidth between cards of one machine: NVLink if the part has it, else PCIe."""
        return self.nvlink_bytes_per_sec or self.pcie_bytes_per_sec


_GEN4, _GEN5 = 32e9, 64e9  # PCIe per direction
_HDR, _NDR = 25e9, 50e9  # InfiniBand per GPU per direction (200 / 400 Gb/s)
# (regex on a part or CUDA device name, spec). First match wins: sized and PCIe/NVL variants
# before the bare name, so "A100" alone means the SXM4 80GB part.
GPU_SPECS = (
    (r"\bA100\b.*PCIE.*40\s*G", GpuSpec("A100-PCIE-40GB", "ampere", 40.0, 1555e9, 0.0, _GEN4, _HDR)),
    (r"\bA100\b.*PCIE", GpuSpec("A100-PCIE-80GB", "ampere", 80.0, 1935e9, 0.0, _GEN4, _HDR)),
    (r"\bA100\b.*40\s*G", GpuSpec("A100-SXM4-40GB", "ampere", 40.0, 1555e9, 300e9, _GEN4, _HDR)),
    (r"\bA100\b", GpuSpec("A100-SXM4-80GB", "ampere", 80.0, 2039e9, 300e9, _GEN4, _HDR)),
    (r"\bA800\b.*PCIE", GpuSpec("A800-PCIE-80GB", "ampere", 80.0, 1935e9, 0.0, _GEN4, _HDR)),
    (r"\bA800\b", GpuSpec("A800-SXM4-80GB", "ampere", 80.0, 2039e9, 200e9, _GEN4, _HDR)),
    (r"\bH100\b.*PCIE", GpuSpec("H100-PCIE-80GB", "hopper", 80.0, 2.0e12, 0.0, _GEN5, _NDR)),
    (r"\bH100\b.*NVL", GpuSpec("H100-NVL-94GB", "hopper", 94.0, 3.9e12, 0.0, _GEN5, _NDR)),
    (r"\bH100\b", GpuSpec("H100-SXM5-80GB", "hopper", 81559 / 1024, 3.35e12, 450e9, _GEN5, _NDR)),
    (r"\bH800\b.*PCIE", GpuSpec("H800-PCIE-80GB", "hopper", 80.0, 2.0e12, 0.0, _GEN5, _NDR)),
    (r"\bH800\b", GpuSpec("H800-SXM5-80GB", "hopper", 80.0, 3.35e12, 200e9, _GEN5, _NDR)),
    (r"\bH200\b.*NVL", GpuSpec("H200-NVL-141GB", "hopper", 141.0, 4.8e12, 0.0, _GEN5, _NDR)),
    (r"\bH200\b", GpuSpec("H200-SXM-141GB", "hopper", 141.0, 4.8e12, 450e9, _GEN5, _NDR)),
)


def find_gpu(name: str) -> Optional[GpuSpec]:
    """The GpuSpec for a part or CUDA device name ("A100-SXM4-40GB", "NVIDIA H100 80GB HBM3", "A100 40G"), or None."""
    for pattern, spec in GPU_SPECS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return spec
    return None
