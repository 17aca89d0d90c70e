"""Peak dense FLOP/s per card, the denominator of MFU.

GPU: a table of NVIDIA's datasheet figures for 16-bit (bf16 and fp16, equal on these parts)
tensor-core math *without* structured sparsity, looked up by the CUDA device name. Benchmark
tables quote MFU against this figure, and so does a run with bf16 or fp16 AMP. A float32 run (no AMP)
divides by the dense TF32 tensor-core figure (``TF32_PEAK_FLOPS``): paddle runs its float32 matmuls as
TF32 (``FLAGS_allow_tf32_cublas``, on by default), half the 16-bit rate on these parts.

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
- TF32, the same datasheets: A100, A800 156 (312 with sparsity); H100 SXM5, H800 SXM5, H200 SXM
  494.5 (989); H100 PCIe, H800 PCIe 378 (756); H100 NVL, H200 NVL 417.5 (835).

CPU: the physical peak (``physical_cpu_peak``), from what the OS reports, never from a timing:

    peak per card = cores used x FP32 FLOPs per cycle per core x clock
    FLOPs per cycle = SIMD lanes x FMA pipes x 2 (a fused multiply-add is two FLOPs)

- cores used: the distinct physical cores (``physical id`` / ``core id`` of /proc/cpuinfo) of the
  CPUs this process may run on (``os.sched_getaffinity``), shared evenly by the processes of this
  node (``PADDLE_LOCAL_SIZE``, set by ``paddle.distributed.launch``); hyper-threads add no FMA pipe;
- SIMD lanes from the /proc/cpuinfo ``flags``: 16 float32 lanes with ``avx512f``, 8 with ``avx2``
  and ``fma``, else 4 (SSE: no FMA, a multiply and an add port instead, the same 2 FLOPs per lane);
- FMA pipes: 2 per core, as on Intel cores since Haswell (Intel 64 and IA-32 Architectures
  Optimization Reference Manual, "Haswell microarchitecture": two FMA units; Skylake-SP Gold 6xxx
  and Platinum: two AVX-512 FMA units) and AMD cores since Zen 2 (Software Optimization Guide for
  AMD EPYC 7002/9004 processors: two 256-bit FMA pipes). Parts with fewer (Xeon Bronze/Silver
  with one AVX-512 unit; Zen 4, which runs AVX-512 through its two 256-bit pipes) have half this
  peak: the figure is then an upper bound and MFU is understated, never inflated;
- clock: the CPU's maximum frequency as cpufreq reports it
  (``/sys/devices/system/cpu/cpu<N>/cpufreq/cpuinfo_max_freq``, kHz), else the rated clock in the
  /proc/cpuinfo ``model name`` ("... @ 2.50GHz"), else the largest ``cpu MHz`` of /proc/cpuinfo (on a
  virtual machine the hypervisor's fixed figure; on bare metal without cpufreq the current clock).

None of it depends on the load, so the MFU of a run does not depend on what else the machine ran
at start-up. ``measure_matmul_flops`` (``measure_peak_flops``) still runs a float32 matmul
microbenchmark and reports its best rate beside it as the *achievable* peak; MFU is never
computed against it. If a figure is still too low (a wrong ``peak_flops_per_card``), an MFU above 1
is reported as null (``pretrain.metrics.flops.MFU_CREDIBLE_MAX``). Without a physical peak (no
/proc/cpuinfo: not Linux, or an architecture without these flags) and without
``peak_flops_per_card``, MFU is null.
"""

from __future__ import annotations

import glob
import os
import re
import time
from typing import Iterable, NamedTuple, Optional

import paddle

from pretrain.log import logger


class PeakFlops(NamedTuple):
    """A peak FLOP/s per card and where it came from: ``override: ...``, ``datasheet: <part> ...``,
    ``physical: <derivation>`` or ``measured: ...`` (the achievable figure)."""

    flops_per_sec: float
    source: str

    @property
    def definition(self) -> str:
        """``override``, ``datasheet``, ``physical`` or ``measured``: the word before the source's colon."""
        return self.source.split(":", 1)[0]


