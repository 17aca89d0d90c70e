"""Tests for the `fused_ln` custom op (external_ops/) against pure-Paddle references.

Build the op first: python external_ops/setup.py install. Without it the op
tests are skipped (the fused_ops problem-detection tests still run).
"""

import importlib
import sys

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from pretrain.fused_ops import fused_ln_problem, module_problem

PROBLEM = fused_ln_problem()
needs_op = pytest.mark.skipif(PROBLEM is not None, reason=f"fused_ln op not usable: {PROBLEM}")
if PROBLEM is None:
    import fused_ln

HIDDEN_SIZES = [1, 64, 96, 1000, 4096, 5120]
EPS = 1e-6
ATOL = 1e-5


def rms_norm_reference(x, w, eps):
    """Plain Paddle RMSNorm in float32: x * rsqrt(mean(x^2) + eps) * w."""
    xf = x.astype("float32")
    y = xf * paddle.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y * w.astype("float32")


def make_inputs(shape, seed, dtype="float32"):
    """Random x [*shape], scale [hidden] and upstream grad dy [*shape]."""
    rng = np.random.default_rng(seed)
    x = paddle.to_tensor(rng.standard_normal(shape).astype("float32")).astype(dtype)
    w = paddle.to_tensor(rng.uniform(0.5, 1.5, shape[-1]).astype("float32")).astype(dtype)
    b = paddle.to_tensor(rng.standard_normal(shape[-1]).astype("float32")).astype(dtype)
    dy = paddle.to_tensor(rng.standard_normal(shape).astype("float32")).astype(dtype)
    for t in (x, w, b):
        t.stop_gradient = False
    return x, w, b, dy


def max_diff(a, b):
    return float((a.astype("float32") - b.astype("float32")).abs().max())


def grads(out, dy, *params):
    return paddle.grad([out], list(params), grad_outputs=[dy])


@needs_op
@pytest.mark.parametrize("hidden", HIDDEN_SIZES)
def test_rms_norm_matches_reference_fp32(hidden):
    x, w, _, dy = make_inputs([2, 3, hidden], seed=hidden)
    y, invvar = fused_ln.fused_rms_norm(x, w, EPS)
    ref = rms_norm_reference(x, w, EPS)
    assert y.shape == x.shape and y.dtype == paddle.float32
    assert invvar.shape == [6] and invvar.dtype == paddle.float32
    assert max_diff(y, ref) <= ATOL
    expected_invvar = paddle.rsqrt(x.pow(2).mean(-1) + EPS).reshape([6])
    assert max_diff(invvar, expected_invvar) <= ATOL
    for got, want in zip(grads(y, dy, x, w), grads(ref, dy, x, w)):
        assert max_diff(got, want) <= ATOL


@needs_op
@pytest.mark.parametrize("hidden", HIDDEN_SIZES)
def test_layer_norm_matches_reference_fp32(hidden):
    x, w, b, dy = make_inputs([2, 3, hidden], seed=100 + hidden)
    y, mean, invvar = fused_ln.fused_ln(x, w, b, EPS)
    ref = F.layer_norm(x, [hidden], weight=w, bias=b, epsilon=EPS)
    assert mean.shape == [6] and invvar.shape == [6]
    assert max_diff(y, ref) <= ATOL
    assert max_diff(mean, x.mean(-1).reshape([6])) <= ATOL
    for got, want in zip(grads(y, dy, x, w, b), grads(ref, dy, x, w, b)):
        assert max_diff(got, want) <= ATOL


