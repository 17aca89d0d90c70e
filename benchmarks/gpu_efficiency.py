"""Achieved matmul, flash-attention and HBM rates of a GPU: the planner's per-architecture efficiencies.

    python benchmarks/gpu_efficiency.py --peak_tflops 989 --hbm_tbps 3.35

Needs a CUDA GPU and PyTorch (the device this was measured on had no GPU build of paddle; cuBLAS
and FlashAttention-2 are the kernels paddle calls too). No import of ``pretrain``.

Prints, as fractions of the datasheet figures given on the command line:
- matmul: ``[M, K] x [K, N]`` in fp16 and bf16 at decoder shapes (M tokens 2048-16384; K, N the
  LLaMA-7B/13B projections whole and split over 2 or 4 tensor-parallel ranks); 2·M·K·N FLOPs per call.
- flash attention: ``scaled_dot_product_attention`` restricted to the flash backend, causal, head
  size 128, bf16, forward + backward; FLOPs counted as FlashAttention-2 does (Dao 2023, Sec. 4.1):
  forward 4·batch·heads·seq²·head / 2 (causal), backward 2.5 x forward.
- HBM: a device copy (read + write) and an add (two reads + a write) of 256 MiB and 1 GiB fp16.
Each timing is the mean over 20 calls after 3 warm-up calls.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import torch
import torch.nn.functional as F

TOKENS = (2048, 4096, 8192, 16384)
PROJECTIONS = ((4096, 4096), (4096, 2048), (4096, 11008), (4096, 5504), (11008, 4096), (5504, 4096), (5120, 13824))
ATTENTION = ((2048, 1, 32), (2048, 2, 32), (2048, 4, 16), (4096, 1, 32), (4096, 2, 32), (4096, 4, 16))  # seq, b, h


def seconds_per_call(fn, calls: int = 20) -> float:
    """Mean seconds of ``fn()`` over ``calls`` calls after 3 warm-up calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls


def matmul_tflops() -> list:
    rates = []
    for dtype in (torch.float16, torch.bfloat16):
        for m in TOKENS:
            for k, n in PROJECTIONS:
                a = torch.randn(m, k, device="cuda", dtype=dtype)
                b = torch.randn(k, n, device="cuda", dtype=dtype)
                rates.append(2 * m * k * n / seconds_per_call(partial(torch.matmul, a, b)) / 1e12)
    return rates


def attention_step(q, k, v) -> None:
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(torch.ones_like(out))


def flash_tflops() -> list:
    rates = []
    for seq, batch, heads in ATTENTION:
        q, k, v = (
            torch.randn(batch, heads, seq, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            elapsed = seconds_per_call(partial(attention_step, q, k, v))
        forward = 4 * batch * heads * seq * seq * 128 / 2
        rates.append(3.5 * forward / elapsed / 1e12)
    return rates


def hbm_tbps() -> list:
    rates = []
    for numel in (2**27, 2**29):  # fp16: 256 MiB, 1 GiB
        x = torch.empty(numel, device="cuda", dtype=torch.float16)
        y = torch.empty_like(x)
        rates.append(2 * 2 * numel / seconds_per_call(partial(y.copy_, x)) / 1e12)
        rates.append(3 * 2 * numel / seconds_per_call(partial(torch.add, x, y, out=x)) / 1e12)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak_tflops", type=float, required=True, help="datasheet dense fp16/bf16 TFLOP/s")
    parser.add_argument("--hbm_tbps", type=float, required=True, help="datasheet HBM TB/s (1e12 bytes/s)")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}")
    for name, rates, peak in (
        ("matmul TFLOP/s", matmul_tflops(), args.peak_tflops),
        ("flash attention TFLOP/s", flash_tflops(), args.peak_tflops),
        ("HBM TB/s", hbm_tbps(), args.hbm_tbps),
    ):
        print(
            f"{name}: min {min(rates):.2f} mean {statistics.mean(rates):.2f} max {max(rates):.2f}; "
            f"fraction of datasheet: min {min(rates) / peak:.3f} mean {statistics.mean(rates) / peak:.3f} "
            f"max {max(rates) / peak:.3f}"
        )


if __name__ == "__main__":
    main()
