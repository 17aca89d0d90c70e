"""Bandwidth benchmark of the fused RMSNorm CUDA kernels (external_ops/) on one GPU, side by side.

Builds external_ops/harness/fused_norm_capi.cu with nvcc into a shared library
(or takes --lib), loads it with ctypes and uses PyTorch only to allocate device
memory, time with CUDA events and compute the float32 reference. In the same run
and on the same inputs it times the rivals of benchmarks/rms_norm_rivals.py
(--against): torch.nn.functional.rms_norm under torch.compile, a Liger-style
Triton RMSNorm, and a copy/add "ceiling" that moves the same rows with no
reduction.

    python benchmarks/rms_norm_cuda.py                     # build + run all shapes
    python benchmarks/rms_norm_cuda.py --lib /tmp/libfused_norm.so --peak-tbs 3.35
    python benchmarks/rms_norm_cuda.py --shapes 8192x8192 --against '' --json out.json

Shapes [rows x hidden]: 4096x4096, 16384x4096, 8192x8192 (--shapes); dtypes
bf16, fp32; forward and backward. Before the table, a device-to-device copy of
1 GiB gives the bandwidth the memory actually reaches (bytes read + written).
After it, RMSNorm and LayerNorm are checked (not timed) on --check-shapes,
small shapes that take the other code paths (see CHECK_SHAPES).

Timing (--timing):
    steady (default): back-to-back calls cycling over copies of the inputs and
        outputs whose total size is at least 4x the L2, between one pair of CUDA
        events; every call finds the L2 as the call before left it (its writes
        partly not yet in memory), as inside a training step. The GPU first
        spins until the host has enqueued every call, so host launch time
        (large for torch.compile's autograd calls) is not timed. Reported: the
        median over --iters repetitions of event time / calls.
    cold: one call between its own events after reading a 256 MiB buffer (an L2
        of clean lines); the median of --iters calls. Optimistic by up to one
        L2 (50 MB on an H100) of the call's own writes still unwritten when its
        end event fires. (Zeroing the buffer instead, as many benchmarks do,
        makes the timed call write the flush's dirty lines back: pessimistic.)

Byte model: the bytes RMSNorm cannot avoid moving (s = element size of the
dtype, R rows, H hidden), the same for every implementation:
    forward  = R*H*s (read x) + H*s (read scale) + R*H*s (write y) + R*4 (write invvar)
    backward = 2*R*H*s (read x, dy) + H*s (read scale) + R*4 (read invvar)
             + R*H*s (write dx) + H*s (write dscale)
Workspace traffic (the dscale column partials) is overhead, not counted. The
ceiling rows count their own bytes (copy 2*R*H*s, add 3*R*H*s).
GB/s = bytes / median seconds / 1e9; "% peak" divides by the HBM bandwidth of
the device (PEAK_TBS, matched on the device name; override with --peak-tbs).
Targets for fused_ln: forward >= 85 % of peak, backward >= 80 %.

Errors: every output is compared with the float32 reference after the outputs
were filled with NaN (an element the kernel did not write fails). "abs" is the
max abs error, "rel" the max abs error over max |reference| of that output;
the check passes when rel <= 1e-5 (fp32) or 2**-7 (bf16) for every output.
The rivals' outputs are checked the same way (the ceiling's are not).

Exit status: 0 when every result matches the reference, 1 otherwise.
Bandwidth below target is reported, not fatal.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import rms_norm_rivals
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARNESS = os.path.join(REPO, "external_ops", "harness", "fused_norm_capi.cu")
SHAPES = [(4096, 4096), (16384, 4096), (8192, 8192)]
# Small shapes for the correctness pass, one or more per code path of
# external_ops/fused_norm_kernels.cuh: scalar loads (cols % 8 != 0: 1000, 1001);
# forward with the row in registers at 32 (256), 64 (768), 128 (2048) and 256
# or 512 threads per row (5120, 8200, 16384), and the two-pass forward for
# longer rows (24576); backward with x and dy in registers at 64 (768), 128
# (2048), 256 (4096) and 512 (5120) threads per row, norm_bwd_kernel for rows
# of <= 512 (256) and > 8192 elements (partials in shared memory: 8200;
# in global memory: 16384, 24576); fewer rows than groups (3x4096).
CHECK_SHAPES = [
    (300, 1000),
    (257, 1001),
    (100, 256),
    (40, 768),
    (17, 2048),
    (129, 5120),
    (33, 8200),
    (64, 16384),
    (5, 24576),
    (3, 4096),
]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
EPS = 1e-6
TARGETS = {"fwd": 0.85, "bwd": 0.80}
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


def find_nvcc(requested: str | None) -> str:
    """Path of nvcc: --nvcc, $NVCC, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin.

    Raises RuntimeError naming the places searched when none is found.
    """
    candidates = [requested, os.environ.get("NVCC"), shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home:
            candidates.append(os.path.join(home, "bin", "nvcc"))
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    searched = "--nvcc, $NVCC, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin"
    raise RuntimeError(f"nvcc not found ({searched}); pass --nvcc or --lib.")


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
    signatures = {
        "rms_norm_fwd": [p, p, p, p, i64, i64, f32, p],
        "rms_norm_bwd": [p, p, p, p, p, p, p, i64, i64, p],
        "layer_norm_fwd": [p, p, p, p, p, p, i64, i64, f32, p],
        "layer_norm_bwd": [p, p, p, p, p, p, p, p, p, i64, i64, p],
        "rms_norm_bwd_workspace": [i64, i64, ctypes.POINTER(i64)],
        "layer_norm_bwd_workspace": [i64, i64, ctypes.POINTER(i64)],
    }
    for base, argtypes in signatures.items():
        for suffix in SUFFIX.values():
            fn = getattr(lib, f"{base}_{suffix}")
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
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


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'4096x4096,16384x4096' -> [(4096, 4096), (16384, 4096)]; '' -> []."""
    shapes = []
    for item in filter(None, text.split(",")):
        rows, _, cols = item.strip().partition("x")
        shapes.append((int(rows), int(cols)))
    return shapes


