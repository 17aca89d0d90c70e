"""pretrain.compat.moe: on the pinned paddle, paddlenlp 3.0.0b4's MoE models compute what they compute
unpatched on paddle 3.0.0 (tests/golden/moe_paddle300.json, written there by tools/moe_golden.py)."""

import json
import os

import paddle
import pytest
from conftest import REPO, load_script, run_script

from pretrain.compat import moe as moe_compat

with open(os.path.join(REPO, "tests", "golden", "moe_paddle300.json"), encoding="utf-8") as f:
    GOLDEN = json.load(f)


def test_golden_comes_from_paddle_300_unpatched():
    assert (GOLDEN["paddle"], GOLDEN["paddlenlp"], GOLDEN["produced_by"]) == ("3.0.0", "3.0.0b4", "tools/moe_golden.py")


@pytest.mark.parametrize("family", sorted(GOLDEN["families"]))
def test_patched_forward_and_backward_equal_paddle_300(family):
    moe_compat.apply()
    got = load_script("tools/moe_golden.py").tiny_moe_outputs(family)
    want = GOLDEN["families"][family]
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)
    assert got["logits"] == [pytest.approx(row, abs=1e-6) for row in want["logits"]]
    assert set(got["grad_norms"]) == set(want["grad_norms"])  # every parameter gets a gradient, as on 3.0.0
    for name, norm in want["grad_norms"].items():
        assert got["grad_norms"][name] == pytest.approx(norm, rel=1e-5, abs=1e-9), name


@pytest.mark.slow  # a fresh process: paddle and paddlenlp imported again (~20 s under load)
@pytest.mark.skipif(not paddle.__version__.startswith("3.3"), reason="the breakage is paddle 3.3's")
def test_unpatched_upstream_fails_on_paddle_33(tmp_path):
    """What the fixes are for: without them (a fresh process, no --patched) the first MoE forward raises."""
    result = run_script("tools/moe_golden.py", "--output", str(tmp_path / "out.json"), timeout=300)
    assert result.returncode != 0 and not (tmp_path / "out.json").exists()
    assert "Type promotion only support calculations between floating-point numbers" in result.stderr


def test_qwen2_moe_routers_start_random_where_paddlenlp_leaves_them_constant(tmp_path):
    """Qwen2MoeGate's weight is Constant(1.0) as paddlenlp builds it; from scratch ours are normal(0, 0.02)."""
    from conftest import resolve_plan
    from paddlenlp.transformers import Qwen2MoeForCausalLM

    from pretrain.model import build_model

    plan = resolve_plan(
        [os.path.join(REPO, "config", "qwen2_moe", "pretrain_demo_cpu.json"), "--output_dir", str(tmp_path)]
    )
    upstream = Qwen2MoeForCausalLM(plan.model_config).qwen2_moe.layers[0].mlp.gate.weight.numpy()
    assert (upstream == 1.0).all()
    routers = [layer.mlp.gate.weight.numpy() for layer in build_model(plan).qwen2_moe.layers]
    assert all(abs(w.mean()) < 0.002 and abs(w.std() - plan.model_config.initializer_range) < 0.002 for w in routers)
