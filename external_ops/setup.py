"""Build and install the `fused_ln` Paddle custom op (fused RMSNorm/LayerNorm).

Usage (from anywhere; paths are resolved relative to this file):
    python external_ops/setup.py install

Builds a CUDA + CPU op (`CUDAExtension`) when the installed paddle is compiled
with CUDA, and a CPU-only op (`CppExtension`) otherwise. The installed module
`fused_ln` exposes `fused_rms_norm(x, scale, epsilon) -> (y, invvar)` and
`fused_ln(x, scale, bias, epsilon) -> (y, mean, invvar)`, both with gradients.

The CUDA toolkit (``CUDA_HOME``, and ``CPATH`` for CUDA 13's include/cccl) is settled by
``cuda_toolkit.py`` before paddle is imported: paddle reads ``CUDA_HOME`` once, at import.
"""

# ruff: noqa: E402 -- CUDA_HOME must be set before paddle is imported (cuda_toolkit.py)
import os

from cuda_toolkit import toolkit_environment

os.environ.update(toolkit_environment(os.environ))

import paddle
from paddle.utils.cpp_extension import CppExtension, CUDAExtension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
CUDA_ARCHS = ("80", "90")


def _extension():
    """Return the CUDA extension when paddle has CUDA, else the CPU one."""
    if paddle.is_compiled_with_cuda():
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
