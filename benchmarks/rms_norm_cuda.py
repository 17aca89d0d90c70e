"""Bandwidth benchmark of the fused RMSNorm CUDA kernels (external_ops/) on one GPU.

Builds external_ops/harness/fused_norm_capi.cu with nvcc into a shared library
(or takes --lib), loads it with ctypes and uses PyTorch only to allocate device
memory, time with CUDA events and compute the float32 reference.

    python benchmarks/rms_norm_cuda.py                     # build + run all shapes
    python benchmarks/rms_norm_cuda.py --lib /tmp/libfused_norm.so --peak-tbs 3.35

Shapes [rows x hidden]: 4096x4096, 16384x4096, 8192x8192; dtypes bf16, fp32;
forward and backward. Each timed call runs after a 256 MiB L2 flush and is
bracketed by its own CUDA events; the median of --iters calls is reported.

Byte model (s = element size of the dtype, R rows, H hidden, P = partial rows
of the backward workspace, chosen by the library for the device):
    forward  = R*H*s (read x) + H*s (read scale) + R*H*s (write y) + R*4 (write invvar)
    backward = 2*R*H*s (read x, dy) + H*s (read scale) + R*4 (read invvar)
             + R*H*s (write dx) + 2*P*H*4 (write + read dscale partials) + H*s (write dscale)
GB/s = bytes / median seconds / 1e9; "% peak" divides by the HBM bandwidth of
the device (PEAK_TBS, matched on the device name; override with --peak-tbs).
Targets: forward >= 80 % of peak, backward >= 60 %.

Exit status: 0 when every result matches the reference (max abs error within
tolerance), 1 otherwise. Bandwidth below target is reported, not fatal.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARNESS = os.path.join(REPO, "external_ops", "harness", "fused_norm_capi.cu")
SHAPES = [(4096, 4096), (16384, 4096), (8192, 8192)]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
EPS = 1e-6
TARGETS = {"fwd": 0.80, "bwd": 0.60}
# HBM bandwidth in TB/s, matched as a substring of torch.cuda.get_device_name().
PEAK_TBS = [
    ("H200", 4.8),
    ("H100 PCIe", 2.0),
    ("H100", 3.35),  # SXM (HBM3)
    ("A100-SXM4-80GB", 2.039),
    ("A100 80GB PCIe", 1.935),
]
# Max abs error allowed, relative to the max |reference| of each output.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2 * 2**-8}


def build_library(nvcc: str, out_dir: str) -> str:
    """Compile the harness for the current GPU; return the .so path.

    Raises RuntimeError naming the nvcc command when compilation fails.
    """
    major, minor = torch.cuda.get_device_capability()
    lib = os.path.join(out_dir, "libfused_norm.so")
    cmd = [
        nvcc,
        "-O3",
        "-std=c++17",
        "-shared",
        "-Xcompiler",
        "-fPIC",
        f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}",
        "-o",
        lib,
        HARNESS,
    ]
    cccl = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "include", "cccl")
    if os.path.isdir(cccl):
        cmd.insert(1, f"-I{cccl}")
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"nvcc failed ({' '.join(cmd)}):\n{result.stderr}\nFix the error or pass --lib.")
    return lib


def load_library(path: str) -> ctypes.CDLL:
    """Load the harness and declare its C signatures (all return cudaError_t)."""
    lib = ctypes.CDLL(path)
    p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    for name in ("rms_norm_fwd_f32", "rms_norm_fwd_bf16"):
        getattr(lib, name).argtypes = [p, p, p, p, i64, i64, f32, p]
        getattr(lib, name).restype = ctypes.c_int
    for name in ("rms_norm_bwd_f32", "rms_norm_bwd_bf16"):
        getattr(lib, name).argtypes = [p, p, p, p, p, p, p, i64, i64, p]
        getattr(lib, name).restype = ctypes.c_int
    lib.fused_norm_bwd_workspace_elems.argtypes = [i64, i64, ctypes.POINTER(i64)]
    lib.fused_norm_bwd_workspace_elems.restype = ctypes.c_int
    return lib


def check(err: int, what: str) -> None:
    """Raise RuntimeError when a harness call returned a CUDA error."""
    if err != 0:
        raise RuntimeError(f"{what} returned cudaError_t {err}; see cuda_runtime_api.h.")


def peak_tbs(name: str, override: float | None) -> float:
    """HBM bandwidth (TB/s) of device `name`; ValueError names --peak-tbs if unknown."""
    if override is not None:
        return override
    for key, tbs in PEAK_TBS:
        if key in name:
            return tbs
    raise ValueError(f"No peak bandwidth known for '{name}'; pass --peak-tbs.")


def reference(x, w, dy):
    """Float32 RMSNorm forward/backward: (y, invvar, dx, dscale)."""
    x32, w32, dy32 = x.float(), w.float(), dy.float()
    invvar = torch.rsqrt(x32.pow(2).mean(-1) + EPS)
    xhat = x32 * invvar[:, None]
    g = dy32 * w32
    dx = invvar[:, None] * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    return xhat * w32, invvar, dx, (dy32 * xhat).sum(0)


def max_rel_err(got, want) -> float:
    return float((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-30))


def time_call(fn, iters: int, flush) -> float:
    """Median seconds of `fn` over `iters` calls, each after an L2 flush."""
    times = []
    for _ in range(iters):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


def bench_shape(lib, rows, cols, dtype_name, iters, flush, peak):
    """Check and time fwd and bwd for one shape; return result dicts."""
    dtype = DTYPES[dtype_name]
    suffix = "f32" if dtype == torch.float32 else "bf16"
    fwd, bwd = getattr(lib, f"rms_norm_fwd_{suffix}"), getattr(lib, f"rms_norm_bwd_{suffix}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, cols, device="cuda", generator=gen).to(dtype)
    w = (torch.rand(cols, device="cuda", generator=gen) + 0.5).to(dtype)
    dy = torch.randn(rows, cols, device="cuda", generator=gen).to(dtype)
    y, dx, dw = torch.empty_like(x), torch.empty_like(x), torch.empty_like(w)
    invvar = torch.empty(rows, device="cuda", dtype=torch.float32)
    elems = ctypes.c_int64()
    check(lib.fused_norm_bwd_workspace_elems(rows, cols, ctypes.byref(elems)), "workspace size")
    ws = torch.empty(elems.value, device="cuda", dtype=torch.float32)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def run_fwd():
        check(fwd(x.data_ptr(), w.data_ptr(), y.data_ptr(), invvar.data_ptr(), rows, cols, EPS, stream), "forward")

    def run_bwd():
        check(
            bwd(
                x.data_ptr(),
                w.data_ptr(),
                invvar.data_ptr(),
                dy.data_ptr(),
                dx.data_ptr(),
                dw.data_ptr(),
                ws.data_ptr(),
                rows,
                cols,
                stream,
            ),
            "backward",
        )

    run_fwd()
    run_bwd()
    torch.cuda.synchronize()
    ry, rinv, rdx, rdw = reference(x, w, dy)
    tol = TOLERANCE[dtype]
    errors = {
        "y": max_rel_err(y, ry),
        "invvar": max_rel_err(invvar, rinv),
        "dx": max_rel_err(dx, rdx),
        "dscale": max_rel_err(dw, rdw),
    }
    ok = all(e <= tol for e in errors.values())
    s = x.element_size()
    partial_rows = elems.value // cols
    nbytes = {
        "fwd": 2 * rows * cols * s + cols * s + rows * 4,
        "bwd": 3 * rows * cols * s + 2 * cols * s + rows * 4 + 2 * partial_rows * cols * 4,
    }
    results = []
    for kind, fn in (("fwd", run_fwd), ("bwd", run_bwd)):
        for _ in range(3):
            fn()
        sec = time_call(fn, iters, flush)
        gbs = nbytes[kind] / sec / 1e9
        frac = gbs / (peak * 1e3)
        results.append(
            {
                "shape": f"{rows}x{cols}",
                "dtype": dtype_name,
                "kind": kind,
                "us": sec * 1e6,
                "gbs": gbs,
                "frac": frac,
                "target": "ok" if frac >= TARGETS[kind] else f"below {TARGETS[kind]:.0%}",
                "correct": ok,
                "errors": errors,
            }
        )
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lib", help="prebuilt libfused_norm.so (default: build with nvcc)")
    parser.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"), help="nvcc to build with")
    parser.add_argument("--peak-tbs", type=float, help="HBM bandwidth in TB/s (overrides the table)")
    parser.add_argument("--iters", type=int, default=50, help="timed calls per case")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("No CUDA device visible to PyTorch; run this on a GPU machine.", file=sys.stderr)
        return 1
    name = torch.cuda.get_device_name()
    peak = peak_tbs(name, args.peak_tbs)
    with tempfile.TemporaryDirectory() as tmp:
        lib = load_library(args.lib or build_library(args.nvcc, tmp))
        flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
        print(f"device: {name}, peak HBM {peak:.3f} TB/s")
        print(f"{'shape':>11} {'dtype':>5} {'dir':>4} {'us':>9} {'GB/s':>8} {'%peak':>6}  target  max rel err")
        all_ok = True
        for rows, cols in SHAPES:
            for dtype_name in DTYPES:
                for r in bench_shape(lib, rows, cols, dtype_name, args.iters, flush, peak):
                    all_ok &= r["correct"]
                    errs = " ".join(f"{k}={v:.1e}" for k, v in r["errors"].items())
                    print(
                        f"{r['shape']:>11} {r['dtype']:>5} {r['kind']:>4} {r['us']:9.1f} "
                        f"{r['gbs']:8.1f} {r['frac']:6.1%}  {r['target']:<7} {errs}"
                        + ("" if r["correct"] else "  MISMATCH")
                    )
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
