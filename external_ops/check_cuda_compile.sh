#!/usr/bin/env bash
# Compile-only check of the fused_ln CUDA sources; needs nvcc and, once per machine, PyPI; no GPU.
#
#   external_ops/check_cuda_compile.sh            # exit 0: compiled (or no nvcc: SKIP)
#   NVCC=/usr/local/cuda-13.0/bin/nvcc PYTHON=.venv/bin/python external_ops/check_cuda_compile.sh
#
# 1. The Paddle-free harness (harness/fused_norm_capi.cu, which includes every
#    kernel in fused_norm_kernels.cuh) for sm_80 and sm_90. Register spills fail it.
# 2. fused_ln.cc with its CUDA branches enabled (-DFUSED_LN_WITH_CUDA), syntax only.
# 3. The Paddle-facing fused_ln_cuda.cu against paddle's headers for sm_80 and sm_90,
#    with the flags paddle's CUDAExtension uses (-DPADDLE_WITH_CUDA ...). Those headers
#    include cuBLAS, cuDNN, cuFFT, cuRAND, cuSOLVER and cuSPARSE headers, which a bare
#    CUDA toolkit lacks: cuda_headers.py downloads them from PyPI once into
#    CUDA_HEADERS_CACHE (default .cache/cuda-headers) and later runs reuse them.
# Any failure exits non-zero with the compiler's message; only a missing nvcc SKIPs.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda-13.0}"
if [[ -z "${NVCC:-}" ]]; then
  NVCC="$CUDA_HOME/bin/nvcc"
  [[ -x "$NVCC" ]] || NVCC="$(command -v nvcc || true)"
fi
PYTHON="${PYTHON:-python}"
CUDA_HEADERS_CACHE="${CUDA_HEADERS_CACHE:-$(dirname "$HERE")/.cache/cuda-headers}"
if [[ -z "$NVCC" || ! -x "$NVCC" ]]; then
  echo "SKIP: nvcc not found; install the CUDA toolkit or set NVCC=/path/to/nvcc."
  exit 0
fi
CUDA_ROOT="$CUDA_HOME"
[[ -d "$CUDA_ROOT/include" ]] || CUDA_ROOT="$(dirname "$(dirname "$(readlink -f "$NVCC")")")"
CCCL=()
[[ -d "$CUDA_ROOT/include/cccl" ]] && CCCL=(-I"$CUDA_ROOT/include/cccl")
# sm_80 and sm_90 as in setup.py; --threads 0 compiles them in parallel where there are cores.
ARCHS=(-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 --threads 0)
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

echo "[1/3] nvcc harness + kernels for sm_80, sm_90"
"$NVCC" -std=c++17 -O3 -c "${CCCL[@]}" "${ARCHS[@]}" \
  -Xptxas -warn-spills -Werror all-warnings -Xcompiler -fPIC \
  -o "$OUT/capi.o" "$HERE/harness/fused_norm_capi.cu"

if ! PADDLE_DIRS="$("$PYTHON" -W ignore - <<'PY'
import sysconfig
from paddle.utils.cpp_extension.extension_utils import find_paddle_includes
print("\n".join(find_paddle_includes() + [sysconfig.get_paths()["include"]]))
PY
)"; then
  echo "error: $PYTHON cannot import paddle (see above); run 'make install' or set PYTHON to the training Python." >&2
  exit 1
fi
PADDLE_INC=() PADDLE_SYS=()
while IFS= read -r dir; do PADDLE_INC+=(-I"$dir"); PADDLE_SYS+=(-isystem "$dir"); done <<< "$PADDLE_DIRS"
echo "[2/3] g++ -fsyntax-only fused_ln.cc -DFUSED_LN_WITH_CUDA"
g++ -std=c++17 -fsyntax-only -DFUSED_LN_WITH_CUDA "${PADDLE_INC[@]}" "$HERE/fused_ln.cc"

echo "[3/3] nvcc fused_ln_cuda.cu against paddle headers for sm_80, sm_90"
if ! LIB_DIRS="$("$PYTHON" "$HERE/cuda_headers.py" --cache "$CUDA_HEADERS_CACHE")"; then
  echo "FAIL: no cuBLAS/cuDNN/... headers for paddle's CUDA build (see above)." >&2
  exit 1
fi
LIB_INC=()
while IFS= read -r dir; do LIB_INC+=(-isystem "$dir"); done <<< "$LIB_DIRS"
# The flags of paddle's CUDAExtension (paddle/utils/cpp_extension) and of setup.py. Paddle's
# and the libraries' headers are system headers: their warnings are not ours. 20012: paddle's
# defaulted __host__ __device__ constructors (paddle/common/dim.h), reported even there.
if ! "$NVCC" -std=c++17 -c "${CCCL[@]}" "${PADDLE_SYS[@]}" "${LIB_INC[@]}" "${ARCHS[@]}" \
  -DPADDLE_WITH_CUDA -DEIGEN_USE_GPU --expt-relaxed-constexpr -DNVCC -Xcompiler -fPIC \
  -O3 -DFUSED_LN_WITH_CUDA -diag-suppress 20012 -o "$OUT/op.o" "$HERE/fused_ln_cuda.cu"; then
  echo "FAIL: fused_ln_cuda.cu does not compile against paddle's headers (nvcc's errors above)." >&2
  exit 1
fi
echo "OK: CUDA sources compile."