def reference(x, w, b, dy):
    """Float32 forward/backward; b is None for RMSNorm.

    Returns dicts of outputs: forward {y, [mean], invvar}, backward {dx, dscale, [dbias]}.
    """
    x32, w32, dy32 = x.float(), w.float(), dy.float()
    mean = x32.mean(-1) if b is not None else torch.zeros_like(x32[:, 0])
    xc = x32 - mean[:, None]
    invvar = torch.rsqrt(xc.pow(2).mean(-1) + EPS)
    xhat = xc * invvar[:, None]
    g = dy32 * w32
    inner = g - xhat * (g * xhat).mean(-1, keepdim=True)
    if b is not None:
        inner = inner - g.mean(-1, keepdim=True)
    fwd = {"y": xhat * w32 + (b.float() if b is not None else 0.0), "invvar": invvar}
    bwd = {"dx": invvar[:, None] * inner, "dscale": (dy32 * xhat).sum(0)}
    if b is not None:
        fwd["mean"] = mean
        bwd["dbias"] = dy32.sum(0)
    return fwd, bwd


def errors(got: dict, want: dict) -> dict:
    """{name: (max abs error, max abs error / max |reference|)}; NaN in `got` gives NaN."""
    out = {}
    for name, ref in want.items():
        diff = float((got[name].float() - ref).abs().max())
        out[name] = (diff, diff / max(float(ref.abs().max()), 1e-30))
    return out


