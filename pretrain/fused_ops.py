"""Check that the `fused_ln` custom op PaddleNLP uses for fused RMSNorm is usable.

PaddleNLP's LLaMA/Qwen `fusion_ops` do `import fused_ln` and call
`fused_ln.fused_rms_norm(x, w, eps)[0]` when `use_fused_rms_norm` is true. The
op is built from `external_ops/` (see docs/external_ops.md). A missing build,
or a local file/folder named `fused_ln` that shadows the installed op, fails
deep inside the first forward pass, and a build without CUDA kernels fails at the first call
on a GPU; `fused_ln_problem(place)` reports both up front.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
from pathlib import Path

MODULE = "fused_ln"
REQUIRED = ("fused_rms_norm", "fused_ln")
BUILD_HINT = "run `make ops` (python external_ops/setup.py install)"


def _is_compiled(origin: Path, name: str) -> bool:
    """True when `origin` is, or sits next to, a compiled library for `name`.

    Paddle installs custom ops as a Python stub (`name/__init__.py`) next to
    `name_pd_.so`; older layouts put `name.py` next to `name_pd_.so`.
    """
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES) + (".so",)
    if origin.name.endswith(suffixes):
        return True
    return any(p.name.startswith(name) and p.name.endswith(suffixes) for p in origin.parent.iterdir())


def module_problem(name: str = MODULE) -> str | None:
    """Return a one-line problem with the custom-op module `name`, or None.

    None means `import name` resolves to a compiled op exposing every function
    in REQUIRED. Otherwise the sentence names the problem and the fix. Finding
    the module imports it (loads the compiled library) but never imports a
    non-compiled shadowing module.
    """
    spec = importlib.util.find_spec(name)
    if spec is None:
        return f"use_fused_rms_norm is true but the {name} op is not installed: {BUILD_HINT}."
    if spec.origin is None or spec.origin == "namespace":
        where = ", ".join(spec.submodule_search_locations or [])
        return (
            f"`import {name}` resolves to the plain folder {where}, not the "
            f"compiled op (it is not installed): rename or remove that folder, "
            f"then {BUILD_HINT}."
        )
    origin = Path(spec.origin).resolve()
    if not _is_compiled(origin, name):
        local = origin.is_relative_to(Path.cwd().resolve())
        kind = "a local file or folder" if local else "a non-compiled module"
        return (
            f"`import {name}` resolves to {origin}, {kind} that shadows the "
            f"compiled {name} op: rename or remove it, then {BUILD_HINT}."
        )
    try:
        module = importlib.import_module(name)
    except ImportError as err:
        return f"the {name} op is installed but fails to load ({err}): {BUILD_HINT}."
    missing = [f for f in REQUIRED if not callable(getattr(module, f, None))]
    if missing:
        return (
            f"module '{name}' at {origin} has no attribute "
            f"{', '.join(missing)}: it is a stale or foreign build; {BUILD_HINT}."
        )
    return None


def call_problem(name: str, place) -> str | None:
    """Call ``name.fused_rms_norm`` once on a [2, 64] float32 tensor on ``place``; None when it runs
    and matches the reference x / sqrt(mean(x^2) + eps) * w within 1e-5, else a one-line fix.

    A build without CUDA kernels (made where paddle had no GPU) imports fine and fails only here,
    at the first call on a GPU.
    """
    import numpy as np
    import paddle

    module = importlib.import_module(name)
    x = np.random.default_rng(0).standard_normal((2, 64)).astype("float32")
    w = np.linspace(0.5, 1.5, 64, dtype="float32")
    eps = 1e-6
    try:
        out = module.fused_rms_norm(paddle.to_tensor(x, place=place), paddle.to_tensor(w, place=place), eps)[0]
        got = out.numpy()
    except Exception as err:  # the op's own error (e.g. no kernel for this place): reported, not raised
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return f"the {name} op fails on {place} ({first}): rebuild it on this machine, {BUILD_HINT}."
    expected = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w
    if not np.allclose(got, expected, atol=1e-5):
        return f"the {name} op on {place} disagrees with RMSNorm's formula: a broken build; {BUILD_HINT}."
    return None


def fused_ln_problem(place=None) -> str | None:
    """Return None when the `fused_ln` op is usable, else a one-line fix.

    Args:
        place: a paddle place (``paddle.CPUPlace()``, ``paddle.CUDAPlace(i)``) to call the op on
            once; None checks the import only (a forecast, where the run's device is not here).
    """
    problem = module_problem(MODULE)
    if problem is None and place is not None:
        problem = call_problem(MODULE, place)
    return problem
