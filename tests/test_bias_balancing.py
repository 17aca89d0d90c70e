"""DeepSeek-V3's auxiliary-loss-free balancing (pretrain.bias_balancing) in a real run: the debug DeepSeek-V3
(8 experts in 4 groups, top-2) starts with a routing bias that sends every token to experts 0 and 1, its weights
frozen (learning rate 0) so that only the biases move; after each step every bias moved by exactly
rate x sign(mean load - load) of the loads the run logged, the checkpoint holds the biases of its step, and the
routing evens out. Preflight refuses a rate for a model without routing biases."""

import json
import os
import re

import numpy as np
import paddle
import pytest
from conftest import fixture_folder, resolve_plan
from tiny_run import final_weights, python_script, run

from pretrain.bias_balancing import BIAS
from pretrain.preflight import check_bias_balancing

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

CONFIG = "config/deepseek_v3/pretrain_demo_cpu.json"
RATE, STEPS, FORCED = 0.05, 10, 0.5  # the forced bias of experts 0 and 1: above the scores' spread at init
SHAPE = ("--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2", "--max_seq_length", "128")
TOKENS = 2 * 2 * 128  # a step's tokens


@pytest.fixture(scope="module")
def balanced_run(request, tmp_path_factory, demo_dir):
    """(initial biases [layers, experts], output_dir) of a STEPS-step run from a model biased toward experts 0, 1."""
    root = fixture_folder(request, tmp_path_factory, "bias_balancing")
    from pretrain.model import build_model

    model = build_model(resolve_plan([CONFIG, "--output_dir", f"{root}/plan"]))
    biases = [p for name, p in model.named_parameters() if name.endswith(BIAS)]
    for bias in biases:
        bias.set_value(paddle.to_tensor([FORCED, FORCED] + [0.0] * (bias.shape[0] - 2), dtype="float32"))
    model.save_pretrained(f"{root}/init")
    out = f"{root}/run"
    argv = [CONFIG, "--model_name_or_path", f"{root}/init", "--continue_training", "true", *SHAPE]
    argv += ["--output_dir", out, "--data_cache", f"{root}/cache", "--max_steps", str(STEPS), "--logging_steps", "1"]
    argv += ["--learning_rate", "0", "--min_learning_rate", "0", "--warmup_steps", "0", "--do_eval", "false"]
    argv += ["--save_steps", "4", "--moe_bias_update_rate", str(RATE)]
    assert run(python_script(*argv), log_path=f"{root}/run.log", timeout=600) == 0, (
        f"the run failed; see {root}/run.log"
    )
    return np.stack([b.numpy() for b in biases]), out


def _records(out: str) -> list:
    with open(os.path.join(out, "run_summary.json"), encoding="utf-8") as f:
        routing = json.load(f)["routing"]
    assert routing["bias_update_rate"] == RATE
    return routing["records"]


def _biases(weights: dict) -> np.ndarray:
    return np.stack([value for name, value in sorted(weights.items()) if name.endswith(BIAS)])


def _expected(initial: np.ndarray, records: list, steps: int) -> np.ndarray:
    """The biases after ``steps`` steps, float32 as the run adds them, from each step's logged loads."""
    biases = initial.astype("float32").copy()
    for record in records[:steps]:
        loads = np.rint(np.asarray(record["expert_share"]) * TOKENS)  # shares are logged to 4 decimals: 1/512 apart
        underloaded = np.sign(loads.mean(axis=1, keepdims=True) - loads)  # the report's rule, written out here
        biases += (underloaded * np.float32(RATE)).astype("float32")
    return biases


def test_each_step_moves_the_biases_by_the_rate_toward_the_logged_balance(balanced_run):
    initial, out = balanced_run
    records = _records(out)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    np.testing.assert_array_equal(_biases(final_weights(out)), _expected(initial, records, STEPS))
    checkpoint = paddle.load(os.path.join(out, "checkpoint-4", "model_state.pdparams"))
    halfway = {name: value.numpy() for name, value in checkpoint.items()}
    np.testing.assert_array_equal(_biases(halfway), _expected(initial, records, 4))


def test_each_record_shows_the_biases_of_its_step(balanced_run):
    """Each routing record holds every layer's smallest and largest routing bias after its step's update, and the
    log line their widest spread. Before issue 42 item 10 the records held no bias: the balancing ran unseen."""
    initial, out = balanced_run
    records = _records(out)
    for step, record in enumerate(records, start=1):
        biases = _expected(initial, records, step)
        assert record["bias_min"] == biases.min(axis=1).tolist() and record["bias_max"] == biases.max(axis=1).tolist()
    with open(os.path.join(os.path.dirname(out), "run.log"), encoding="utf-8") as f:
        spreads = [float(s) for s in re.findall(r", bias spread ([\d.e+-]+) \|", f.read())]
    widest = [float(np.ptp(_expected(initial, records, step), axis=1).max()) for step in range(1, STEPS + 1)]
    assert spreads == pytest.approx(widest, rel=1e-3)  # printed to 4 digits


def test_the_forced_imbalance_evens_out(balanced_run):
    """Step 1 routes every token to experts 0 and 1 (imbalance E/k = 4, the most top-2 of 8 allows); the biases
    alone, the weights frozen, bring the worst layer's imbalance to a mean below 2.5 over the last 5 steps
    (measured: 4.0, 4.0, 3.98, 3.78, 3.05, then 1.84, 2.45, 1.83, 2.47, 1.61)."""
    imbalance = [max(record["imbalance"]) for record in _records(balanced_run[1])]
    print(f"imbalance per step: {imbalance}")
    assert imbalance[0] == 4.0
    assert np.mean(imbalance[-5:]) < 2.5, imbalance


def test_preflight_refuses_a_rate_without_routing_biases():
    plan = resolve_plan(["config/qwen2_moe/pretrain_demo_cpu.json", "--moe_bias_update_rate", "0.001"])
    assert check_bias_balancing(plan.model_config, plan.training_args) == [
        "moe_bias_update_rate: 0.001 moves routing biases, which only a DeepSeek-V3 gate (topk_method noaux_tc) has, "
        "not qwen2_moe's; leave it unset"
    ]
    v3 = resolve_plan([CONFIG, "--moe_bias_update_rate", "0.001"])
    assert check_bias_balancing(v3.model_config, v3.training_args) == []