class Case:
    """Inputs, outputs and the two harness calls of one (norm, shape, dtype)."""

    def __init__(self, lib, norm: str, rows: int, cols: int, dtype, seed: int):
        self.rows, self.cols, self.dtype, self.norm = rows, cols, dtype, norm
        ln = norm == "layer_norm"
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.x = torch.randn(rows, cols, device="cuda", generator=gen).to(dtype)
        self.w = (torch.rand(cols, device="cuda", generator=gen) + 0.5).to(dtype)
        self.b = torch.randn(cols, device="cuda", generator=gen).to(dtype) if ln else None
        self.dy = torch.randn(rows, cols, device="cuda", generator=gen).to(dtype)
        f32 = torch.float32
        self.fwd_out = {"y": torch.empty_like(self.x), "invvar": torch.empty(rows, device="cuda", dtype=f32)}
        self.bwd_out = {"dx": torch.empty_like(self.x), "dscale": torch.empty_like(self.w)}
        if ln:
            self.fwd_out["mean"] = torch.empty(rows, device="cuda", dtype=f32)
            self.bwd_out["dbias"] = torch.empty_like(self.w)
        suffix = SUFFIX[dtype]
        self._fwd = getattr(lib, f"{norm}_fwd_{suffix}")
        self._bwd = getattr(lib, f"{norm}_bwd_{suffix}")
        elems = ctypes.c_int64()
        check(getattr(lib, f"{norm}_bwd_workspace_{suffix}")(rows, cols, ctypes.byref(elems)), "workspace size")
        self.ws = torch.empty(max(elems.value, 1), device="cuda", dtype=f32)
        self.stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        f, o = self.fwd_out, self.bwd_out
        if ln:
            fwd_args = (self.x, self.w, self.b, f["y"], f["mean"], f["invvar"])
            bwd_args = (self.x, self.w, f["mean"], f["invvar"], self.dy, o["dx"], o["dscale"], o["dbias"], self.ws)
        else:
            fwd_args = (self.x, self.w, f["y"], f["invvar"])
            bwd_args = (self.x, self.w, f["invvar"], self.dy, o["dx"], o["dscale"], self.ws)
        self._fwd_args = [t.data_ptr() for t in fwd_args] + [rows, cols, EPS, self.stream]
        self._bwd_args = [t.data_ptr() for t in bwd_args] + [rows, cols, self.stream]

    def run_fwd(self) -> None:
        check(self._fwd(*self._fwd_args), "forward")

    def run_bwd(self) -> None:
        check(self._bwd(*self._bwd_args), "backward")

    def verify(self) -> dict:
        """Run both directions on NaN-filled outputs; return errors() of all outputs."""
        for t in (*self.fwd_out.values(), *self.bwd_out.values()):
            t.fill_(float("nan"))
        self.run_fwd()
        self.run_bwd()
        torch.cuda.synchronize()
        want_fwd, want_bwd = reference(self.x, self.w, self.b, self.dy)
        return {**errors(self.fwd_out, want_fwd), **errors(self.bwd_out, want_bwd)}

    def nbytes(self, kind: str) -> int:
        """Bytes the byte model (module docstring) counts for RMSNorm `kind`."""
        r, h, s = self.rows, self.cols, self.x.element_size()
        if kind == "fwd":
            return 2 * r * h * s + h * s + r * 4
        return 3 * r * h * s + 2 * h * s + r * 4


def passed(errs: dict, dtype) -> bool:
    return all(rel <= TOLERANCE[dtype] for _, rel in errs.values())  # NaN compares False


def elapsed(fn, spin_ms: float = 1.0) -> float:
    """Seconds between CUDA events recorded before and after fn() enqueues its work.

    A spin kernel of about `spin_ms` goes first, so the GPU reaches the start
    event only after the host has enqueued all of fn()'s launches: host launch
    time is not timed.
    """
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(2_000_000 * spin_ms))  # clock cycles, about 1 ms per 2e6
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def time_cold(fn, iters: int) -> list[float]:
    """Sorted seconds of `iters` calls of `fn`, each after reading 256 MiB to evict the L2."""
    flush = torch.ones(256 * 2**20, dtype=torch.uint8, device="cuda")
    times = []
    for _ in range(iters):
        flush.max()
        times.append(elapsed(fn, spin_ms=5.0))
    return sorted(times)