@needs_op
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_rms_norm_half_precision_accumulates_in_fp32(dtype):
    x, w, _, dy = make_inputs([4, 1000], seed=7, dtype=dtype)
    y, invvar = fused_ln.fused_rms_norm(x, w, EPS)
    assert y.dtype == x.dtype and invvar.dtype == paddle.float32
    gx, gw = grads(y, dy, x, w)
    assert gx.dtype == x.dtype and gw.dtype == w.dtype
    # Reference in float32 on the same (already rounded) inputs.
    x32, w32 = x.astype("float32").detach(), w.astype("float32").detach()
    x32.stop_gradient = w32.stop_gradient = False
    ref = rms_norm_reference(x32, w32, EPS)
    rx, rw = grads(ref, dy.astype("float32"), x32, w32)
    rel = 2**-7 if dtype == "bfloat16" else 2**-10  # output rounding step
    scale_of = lambda t: float(t.abs().max())  # noqa: E731
    assert max_diff(y, ref) <= 2 * rel * scale_of(ref)
    assert max_diff(gx, rx) <= 2 * rel * scale_of(rx)
    assert max_diff(gw, rw) <= 2 * rel * scale_of(rw)


@needs_op
def test_rms_norm_rejects_mismatched_scale():
    x, _, _, _ = make_inputs([2, 64], seed=0)
    with pytest.raises(OSError, match="scale must have shape"):
        fused_ln.fused_rms_norm(x, paddle.ones([32]), EPS)


def tiny_llama_losses(use_fused, steps=4):
    """Losses of a tiny LLaMA trained `steps` AdamW steps on fixed random data."""
    from paddlenlp.transformers import LlamaForCausalLM
    from tiny_models import tiny_llama_config

    config = tiny_llama_config(
        max_position_embeddings=32,
        use_fused_rms_norm=use_fused,
        use_fast_layer_norm=False,  # LlamaRMSNorm reads it; LlamaConfig lacks it
    )
    paddle.seed(1234)
    model = LlamaForCausalLM(config)
    opt = paddle.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters())
    rng = np.random.default_rng(0)
    tokens = paddle.to_tensor(rng.integers(0, 256, (steps, 2, 33)), dtype="int64")
    losses = []
    for step in range(steps):
        out = model(input_ids=tokens[step, :, :-1], labels=tokens[step, :, 1:], return_dict=True)
        out.loss.backward()
        opt.step()
        opt.clear_grad()
        losses.append(float(out.loss))
    return losses


@needs_op
def test_tiny_llama_fused_rms_norm_matches_plain_training(monkeypatch):
    calls = []
    real = fused_ln.fused_rms_norm

    def counting(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(fused_ln, "fused_rms_norm", counting)
    plain = tiny_llama_losses(use_fused=False)
    assert not calls
    fused = tiny_llama_losses(use_fused=True)
    assert calls  # paddlenlp took the fused_ln path
    assert plain[-1] < plain[0]  # it trains
    np.testing.assert_allclose(fused, plain, rtol=0, atol=1e-5)


def test_problem_is_none_or_names_build_command():
    assert PROBLEM is None or "external_ops/setup.py install" in PROBLEM


def test_problem_reports_missing_module():
    msg = module_problem("fused_ln_not_installed_anywhere")
    assert "not installed" in msg and "external_ops/setup.py install" in msg


def test_problem_reports_plain_folder(tmp_path, monkeypatch):
    # A folder without __init__.py only wins when no real op is installed.
    (tmp_path / "fused_ln_fake_op").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    msg = module_problem("fused_ln_fake_op")
    assert "plain folder" in msg and "external_ops/setup.py install" in msg


@pytest.mark.parametrize("layout", ["package", "file"])
def test_problem_reports_local_shadow(tmp_path, monkeypatch, layout):
    if layout == "package":
        (tmp_path / "fused_ln").mkdir()
        (tmp_path / "fused_ln" / "__init__.py").write_text("")
    else:
        (tmp_path / "fused_ln.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fused_ln", raising=False)
    importlib.invalidate_caches()
    msg = fused_ln_problem()
    assert msg is not None and "shadows" in msg and "external_ops/setup.py install" in msg
    assert "fused_ln" not in sys.modules  # the shadowing module was never imported