# Dense TF32 tensor-core peak FLOP/s by GpuSpec.datasheet_name (sources in the module docstring)
TF32_PEAK_FLOPS = {
    "A100": 156e12,
    "A800": 156e12,
    "H100 SXM": 494.5e12,
    "H100 PCIe": 378e12,
    "H100 NVL": 417.5e12,
    "H800 SXM": 494.5e12,
    "H800 PCIe": 378e12,
    "H200 SXM": 494.5e12,
    "H200 NVL": 417.5e12,
}


def datasheet_peak_flops(device_name: str, half: bool = True) -> Optional[PeakFlops]:
    """Dense peak FLOP/s of a GPU from its CUDA name (e.g. "NVIDIA A100-SXM4-80GB"), or None if unknown:
    the ``GPU_SPECS`` entry ``find_gpu`` gives (one table for MFU and the planner).

    Args:
        half: the run's matmuls are bf16/fp16 (AMP): the 16-bit figure; False (float32): the TF32 one.
    """
    spec = find_gpu(device_name)
    if spec is None:
        return None
    if half:
        return PeakFlops(spec.peak_flops_per_sec, f"datasheet: {spec.datasheet_name} bf16/fp16 dense")
    return PeakFlops(
        TF32_PEAK_FLOPS[spec.datasheet_name],
        f"datasheet: {spec.datasheet_name} tf32 dense (float32 matmuls run as TF32)",
    )


FMA_PIPES_PER_CORE = 2  # see the module docstring: Intel since Haswell, AMD since Zen 2
CPUINFO = "/proc/cpuinfo"
CPUFREQ_MAX = "/sys/devices/system/cpu/cpu{}/cpufreq/cpuinfo_max_freq"  # kHz


def _cpuinfo_blocks(cpuinfo_text: str) -> dict:
    """``{processor number: {field: value}}`` of a /proc/cpuinfo text."""
    blocks = {}
    for block in cpuinfo_text.strip().split("\n\n"):
        parts = [line.partition(":") for line in block.splitlines()]
        fields = {key.strip(): value.strip() for key, sep, value in parts if sep}
        if fields.get("processor", "").isdigit():
            blocks[int(fields["processor"])] = fields
    return blocks


def simd_float32_lanes(flags: Iterable[str]) -> tuple:
    """(float32 lanes per vector FMA, the flag that says so) from a /proc/cpuinfo ``flags`` set."""
    flags = set(flags)
    if "avx512f" in flags:
        return 16, "avx512f"
    if {"avx2", "fma"} <= flags:
        return 8, "avx2+fma"
    return 4, "sse (no fma flag)"