def time_steady(fns: list, iters: int) -> list[float]:
    """Sorted seconds per call of `iters` repetitions of back-to-back calls cycling over `fns`."""
    calls = len(fns) * max(1, -(-16 // len(fns)))

    def batch():
        for i in range(calls):
            fns[i % len(fns)]()

    batch()
    torch.cuda.synchronize()
    started = time.perf_counter()
    batch()  # the host's time to enqueue a batch sets the spin that hides it
    host_ms = (time.perf_counter() - started) * 1e3
    torch.cuda.synchronize()
    return sorted(elapsed(batch, spin_ms=max(1.0, 2 * host_ms)) / calls for _ in range(iters))


def copy_gbs(iters: int) -> float:
    """Device-to-device copy of 1 GiB: (bytes read + bytes written) / median seconds / 1e9."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return 2 * src.numel() / times[len(times) // 2] / 1e9


def format_errors(errs: dict) -> str:
    return " ".join(f"{k}={a:.1e}/{r:.1e}" for k, (a, r) in errs.items())


def rival_bytes(name: str, case: Case, kind: str) -> int:
    """The byte model's bytes, or the ceiling's own (copy: 2 passes, add: 3)."""
    if name != "ceiling":
        return case.nbytes(kind)
    return (2 if kind == "fwd" else 3) * case.rows * case.cols * case.x.element_size()


def time_shape(lib, rows: int, cols: int, dtype, seed: int, args) -> tuple[Case, dict, dict]:
    """Check one RMSNorm shape, then time fused_ln and each rival on it.

    Returns (the first Case, {impl: errors}, {impl: {dir: sorted seconds}}); the
    ceiling has no errors entry.
    """
    case = Case(lib, "rms_norm", rows, cols, dtype, seed)
    errs = {"fused_ln": case.verify()}
    if args.timing == "cold":
        cases = [case]
    else:  # enough copies that the buffers cycled over are at least 4x the L2
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        per_case = 4 * rows * cols * case.x.element_size()  # x, dy, y, dx
        cases = [case] + [Case(lib, "rms_norm", rows, cols, dtype, seed) for _ in range(-(-4 * l2 // per_case) - 1)]
        for c in cases[1:]:
            c.run_fwd()  # invvar for the backward
    impls = {"fused_ln": [(c.run_fwd, c.run_bwd) for c in cases]}
    want_fwd, want_bwd = reference(case.x, case.w, None, case.dy)
    for name in args.against:
        rivals = [rms_norm_rivals.make(name, c.x, c.w, c.dy, EPS) for c in cases]
        got = rivals[0].outputs()
        if got is not None:
            torch.cuda.synchronize()
            want = want_fwd | want_bwd
            errs[name] = errors(got, {k: want[k] for k in got})
        impls[name] = [(r.fwd, r.bwd) for r in rivals]
    times = {}
    for name, fns in impls.items():
        times[name] = {}
        for i, kind in enumerate(("fwd", "bwd")):
            calls = [pair[i] for pair in fns]
            times[name][kind] = (
                time_cold(calls[0], args.iters) if args.timing == "cold" else time_steady(calls, args.iters)
            )
    return case, errs, times


def parse_rivals(text: str) -> list[str]:
    """'torch.compile,triton' -> ['torch.compile', 'triton']; ArgumentTypeError names the choices."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in rms_norm_rivals.NAMES:
            raise argparse.ArgumentTypeError(f"unknown rival '{name}'; choose from {', '.join(rms_norm_rivals.NAMES)}")
    return names


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lib", help="prebuilt libfused_norm.so (default: build with nvcc)")
    parser.add_argument("--nvcc", help="nvcc to build with (default: $NVCC, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    parser.add_argument("--peak-tbs", type=float, help="HBM bandwidth in TB/s (overrides the table)")
    parser.add_argument("--iters", type=int, default=30, help="timed repetitions (steady) or calls (cold) per case")
    parser.add_argument("--timing", choices=("steady", "cold"), default="steady", help="see the module docstring")
    parser.add_argument("--shapes", type=parse_shapes, default=SHAPES, help="timed shapes, e.g. 4096x4096,8192x8192")
    parser.add_argument(
        "--against",
        type=parse_rivals,
        default=list(rms_norm_rivals.NAMES),
        help="rivals timed beside fused_ln, comma-separated (default: all of torch.compile,triton,ceiling; '' none)",
    )
    parser.add_argument(
        "--check-shapes", type=parse_shapes, default=CHECK_SHAPES, help="shapes only checked, '' for none"
    )
    parser.add_argument("--json", help="also write every result to this JSON file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("No CUDA device visible to PyTorch; run this on a GPU machine.", file=sys.stderr)
        return 1
    name = torch.cuda.get_device_name()
    peak = peak_tbs(name, args.peak_tbs)
    results = {"device": name, "peak_tbs": peak, "timing": args.timing, "timed": [], "checked": []}
    all_ok = True
    impls = ["fused_ln", *args.against]
    with tempfile.TemporaryDirectory() as tmp:
        lib = load_library(args.lib or build_library(find_nvcc(args.nvcc), tmp))
        results["copy_gbs"] = copy_gbs(args.iters)
        print(f"device: {name}, peak HBM {peak:.3f} TB/s, timing: {args.timing}")
        print(f"1 GiB device copy: {results['copy_gbs']:.1f} GB/s ({results['copy_gbs'] / (peak * 1e3):.1%} of peak)")
        print("us and % of HBM peak per implementation; errors: max abs / max abs over max |reference|")
        header = "".join(f"{impl:>22}" for impl in impls)
        print(f"{'shape':>11} {'dtype':>5} {'dir':>4}{header}  target  fused_ln errors")
        for seed, (rows, cols) in enumerate(args.shapes):
            for dtype_name, dtype in DTYPES.items():
                case, errs, times = time_shape(lib, rows, cols, dtype, seed, args)
                oks = {impl: passed(e, dtype) for impl, e in errs.items()}
                all_ok &= all(oks.values())
                for kind in ("fwd", "bwd"):
                    outs = case.fwd_out if kind == "fwd" else case.bwd_out  # this direction's output names
                    cells, frac_ours = [], 0.0
                    for impl in impls:
                        t = times[impl][kind]
                        sec = t[len(t) // 2]
                        gbs = rival_bytes(impl, case, kind) / sec / 1e9
                        frac = gbs / (peak * 1e3)
                        frac_ours = frac if impl == "fused_ln" else frac_ours
                        cells.append(f"{sec * 1e6:9.1f} us {frac:6.1%}" + (" " if oks.get(impl, True) else "!"))
                        mine = {k: v for k, v in errs.get(impl, {}).items() if k in outs}
                        results["timed"].append(
                            {
                                "impl": impl,
                                "shape": [rows, cols],
                                "dtype": dtype_name,
                                "dir": kind,
                                "us": sec * 1e6,
                                "us_min_p90": [t[0] * 1e6, t[int(0.9 * (len(t) - 1))] * 1e6],
                                "gbs": gbs,
                                "frac_peak": frac,
                                "errors": mine,
                                "correct": oks.get(impl),
                            }
                        )
                    target = "ok" if frac_ours >= TARGETS[kind] else f"<{TARGETS[kind]:.0%}"
                    ours = {k: v for k, v in errs["fused_ln"].items() if k in outs}
                    print(
                        f"{f'{rows}x{cols}':>11} {dtype_name:>5} {kind:>4}{''.join(f'{c:>22}' for c in cells)}"
                        f"  {target:<6}  {format_errors(ours)}"
                    )
                bad = [impl for impl, ok in oks.items() if not ok]
                if bad:
                    print(f"  MISMATCH ({', '.join(bad)}): " + "; ".join(f"{i} {format_errors(errs[i])}" for i in bad))
                del case
        if args.check_shapes:
            print("fused_ln correctness on other code paths (not timed):")
        for seed, (rows, cols) in enumerate(args.check_shapes, start=100):
            for norm in ("rms_norm", "layer_norm"):
                for dtype_name, dtype in DTYPES.items():
                    errs = Case(lib, norm, rows, cols, dtype, seed).verify()
                    ok = passed(errs, dtype)
                    all_ok &= ok
                    print(
                        f"{norm:>10} {f'{rows}x{cols}':>10} {dtype_name:>5}  {format_errors(errs)}"
                        + ("" if ok else "  MISMATCH")
                    )
                    results["checked"].append(
                        {"norm": norm, "shape": [rows, cols], "dtype": dtype_name, "errors": errs, "correct": ok}
                    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print("all results match the reference" if all_ok else "MISMATCH: some results differ from the reference")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
