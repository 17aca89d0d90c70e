"""Expert parallelism on CPU processes: Qwen2-MoE with its experts spread over 2 ranks (paddlenlp's
``MoELayer`` all-to-all through ``pretrain.cpu_comm``) equals the same 2 ranks with every expert on each
(data parallel), from the same initial weights and batches; and preflight's lines about it."""

import json
import shutil

import pytest
from conftest import resolve_plan
from parallel_golden import assert_golden_weights, final_weights, initial_weights, launch, losses, relative_differences
from test_parallel_layouts import LOSS_RTOL

from pretrain.layout import simulated_launch
from pretrain.preflight import check_expert_parallel, check_experts

DEMO = "config/qwen2_moe/pretrain_demo_cpu.json"


@pytest.fixture(scope="module")
def expert_runs(tmp_path_factory, demo_dir):
    """{layout: output_dir} of a 2-layer Qwen2-MoE (4 experts, top-2) in DP2 and EP2, with the published
    load-balancing coefficient and with 0 ("... aux 0")."""
    root = str(tmp_path_factory.mktemp("experts"))
    weights = initial_weights(f"{root}/init", "qwen2_moe", 2)
    no_aux = shutil.copytree(weights, f"{root}/init_aux0")
    with open(f"{no_aux}/config.json") as f:
        config = json.load(f)
    with open(f"{no_aux}/config.json", "w") as f:
        json.dump({**config, "router_aux_loss_coef": 0.0}, f)
    runs = {}
    for layout in ("DP2", "EP2"):
        runs[layout] = launch(root, layout, weights, "qwen2_moe", 2, layout)
        runs[f"{layout} aux 0"] = launch(root, f"{layout}_aux0", no_aux, "qwen2_moe", 2, layout)
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("aux", ["", " aux 0"])
def test_expert_parallel_equals_data_parallel(expert_runs, aux):
    replicated, spread = losses(expert_runs[f"DP2{aux}"]), losses(expert_runs[f"EP2{aux}"])
    assert replicated[-1] != replicated[0]
    assert max(relative_differences(replicated, spread)) <= LOSS_RTOL, (replicated, spread)
    reference = final_weights(expert_runs[f"DP2{aux}"])
    experts = [name for name in reference if ".mlp.experts." in name]
    assert len(experts) == 2 * 4 * 3  # every expert of both layers, merged from both ranks
    worst = assert_golden_weights(f"EP2{aux}", reference, final_weights(expert_runs[f"EP2{aux}"]))
    print(f"EP2{aux}: weights, worst: {worst}")


def _plan(cards: int, *extra: str):
    with simulated_launch(1, cards):
        return resolve_plan([DEMO, "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "2", *extra])


@pytest.mark.parametrize(
    "extra, expected",
    [
        (("--use_expert_parallel", "true", "--unified_checkpoint", "true"), None),
        (("--unified_checkpoint", "true"), "use_expert_parallel: false, but paddlenlp spreads qwen2_moe's experts"),
        (("--use_expert_parallel", "true"), "which a data-parallel run creates only with unified_checkpoint"),
        (
            ("--use_expert_parallel", "true", "--unified_checkpoint", "true", "--model_name_or_path", "mixtral-debug"),
            "MixtralSparseMoeBlock (transformers/mixtral/modeling.py:490) is not its MoELayer",
        ),
        (
            ("--use_expert_parallel", "true", "--model_name_or_path", "llama-debug"),
            "use_expert_parallel: the model has no experts; set it false",
        ),
    ],
    ids=["EP2", "spread but not said", "no fleet groups", "mixtral", "dense"],
)
def test_preflight_on_expert_parallel(extra, expected):
    problems = check_expert_parallel(_plan(2, *extra))
    assert problems == ([] if expected is None else [problems[0]]) and (expected is None or expected in problems[0])


def test_preflight_experts_divide_and_top_k():
    plan = _plan(2, "--use_expert_parallel", "true", "--unified_checkpoint", "true")
    plan.model_config.num_experts, plan.model_config.num_experts_per_tok = 3, 4
    assert check_experts(plan.model_config, "qwen2_moe-debug") == [
        "num_experts_per_tok: 4 in the model config of qwen2_moe-debug is outside [1, num_experts 3]; each token "
        "goes to 1 to 3 experts"
    ]
    assert check_expert_parallel(plan) == [
        "use_expert_parallel: the 3 experts do not divide over the 2 data-parallel ranks (paddlenlp's "
        "expert-parallel degree is the data-parallel degree); launch a number of ranks that divides 3",
    ]