def physical_cpu_peak(
    cpuinfo_text: str, cpus: Iterable[int], max_freq_khz: Optional[float] = None, processes_sharing: int = 1
) -> Optional[PeakFlops]:
    """The physical float32 peak FLOP/s of one process's share of the CPU (see the module docstring).

    Args:
        cpuinfo_text: the text of /proc/cpuinfo.
        cpus: the logical CPU numbers this process may run on (``os.sched_getaffinity(0)``).
        max_freq_khz: cpufreq's ``cpuinfo_max_freq`` of those CPUs (kHz), None where the OS has no cpufreq.
        processes_sharing: processes of this run on the node, sharing those cores evenly (>= 1).

    Returns:
        PeakFlops with a ``physical: ...`` source naming each number's origin, or None when
        ``cpuinfo_text`` describes none of ``cpus`` or gives no clock.
    """
    blocks = _cpuinfo_blocks(cpuinfo_text)
    mine = [blocks[cpu] for cpu in sorted(set(cpus)) if cpu in blocks]
    if not mine:
        return None
    core_ids = {(block.get("physical id"), block.get("core id")) for block in mine}
    if (None, None) in core_ids:  # no topology fields (some virtual machines): one core per logical CPU
        cores, cores_source = len(mine), "logical CPUs"
    else:
        cores, cores_source = len(core_ids), "physical cores"
    lanes, lanes_flag = simd_float32_lanes(mine[0].get("flags", "").split())
    flops_per_cycle = lanes * FMA_PIPES_PER_CORE * 2
    rated = re.search(r"@\s*([\d.]+)\s*GHz", mine[0].get("model name", ""))
    megahertz = [float(block["cpu MHz"]) for block in mine if re.fullmatch(r"[\d.]+", block.get("cpu MHz", ""))]
    if max_freq_khz:
        hertz, clock_source = max_freq_khz * 1e3, "cpufreq cpuinfo_max_freq"
    elif rated:
        hertz, clock_source = float(rated.group(1)) * 1e9, "model name"
    elif megahertz:
        hertz, clock_source = max(megahertz) * 1e6, "cpu MHz"
    else:
        return None
    share = cores / max(1, processes_sharing)
    return PeakFlops(
        share * flops_per_cycle * hertz,
        f"physical: {cores} {cores_source} / {max(1, processes_sharing)} process(es) x {flops_per_cycle} float32 "
        f"FLOP/cycle ({lanes} lanes, {lanes_flag}, x {FMA_PIPES_PER_CORE} FMA pipes x 2) x {hertz / 1e9:.3f} GHz "
        f"({clock_source})",
    )


def read_physical_cpu_peak() -> Optional[PeakFlops]:
    """``physical_cpu_peak`` of this process: /proc/cpuinfo, its CPU affinity, cpufreq and
    ``PADDLE_LOCAL_SIZE``; None where /proc/cpuinfo cannot be read."""
    try:
        with open(CPUINFO, encoding="utf-8") as f:
            cpuinfo_text = f.read()
    except OSError:
        return None
    cpus = os.sched_getaffinity(0)
    max_freqs = []
    for cpu in cpus:
        for path in glob.glob(CPUFREQ_MAX.format(cpu)):
            with open(path, encoding="utf-8") as f:
                max_freqs.append(float(f.read()))
    local_size = os.environ.get("PADDLE_LOCAL_SIZE", "1")
    return physical_cpu_peak(
        cpuinfo_text, cpus, max(max_freqs) if max_freqs else None, int(local_size) if local_size.isdigit() else 1
    )


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


def resolve_peak_flops(peak_flops_per_card: Optional[float], half: bool) -> Optional[PeakFlops]:
    """The peak FLOP/s per card that MFU divides by.

    Order: the ``peak_flops_per_card`` argument if set; else the datasheet figure of a known GPU (16-bit
    when ``half``, the run's AMP is bf16 or fp16; else TF32); else, without a GPU, the CPU's physical
    float32 peak (``read_physical_cpu_peak``); else None (an unknown GPU). An override that differs from
    the datasheet figure of the GPU found (an A100's 312e12 on an H100: MFU 3.17x too high) still wins,
    with one warning line naming both (the GPU recipes leave the key unset: the card decides).
    """
    name = gpu_name()
    detected = datasheet_peak_flops(name, half) if name is not None else None
    if peak_flops_per_card:
        if detected is not None and float(peak_flops_per_card) != detected.flops_per_sec:
            logger.warning(
                "peak_flops_per_card %.4g differs from the %s figure of this card (%s): MFU divides by "
                "peak_flops_per_card; unset it to use the card's",
                peak_flops_per_card,
                detected.source,
                name,
            )
        return PeakFlops(float(peak_flops_per_card), "override: peak_flops_per_card")
    if name is not None:
        return detected
    return read_physical_cpu_peak()


