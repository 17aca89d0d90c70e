"""Fetch the CUDA library headers that paddle's headers include in a CUDA build, once per machine.

check_cuda_compile.sh compiles fused_ln_cuda.cu with the flags paddle's CUDAExtension uses
(-DPADDLE_WITH_CUDA -DEIGEN_USE_GPU). paddle/extension.h then includes the cuBLAS, cuDNN, cuFFT,
cuRAND, cuSOLVER and cuSPARSE headers (paddle/phi/core/enforce.h, paddle/phi/backends/dynload/*.h),
which a bare CUDA toolkit, like the CUDA 13 one on CI, does not have. NVIDIA's PyPI wheels
nvidia-<lib>-cu12 carry them under nvidia/<lib>/include.

    python external_ops/cuda_headers.py [--cache DIR]

downloads the pinned wheels with `pip download --no-deps --require-hashes`, extracts only
nvidia/*/include into DIR/<pin set>/, deletes the wheels and prints the include folders, one per
line. A later run finds DIR/<pin set>/COMPLETE and downloads nothing. The wheels are large (1.6 GB
together; the headers are 3.7 MB of them), so CI pays the download once per machine.

Pins: the CUDA 12.6 set paddlepaddle-gpu 3.3 installs on Linux x86-64, i.e. the headers that
`python external_ops/setup.py install` compiles with next to paddlepaddle-gpu 3.3 from the cu126 index.
Read from PADDLE_CUDA_INSTALL_REQUIREMENTS["12.6"] in Paddle's setup.py (3.x development branch); the
cu126 wheels' own metadata is on Paddle's index, not PyPI, so `pip show nvidia-cublas-cu12` beside an
installed paddlepaddle-gpu 3.3 is the check. Hashes are PyPI's for the x86-64 wheels.
NCCL is not fetched: paddle includes nccl.h only under PADDLE_WITH_NCCL, which custom-op builds do not
define.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CACHE = os.path.join(REPO, ".cache", "cuda-headers")
# (PyPI name, version, sha256 of the manylinux x86-64 wheel, folder under nvidia/)
WHEELS = [
    (
        "nvidia-cublas-cu12",
        "12.6.4.1",
        "08ed2686e9875d01b58e3cb379c6896df8e76c75e0d4a7f7dace3d7b6d9ef8eb",
        "cublas",
    ),
    (
        "nvidia-cudnn-cu12",
        "9.5.1.17",
        "30ac3869f6db17d170e0e556dd6cc5eee02647abc31ca856634d5a40f82c15b2",
        "cudnn",
    ),
    (
        "nvidia-cufft-cu12",
        "11.3.0.4",
        "768160ac89f6f7b459bee747e8d175dbf53619cfe74b2a5636264163138013ca",
        "cufft",
    ),
    (
        "nvidia-curand-cu12",
        "10.3.7.77",
        "99f1a32f1ac2bd134897fc7a203f779303261268a65762a623bf30cc9fe79117",
        "curand",
    ),
    (
        "nvidia-cusolver-cu12",
        "11.7.1.2",
        "6cf28f17f64107a0c4d7802be5ff5537b2130bfc112f25d5a30df227058ca0e6",
        "cusolver",
    ),
    (
        "nvidia-cusparse-cu12",
        "12.5.4.2",
        "23749a6571191a215cb74d1cdbff4a86e7b19f1200c071b3fcf844a5bea23a2f",
        "cusparse",
    ),
]
# The wheels are platform wheels; name the platform so any machine downloads the same files.
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
COMPLETE = "COMPLETE"


def requirements_text() -> str:
    """The pins as a pip requirements file with hashes."""
    return "".join(f"{name}=={version} --hash=sha256:{sha}\n" for name, version, sha, _ in WHEELS)


def pin_dir(cache: str) -> str:
    """DIR/cuda12.6-<hash of the pins>: a new pin set gets a new folder."""
    key = hashlib.sha256(requirements_text().encode()).hexdigest()[:12]
    return os.path.join(cache, f"cuda12.6-{key}")


def include_dirs(root: str) -> list[str]:
    return [os.path.join(root, "nvidia", folder, "include") for *_, folder in WHEELS]


def download(dest: str, cache: str) -> list[str]:
    """pip download the pinned wheels into dest; return their paths. Exits with pip's message on failure."""
    os.makedirs(dest)
    req = os.path.join(dest, "requirements.txt")
    with open(req, "w") as f:
        f.write(requirements_text())
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary=:all:"]
    cmd += [arg for p in PLATFORMS for arg in ("--platform", p)]
    cmd += ["--progress-bar", "off", "--disable-pip-version-check", "-q", "-d", dest, "-r", req]
    if subprocess.run(cmd, check=False).returncode != 0:
        sys.exit(
            "error: pip could not download the CUDA header wheels (see pip's message above); "
            f"this needs PyPI once per machine, later runs reuse {cache}."
        )
    return sorted(os.path.join(dest, n) for n in os.listdir(dest) if n.endswith(".whl"))


def extract_includes(wheel: str, root: str) -> tuple[int, int]:
    """Extract nvidia/<lib>/include/** (no Python files) from wheel into root; return (files, bytes)."""
    files = nbytes = 0
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            parts = info.filename.split("/")
            if len(parts) < 4 or parts[0] != "nvidia" or parts[2] != "include" or info.is_dir():
                continue
            if info.filename.endswith(".py") or "__pycache__" in parts:
                continue
            zf.extract(info, root)
            files += 1
            nbytes += info.file_size
    return files, nbytes


def fetch(cache: str) -> str:
    """Make sure the headers are under pin_dir(cache); return that folder."""
    final = pin_dir(cache)
    if os.path.exists(os.path.join(final, COMPLETE)):
        return final
    os.makedirs(cache, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="tmp-") as tmp:
        start = time.monotonic()
        wheels = download(os.path.join(tmp, "wheels"), cache)
        downloaded = sum(os.path.getsize(w) for w in wheels)
        took = time.monotonic() - start
        root = os.path.join(tmp, "headers")
        files = nbytes = 0
        for wheel in wheels:
            f, b = extract_includes(wheel, root)
            files, nbytes = files + f, nbytes + b
        missing = [d for d in include_dirs(root) if not os.path.isdir(d)]
        if missing:
            sys.exit(f"error: the downloaded wheels have no {', '.join(missing)}; the pins in {__file__} are wrong.")
        with open(os.path.join(root, COMPLETE), "w") as f:
            f.write(requirements_text())
        try:
            os.rename(root, final)  # atomic: a concurrent run either wins or finds `final` complete
        except OSError:
            if not os.path.exists(os.path.join(final, COMPLETE)):
                raise
        print(
            f"cuda headers: downloaded {len(wheels)} wheels, {downloaded:,} bytes in {took:.1f} s; "
            f"kept {files} header files ({nbytes:,} bytes) in {final}",
            file=sys.stderr,
        )
    return final


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", default=DEFAULT_CACHE, help=f"cache folder (default: {DEFAULT_CACHE})")
    parser.add_argument("--clean", action="store_true", help="delete the cache folder first")
    args = parser.parse_args(argv)
    if args.clean:
        shutil.rmtree(args.cache, ignore_errors=True)
    print("\n".join(include_dirs(fetch(os.path.abspath(args.cache)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
