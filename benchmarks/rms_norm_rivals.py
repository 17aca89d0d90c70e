"""The RMSNorm implementations benchmarks/rms_norm_cuda.py times beside fused_ln, on one GPU.

Each rival computes y = x * rsqrt(mean(x**2, -1) + eps) * w over rows of x [rows, cols]
(float32 arithmetic, outputs in x's dtype) and its backward (dx [rows, cols], dw [cols]):

- "torch.compile": torch.nn.functional.rms_norm under torch.compile (Inductor, static shapes);
  forward and backward are the kernels Inductor generates for a training step (the backward
  through torch.autograd.grad on the compiled forward's graph).
- "triton": a Triton RMSNorm written the way Liger-Kernel's is (liger_kernel/ops/rms_norm.py,
  https://github.com/linkedin/Liger-Kernel): one program per row in the forward, which saves
  rstd; one program per SM in the backward, each accumulating dw over its rows in float32 and
  writing one partial row, the partial rows summed by torch; BLOCK = next power of two of cols
  and num_warps as Liger's calculate_settings picks them. Computes in float32 throughout (as
  fused_ln does; Liger's default "llama" casting rounds x * rstd to x's dtype first).
- "ceiling": not an RMSNorm: y.copy_(x) (forward) and torch.add(x, dy, out=dx) (backward) move
  the same row data (2 and 3 passes over [rows, cols]) with no reduction, the bandwidth any
  kernel of this shape reaches under the same timing.

make(name, x, w, dy, eps) returns a Rival whose fwd() and bwd() enqueue one call each on the
current stream and whose outputs() runs both and returns {"y", "dx", "dscale"} (None for the
ceiling). Needs PyTorch with CUDA and, for "torch.compile" and "triton", Triton.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch._functorch.config
import torch.nn.functional as F

NAMES = ("torch.compile", "triton", "ceiling")


@dataclass
class Rival:
    fwd: Callable[[], object]
    bwd: Callable[[], object]
    outputs: Callable[[], dict | None]


def _compiled(x, w, dy, eps: float) -> Rival:
    # Timing calls the same backward graph repeatedly (retain_graph), which a backward that
    # donates its saved buffers refuses; donation saves memory, not time.
    torch._functorch.config.donated_buffer = False
    fn = torch.compile(lambda a, b: F.rms_norm(a, (a.shape[-1],), b, eps), dynamic=False)
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = fn(xr, wr)

    def outputs() -> dict:
        out = fn(xr, wr)
        dx, dw = torch.autograd.grad(out, (xr, wr), dy)
        return {"y": out.detach(), "dx": dx, "dscale": dw}

    return Rival(
        fwd=lambda: fn(xr, wr),
        bwd=lambda: torch.autograd.grad(y, (xr, wr), dy, retain_graph=True),
        outputs=outputs,
    )


_TRITON_KERNELS: tuple | None = None


def _triton_kernels() -> tuple:
    """(triton, forward kernel, backward kernel), compiled once per process."""
    global _TRITON_KERNELS
    if _TRITON_KERNELS is not None:
        return _TRITON_KERNELS
    import triton
    import triton.language as tl

    @triton.jit
    def fwd_kernel(Y, X, W, RSTD, n_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        xr = tl.load(X + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        wr = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(xr * xr, axis=0) / n_cols + eps)
        tl.store(RSTD + row, rstd)
        tl.store(Y + row * n_cols + cols, (xr * rstd * wr).to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def bwd_kernel(DY, DX, X, W, RSTD, DW, n_rows, n_cols, rows_per_program, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        wr = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        dw = tl.zeros((BLOCK,), dtype=tl.float32)
        start = pid * rows_per_program
        for row in range(start, tl.minimum(start + rows_per_program, n_rows)):
            off = row.to(tl.int64) * n_cols
            xr = tl.load(X + off + cols, mask=mask, other=0.0).to(tl.float32)
            d = tl.load(DY + off + cols, mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(RSTD + row)
            xhat = xr * rstd
            g = d * wr
            dxr = rstd * (g - xhat * (tl.sum(g * xhat, axis=0) / n_cols))
            dw += d * xhat
            tl.store(DX + off + cols, dxr.to(DX.dtype.element_ty), mask=mask)
        tl.store(DW + pid * n_cols + cols, dw, mask=mask)

    _TRITON_KERNELS = (triton, fwd_kernel, bwd_kernel)
    return _TRITON_KERNELS


def _triton(x, w, dy, eps: float) -> Rival:
    triton, fwd_kernel, bwd_kernel = _triton_kernels()
    rows, cols = x.shape
    block = triton.next_power_of_2(cols)
    warps = 32 if block >= 32768 else 16 if block >= 8192 else 8 if block >= 2048 else 4
    programs = torch.cuda.get_device_properties(x.device).multi_processor_count
    per_program = -(-rows // programs)
    y, dx = torch.empty_like(x), torch.empty_like(x)
    rstd = torch.empty(rows, device=x.device, dtype=torch.float32)
    partial = torch.empty(programs, cols, device=x.device, dtype=torch.float32)
    dw = torch.empty_like(w)

    def fwd() -> None:
        fwd_kernel[(rows,)](y, x, w, rstd, cols, eps, BLOCK=block, num_warps=warps)

    def bwd() -> None:
        bwd_kernel[(programs,)](dy, dx, x, w, rstd, partial, rows, cols, per_program, BLOCK=block, num_warps=warps)
        dw.copy_(partial.sum(0))  # as Liger's _dW.sum(dim=0).to(W.dtype)

    def outputs() -> dict:
        fwd()
        bwd()
        return {"y": y, "dx": dx, "dscale": dw}

    return Rival(fwd=fwd, bwd=bwd, outputs=outputs)


def _ceiling(x, w, dy, eps: float) -> Rival:
    y, dx = torch.empty_like(x), torch.empty_like(x)
    return Rival(fwd=lambda: y.copy_(x), bwd=lambda: torch.add(x, dy, out=dx), outputs=lambda: None)


def make(name: str, x, w, dy, eps: float) -> Rival:
    """The rival `name` (one of NAMES) on x [rows, cols], w [cols], dy [rows, cols].

    Raises ValueError for an unknown name.
    """
    builders = {"torch.compile": _compiled, "triton": _triton, "ceiling": _ceiling}
    if name not in builders:
        raise ValueError(f"unknown rival '{name}'; choose from {', '.join(NAMES)}")
    return builders[name](x, w, dy, eps)
