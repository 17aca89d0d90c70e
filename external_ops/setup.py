"""Build and install the `fused_ln` Paddle custom op (fused RMSNorm/LayerNorm).

Usage (from anywhere; paths are resolved relative to this file):
    python external_ops/setup.py install

Builds a CUDA + CPU op (`CUDAExtension`) when the installed paddle is compiled
with CUDA, and a CPU-only op (`CppExtension`) otherwise. The installed module
`fused_ln` exposes `fused_rms_norm(x, scale, epsilon) -> (y, invvar)` and
`fused_ln(x, scale, bias, epsilon) -> (y, mean, invvar)`, both with gradients.

CUDA 13 keeps the CCCL headers (cub/thrust/libcu++) under include/cccl, so when
CUDA_HOME or CPATH are unset and /usr/local/cuda-13.0 exists they are set here.
"""

import os

import paddle
from paddle.utils.cpp_extension import CppExtension, CUDAExtension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
CUDA13_HOME = "/usr/local/cuda-13.0"
CUDA_ARCHS = ("80", "90")


def _set_cuda13_env() -> None:
    """Point CUDA_HOME/CPATH at CUDA 13 when unset and the toolkit exists."""
    if not os.path.isdir(CUDA13_HOME):
        return
    os.environ.setdefault("CUDA_HOME", CUDA13_HOME)
    cccl = os.path.join(CUDA13_HOME, "include", "cccl")
    if os.path.isdir(cccl) and not os.environ.get("CPATH"):
        os.environ["CPATH"] = cccl


def _extension():
    """Return the CUDA extension when paddle has CUDA, else the CPU one."""
    if paddle.is_compiled_with_cuda():
        _set_cuda13_env()
        gencode = []
        for arch in CUDA_ARCHS:
            gencode += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
        return CUDAExtension(
            sources=["fused_ln.cc", "fused_ln_cuda.cu"],
            extra_compile_args={
                "cxx": ["-O3", "-DFUSED_LN_WITH_CUDA"],
                "nvcc": ["-O3", "-DFUSED_LN_WITH_CUDA", *gencode],
            },
        )
    return CppExtension(
        sources=["fused_ln.cc"],
        extra_compile_args={"cxx": ["-O3"]},
    )


# paddle's setup() resolves sources and the build dir against the cwd.
os.chdir(HERE)
setup(name="fused_ln", ext_modules=_extension())