def achievable_peak_flops(measure_peak_flops: bool) -> Optional[PeakFlops]:
    """The matmul microbenchmark's figure (``measure_matmul_flops``, about 3 s) when ``measure_peak_flops``,
    reported beside the peak as what this device achieves now (it depends on the load); else None."""
    if not measure_peak_flops:
        return None
    load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"  # 1 minute, before the probe
    return PeakFlops(
        measure_matmul_flops(),
        f"measured: float32 matmul on {gpu_name() or 'cpu'}, best of {len(PROBE_SIZES)} sizes x {PROBE_REPEATS}; "
        f"{load}",
    )


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
    datasheet_name: str  # the part as its datasheet names it: "A100", "H100 SXM", "H100 PCIe", ...
    peak_flops_per_sec: float  # dense bf16/fp16 tensor-core peak FLOP/s, datasheet (MFU and the planner)

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
# before the bare name, so "A100" alone means the SXM4 80GB part (which reports e.g. "NVIDIA
# A100-SXM4-80GB"; the H100 SXM part "NVIDIA H100 80GB HBM3"). Peak FLOP/s: the datasheets'
# dense bf16/fp16 tensor-core figures.
GPU_SPECS = (
    (r"\bA100\b.*PCIE.*40\s*G", GpuSpec("A100-PCIE-40GB", "ampere", 40.0, 1555e9, 0.0, _GEN4, _HDR, "A100", 312e12)),
    (r"\bA100\b.*PCIE", GpuSpec("A100-PCIE-80GB", "ampere", 80.0, 1935e9, 0.0, _GEN4, _HDR, "A100", 312e12)),
    (r"\bA100\b.*40\s*G", GpuSpec("A100-SXM4-40GB", "ampere", 40.0, 1555e9, 300e9, _GEN4, _HDR, "A100", 312e12)),
    (r"\bA100\b", GpuSpec("A100-SXM4-80GB", "ampere", 80.0, 2039e9, 300e9, _GEN4, _HDR, "A100", 312e12)),
    (r"\bA800\b.*PCIE", GpuSpec("A800-PCIE-80GB", "ampere", 80.0, 1935e9, 0.0, _GEN4, _HDR, "A800", 312e12)),
    (r"\bA800\b", GpuSpec("A800-SXM4-80GB", "ampere", 80.0, 2039e9, 200e9, _GEN4, _HDR, "A800", 312e12)),
    (r"\bH100\b.*PCIE", GpuSpec("H100-PCIE-80GB", "hopper", 80.0, 2.0e12, 0.0, _GEN5, _NDR, "H100 PCIe", 756e12)),
    (r"\bH100\b.*NVL", GpuSpec("H100-NVL-94GB", "hopper", 94.0, 3.9e12, 0.0, _GEN5, _NDR, "H100 NVL", 835e12)),
    (r"\bH100\b", GpuSpec("H100-SXM5-80GB", "hopper", 81559 / 1024, 3.35e12, 450e9, _GEN5, _NDR, "H100 SXM", 989e12)),
    (r"\bH800\b.*PCIE", GpuSpec("H800-PCIE-80GB", "hopper", 80.0, 2.0e12, 0.0, _GEN5, _NDR, "H800 PCIe", 756e12)),
    (r"\bH800\b", GpuSpec("H800-SXM5-80GB", "hopper", 80.0, 3.35e12, 200e9, _GEN5, _NDR, "H800 SXM", 989e12)),
    (r"\bH200\b.*NVL", GpuSpec("H200-NVL-141GB", "hopper", 141.0, 4.8e12, 0.0, _GEN5, _NDR, "H200 NVL", 835e12)),
    (r"\bH200\b", GpuSpec("H200-SXM-141GB", "hopper", 141.0, 4.8e12, 450e9, _GEN5, _NDR, "H200 SXM", 989e12)),
)


def find_gpu(name: str) -> Optional[GpuSpec]:
    """The GpuSpec for a part or CUDA device name ("A100-SXM4-40GB", "NVIDIA H100 80GB HBM3", "A100 40G"), or None."""
    for pattern, spec in GPU_SPECS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return spec
    return None
