#!/usr/bin/env bash
# Compile-only check of the fused_ln CUDA sources; needs nvcc, no GPU.
#
#   external_ops/check_cuda_compile.sh            # exit 0: compiled (or no nvcc: SKIP)
#   NVCC=/usr/local/cuda-13.0/bin/nvcc PYTHON=.venv/bin/python external_ops/check_cuda_compile.sh
#
# 1. The Paddle-free harness (harness/fused_norm_capi.cu, which includes every
#    kernel in fused_norm_kernels.cuh) for sm_80 and sm_90. Register spills fail it.
# 2. fused_ln.cc with its CUDA branches enabled (-DFUSED_LN_WITH_CUDA), syntax only.
# 3. The Paddle-facing fused_ln_cuda.cu against paddle's headers, only when the
#    toolkit has the cuBLAS headers that paddle/extension.h includes under
#    PADDLE_WITH_CUDA (the CUDA 13 toolkit here does not); SKIP with the reason otherwise.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda-13.0}"
if [[ -z "${NVCC:-}" ]]; then
  NVCC="$CUDA_HOME/bin/nvcc"
  [[ -x "$NVCC" ]] || NVCC="$(command -v nvcc || true)"
fi
PYTHON="${PYTHON:-python}"
if [[ -z "$NVCC" || ! -x "$NVCC" ]]; then
  echo "SKIP: nvcc not found; install the CUDA toolkit or set NVCC=/path/to/nvcc."
  exit 0
fi
CUDA_ROOT="$CUDA_HOME"
[[ -d "$CUDA_ROOT/include" ]] || CUDA_ROOT="$(dirname "$(dirname "$(readlink -f "$NVCC")")")"
CCCL=()
[[ -d "$CUDA_ROOT/include/cccl" ]] && CCCL=(-I"$CUDA_ROOT/include/cccl")
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

echo "[1/3] nvcc harness + kernels for sm_80, sm_90"
"$NVCC" -std=c++17 -O3 -c "${CCCL[@]}" \
  -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
  -Xptxas -warn-spills -Werror all-warnings -Xcompiler -fPIC \
  -o "$OUT/capi.o" "$HERE/harness/fused_norm_capi.cu"

PADDLE_INC="$("$PYTHON" - <<'PY'
import sysconfig
from paddle.utils.cpp_extension.extension_utils import find_paddle_includes
dirs = find_paddle_includes() + [sysconfig.get_paths()["include"]]
print(" ".join("-I" + d for d in dirs))
PY
)"
# shellcheck disable=SC2086  # PADDLE_INC is a list of -I flags
echo "[2/3] g++ -fsyntax-only fused_ln.cc -DFUSED_LN_WITH_CUDA"
g++ -std=c++17 -fsyntax-only -DFUSED_LN_WITH_CUDA $PADDLE_INC "$HERE/fused_ln.cc"

if [[ -f "$CUDA_ROOT/include/cublasXt.h" ]]; then
  echo "[3/3] nvcc fused_ln_cuda.cu against paddle headers"
  # shellcheck disable=SC2086
  "$NVCC" -std=c++17 -c "${CCCL[@]}" $PADDLE_INC -DPADDLE_WITH_CUDA \
    -DFUSED_LN_WITH_CUDA -gencode arch=compute_80,code=sm_80 -Xcompiler -fPIC \
    -o "$OUT/op.o" "$HERE/fused_ln_cuda.cu"
else
  echo "[3/3] SKIP fused_ln_cuda.cu: $CUDA_ROOT has no cuBLAS headers (cublasXt.h)," \
    "which paddle/extension.h needs with PADDLE_WITH_CUDA; its kernels were compiled in [1/3]."
fi
echo "OK: CUDA sources compile."
