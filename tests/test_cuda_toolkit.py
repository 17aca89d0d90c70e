"""external_ops/cuda_toolkit.py: the CUDA toolkit the fused_ln build uses, and CUDA 13's include/cccl on
CPATH only for that toolkit (no mixing with a CUDA 12 nvcc). Fake toolkits in tmp_path; no CUDA needed."""

import os
import sys

import pytest
from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "external_ops"))
import cuda_toolkit  # noqa: E402 -- external_ops is not a package


def _toolkit(root, name: str, cccl: bool) -> str:
    home = root / name
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "nvcc").write_text("")
    (home / "include").mkdir()
    (home / "include" / "cuda_runtime.h").write_text("")
    if cccl:
        (home / "include" / "cccl").mkdir()
    return str(home)


@pytest.fixture
def no_default_homes(monkeypatch):
    monkeypatch.setattr(cuda_toolkit, "DEFAULT_HOMES", ())


def test_cuda_12_nvcc_on_path_never_gets_cuda_13_headers(tmp_path, monkeypatch):
    cuda12, cuda13 = _toolkit(tmp_path, "cuda-12.4", cccl=False), _toolkit(tmp_path, "cuda-13.0", cccl=True)
    monkeypatch.setattr(cuda_toolkit, "DEFAULT_HOMES", (cuda13,))
    env = cuda_toolkit.toolkit_environment({}, which=lambda name: os.path.join(cuda12, "bin", "nvcc"))
    assert env == {"CUDA_HOME": cuda12}


def test_cuda_13_puts_its_cccl_first_on_cpath_once(tmp_path, no_default_homes):
    cuda13 = _toolkit(tmp_path, "cuda-13.0", cccl=True)
    nvcc = lambda name: os.path.join(cuda13, "bin", "nvcc")  # noqa: E731
    cccl = os.path.join(cuda13, "include", "cccl")
    assert cuda_toolkit.toolkit_environment({"CPATH": "/opt/x"}, nvcc) == {
        "CUDA_HOME": cuda13,
        "CPATH": f"{cccl}:/opt/x",
    }
    assert cuda_toolkit.toolkit_environment({"CPATH": cccl}, nvcc) == {"CUDA_HOME": cuda13}


def test_an_nvcc_wrapper_outside_a_toolkit_falls_back_to_the_default_toolkit(tmp_path, monkeypatch):
    """/usr/local/bin/nvcc as a wrapper script: paddle's own guess would be /usr/local, which holds no headers."""
    wrapper = tmp_path / "local" / "bin" / "nvcc"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text("#!/bin/sh\n")
    cuda13 = _toolkit(tmp_path, "cuda-13.0", cccl=True)
    monkeypatch.setattr(cuda_toolkit, "DEFAULT_HOMES", (cuda13,))
    assert cuda_toolkit.find_toolkit({}, which=lambda name: str(wrapper)) == cuda13


def test_a_given_cuda_home_is_kept_and_no_toolkit_changes_nothing(tmp_path, no_default_homes):
    cuda12 = _toolkit(tmp_path, "cuda-12.4", cccl=False)
    assert cuda_toolkit.toolkit_environment({"CUDA_HOME": cuda12}, which=lambda name: None) == {"CUDA_HOME": cuda12}
    assert cuda_toolkit.toolkit_environment({}, which=lambda name: None) == {}


def test_setup_settles_the_toolkit_before_paddle_is_imported():
    """paddle reads CUDA_HOME once, at import (cpp_extension.py: CUDA_HOME = find_cuda_home())."""
    with open(os.path.join(REPO, "external_ops", "setup.py"), encoding="utf-8") as f:
        source = f.read()
    assert source.index("os.environ.update(toolkit_environment(os.environ))") < source.index("import paddle")
