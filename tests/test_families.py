"""Every family's CPU demo config trains through run_pretrain.py with falling loss; GPT's loss is plain CE."""

import glob
import json
import os

import numpy as np
import paddle
import pytest
from conftest import REPO, load_script, resolve_plan
from tiny_run import SHORT_DEMO_RUN

from pretrain.model import build_model
from pretrain.param_count import count_config_parameters
from pretrain.registry import FAMILIES, IMPLEMENTATIONS, find_model_size

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

DEMOS = sorted(glob.glob(os.path.join(REPO, "config", "*", "pretrain_demo_cpu.json")))
STEPS = 8
SHORT_RUN = ("--max_steps", str(STEPS), *SHORT_DEMO_RUN)


def test_every_family_has_a_demo():
    assert {os.path.basename(os.path.dirname(path)) for path in DEMOS} == set(FAMILIES)


@pytest.mark.slow
@pytest.mark.parametrize("path", DEMOS, ids=lambda path: os.path.basename(os.path.dirname(path)))
def test_demo_trains_with_falling_loss(path, tmp_path, demo_dir):
    argv = [path, "--output_dir", str(tmp_path), "--data_cache", str(tmp_path / "cache"), *SHORT_RUN]
    summary = load_script("run_pretrain.py").main(argv)
    with open(tmp_path / "run_summary.json") as f:
        assert json.load(f) == summary
    assert summary["global_step"] == STEPS
    assert summary["train_loss_last"] < summary["train_loss_first"] - 0.5
    plan = resolve_plan([path, *SHORT_RUN])
    assert summary["vocab_size"] == plan.model_config.vocab_size
    assert summary["num_params"] == count_config_parameters(plan.model_config)[0]


def test_gpt_loss_is_mean_cross_entropy_over_every_token(tmp_path):
    """GPTConfig's default ignore_index=0 would drop label 0 from the loss; ours counts every label."""
    path = os.path.join(REPO, "config", "gpt3", "pretrain_demo_cpu.json")
    paddle.seed(0)
    model = build_model(resolve_plan([path, "--output_dir", str(tmp_path)]))
    model.eval()  # no dropout
    labels = np.random.default_rng(0).integers(0, 8000, size=(2, 32))
    labels[:, ::4] = 0  # a quarter of the labels are token 0
    input_ids = paddle.to_tensor(np.roll(labels, 1, axis=1))
    loss, logits = model(input_ids, labels=paddle.to_tensor(labels))[:2]
    expected = paddle.nn.functional.cross_entropy(
        logits.reshape([-1, logits.shape[-1]]), paddle.to_tensor(labels.reshape([-1]))
    )
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)


def test_mistral_is_llama_with_sliding_window_off(tmp_path):
    """docs/models.md's worked example of adding a family: Mistral 7B is a registry family on paddlenlp's
    LLaMA classes (GQA, no sliding window: every position attends to the whole prefix), at its published
    size, with its own tokenizer from data/tokenizers/mistral."""
    arch = find_model_size("mistralai/Mistral-7B-v0.1")
    config = arch.model_config()
    assert arch.name == "mistral-7b" and arch.implementation is IMPLEMENTATIONS["llama"]
    assert (config.num_key_value_heads, config.intermediate_size, config.vocab_size) == (8, 14336, 32000)
    assert getattr(config, "sliding_window", None) is None
    assert count_config_parameters(config)[0] == 7_241_732_096  # the checkpoint's 14,483,464,192 bf16 bytes / 2

    demo = os.path.join(REPO, "config", "mistral", "pretrain_demo_cpu.json")
    tokenizer = os.path.join(REPO, "data", "tokenizers", "mistral")
    plan = resolve_plan([demo, "--tokenizer_name_or_path", tokenizer, "--output_dir", str(tmp_path)])
    assert type(plan.model_config).__name__ == "LlamaConfig" and plan.model_config.vocab_size == 32000
    paddle.seed(0)
    model = build_model(plan)
    model.eval()
    ids = np.random.default_rng(0).integers(3, 32000, size=(1, 96))
    changed = ids.copy()
    changed[0, 0] += 1  # the first token only
    last = [model(paddle.to_tensor(x))[0][0, -1] for x in (ids, changed)]
    assert float((last[0] - last[1]).abs().max()) > 1e-6  # the last position still sees the first token


@pytest.mark.parametrize("path", DEMOS, ids=lambda path: os.path.basename(os.path.dirname(path)))
def test_weight_decay_reaches_every_matrix_and_no_norm_or_bias(path):
    """``weight_decay_rule``: every parameter of two or more dimensions decays, and no 1-D one (norm weights,
    biases, DeepSeek-V3's routing biases), as Megatron-LM's default rule. Before it, paddlenlp's name rule decayed
    Qwen's RMSNorm weights (``qwen.h.0.ln_1.weight``, ..., ``qwen.ln_f.weight``: no "norm" in their path)."""
    from pretrain.model import weight_decay_rule

    model = build_model(resolve_plan([path, "--num_hidden_layers", "2", "--output_dir", "unused"]))
    decays = weight_decay_rule(model)
    wrong = [name for name, p in model.named_parameters() if decays(p.name) != (len(p.shape) >= 2)]
    assert not wrong, wrong
