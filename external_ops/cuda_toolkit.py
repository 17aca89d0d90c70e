"""Which CUDA toolkit builds the fused_ln op, settled before paddle is imported.

paddle 3.3.1 reads ``CUDA_HOME`` once, when ``import paddle`` imports ``paddle.utils.cpp_extension``
(``cpp_extension.py``: ``CUDA_HOME = find_cuda_home()``): ``$CUDA_HOME`` or ``$CUDA_PATH``, else
the folder above the ``bin/`` of the first ``nvcc`` on PATH, else ``/usr/local/cuda``; its
``CUDAExtension`` then runs ``$CUDA_HOME/bin/nvcc``. An ``nvcc`` wrapper script such as
``/usr/local/bin/nvcc`` would make that ``/usr/local``, which holds no CUDA headers. Here the same
order is followed, but a folder counts only when it is a toolkit (``bin/nvcc`` and
``include/cuda_runtime.h``, the ``nvcc`` followed through symlinks).

CUDA 13 moved the CCCL headers (cub, thrust, libcu++) to ``include/cccl`` (CUDA 13.0 release
notes), where nvcc does not look: that folder of the chosen toolkit, and only of it, is put first
on ``CPATH``, so a CUDA 12 ``nvcc`` never meets CUDA 13 headers.
"""

from __future__ import annotations

import os
import shutil
from typing import Callable, Optional

DEFAULT_HOMES = ("/usr/local/cuda", "/usr/local/cuda-13.0")


def is_toolkit(folder: str) -> bool:
    """True when ``folder`` holds ``bin/nvcc`` and ``include/cuda_runtime.h``."""
    return os.path.isfile(os.path.join(folder, "bin", "nvcc")) and os.path.isfile(
        os.path.join(folder, "include", "cuda_runtime.h")
    )


def find_toolkit(environ, which: Callable[[str], Optional[str]] = shutil.which) -> Optional[str]:
    """The CUDA toolkit folder: ``CUDA_HOME`` or ``CUDA_PATH`` as given, else the toolkit of the
    ``nvcc`` on PATH, else the first toolkit of ``DEFAULT_HOMES``; None when there is none."""
    given = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    if given:
        return given
    nvcc = which("nvcc")
    candidates = [os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))] if nvcc else []
    return next((folder for folder in candidates + list(DEFAULT_HOMES) if is_toolkit(folder)), None)


def toolkit_environment(environ, which: Callable[[str], Optional[str]] = shutil.which) -> dict:
    """The ``CUDA_HOME`` and ``CPATH`` values to build with (empty when no toolkit is found).

    Args:
        environ: the current environment (``os.environ``).
        which: how to find a program on PATH (``shutil.which``).
    """
    home = find_toolkit(environ, which)
    if home is None:
        return {}
    updates = {"CUDA_HOME": home}
    cccl = os.path.join(home, "include", "cccl")
    paths = [path for path in environ.get("CPATH", "").split(os.pathsep) if path]
    if os.path.isdir(cccl) and cccl not in paths:
        updates["CPATH"] = os.pathsep.join([cccl, *paths])
    return updates
