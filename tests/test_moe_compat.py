"""pretrain.compat.moe: on the pinned paddle, paddlenlp 3.0.0b4's MoE models compute the loss and logits
they compute unpatched on paddle 3.0.0, and the gradients they compute there with the fixes
(tests/golden/moe_paddle300.json, written there by tools/moe_golden.py); the router gradients equal
central differences of the loss."""

import json
import os

import numpy as np
import paddle
import pytest
from conftest import REPO, load_script, run_script

from pretrain.compat import moe as moe_compat

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

with open(os.path.join(REPO, "tests", "golden", "moe_paddle300.json"), encoding="utf-8") as f:
    GOLDEN = json.load(f)


TOP_K_ROUTED = ("deepseek_v2", "qwen2_moe")  # route with moe_gate.topkgating, whose mask fix 3 detaches
ROUTERS = (".mlp.gate.weight", ".block_sparse_moe.gate.weight")  # [hidden, experts], per MoE layer


def test_golden_comes_from_paddle_300():
    assert (GOLDEN["paddle"], GOLDEN["paddlenlp"], GOLDEN["produced_by"]) == ("3.0.0", "3.0.0b4", "tools/moe_golden.py")


@pytest.mark.parametrize("family", sorted(GOLDEN["patched"]))
def test_on_paddle_300_the_fixes_change_only_the_top_k_routed_gradients(family):
    """Fixes 1 and 2 compute what paddle 3.0.0 computed; fix 3 (the detached dispatch mask) changes the
    gradients of every weight at or below a top-k router, and nothing of Mixtral."""
    unpatched, patched = GOLDEN["unpatched"][family], GOLDEN["patched"][family]
    assert (patched["loss"], patched["logits"]) == (unpatched["loss"], unpatched["logits"])
    changed = [name for name, norm in patched["grad_norms"].items() if norm != unpatched["grad_norms"][name]]
    assert any(".embed_tokens." in name for name in changed) == (family in TOP_K_ROUTED), changed


@pytest.mark.parametrize("family", sorted(GOLDEN["patched"]))
def test_patched_forward_and_backward_equal_paddle_300(family):
    moe_compat.apply()
    got = load_script("tools/moe_golden.py").tiny_moe_outputs(family)
    want = GOLDEN["patched"][family]
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)
    assert got["logits"] == [pytest.approx(row, abs=1e-6) for row in want["logits"]]
    assert set(got["grad_norms"]) == set(want["grad_norms"])  # every parameter gets a gradient, as on 3.0.0
    for name, norm in want["grad_norms"].items():
        assert got["grad_norms"][name] == pytest.approx(norm, rel=1e-5, abs=1e-9), name


@pytest.mark.parametrize("family", sorted(GOLDEN["patched"]))
def test_router_gradients_equal_central_differences(family):
    """The loss's derivative along its own gradient (the routers' weights, moved together by eps times the
    unit gradient) equals |gradient| (measured within 0.5%; a larger eps flips Mixtral's routing of a token).
    Without fix 3 Qwen2-MoE's is 62.7 where central differences give 0.045."""
    moe_compat.apply()
    model, tokens = load_script("tools/moe_golden.py").tiny_moe(family)
    routers = [param for name, param in model.named_parameters() if name.endswith(ROUTERS)]
    assert len(routers) == (1 if family == "deepseek_v2" else 2)  # DeepSeek-V2's first layer is dense

    def loss():
        return model(input_ids=tokens[:, :-1], labels=tokens[:, 1:], return_dict=False)[0]

    loss().backward()
    gradients = [router.grad.numpy().astype(np.float64) for router in routers]
    norm = np.sqrt(sum((g**2).sum() for g in gradients))
    eps, start = 3e-4, [router.numpy() for router in routers]

    def moved(step):
        with paddle.no_grad():
            for router, weight, gradient in zip(routers, start, gradients):
                router.set_value((weight + step * gradient / norm).astype("float32"))
            return float(loss())

    derivative = (moved(eps) - moved(-eps)) / (2 * eps)
    assert derivative == pytest.approx(norm, rel=2e-2), (derivative, norm)


@pytest.mark.slow  # a fresh process: paddle and paddlenlp imported again (~20 s under load)
@pytest.mark.skipif(not paddle.__version__.startswith("3.3"), reason="the breakage is paddle 3.3's")
def test_unpatched_upstream_fails_on_paddle_33(tmp_path):
    """What fixes 1 and 2 are for: without them (a fresh process) the first MoE forward raises."""
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


def test_an_expert_no_token_chose_gets_a_zero_gradient():
    """Fix 7 for Mixtral: paddlenlp's block skips an expert no token of the micro-batch chose, so its weights got
    no gradient (None) and sharding stage2 never reduced the gradient bucket holding them (the owner stepped on
    its own share of every gradient in it); now they get the zero gradient the loss has for them, and the loss
    and the other gradients are what they were."""
    moe_compat.apply()
    model, tokens = load_script("tools/moe_golden.py").tiny_moe("mixtral")
    model.train()
    never = paddle.to_tensor([0.0, 0.0, 0.0, -1e9])  # expert 3 of 4 is never among a token's top-2
    for layer in model.mixtral.layers:
        layer.block_sparse_moe.gate.register_forward_post_hook(lambda _, inputs, logits: logits + never)
    loss = model(input_ids=tokens[:, :-1], labels=tokens[:, 1:])[0]
    loss.backward()
    for layer in model.mixtral.layers:
        unchosen, chosen = layer.block_sparse_moe.experts[3], layer.block_sparse_moe.experts[0]
        for weight in unchosen.parameters():
            assert weight.grad is not None and not weight.grad.numpy().any()
        assert all(weight.grad.numpy().any() for weight in chosen.parameters())
