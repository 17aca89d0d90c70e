"""Expert parallelism on CPU processes: Qwen2-MoE with its experts spread over 2 ranks (paddlenlp's
``MoELayer`` all-to-all through ``pretrain.cpu_comm``) equals the same 2 ranks with every expert on each
(data parallel), and, with the load-balancing coefficient 0, one process (also beside sharding stage1),
from the same initial weights and batches: losses, the first step's gradients and the final weights;
and preflight's lines about it.

With the published coefficient a run differs from one process by design: the load-balancing loss is
computed on each rank's tokens (docs/models.md, "Expert parallelism")."""

import json
import os
import shutil

import pytest
from conftest import REPO, fixture_folder, resolve_plan
from gradient_dump_run import rank_gradients
from parallel_golden import (
    LAYOUTS,
    SCALAR_BYTES,
    STEPS,
    assert_golden_weights,
    final_weights,
    gradient_differences,
    initial_weights,
    launch,
    losses,
    planned_communication,
    relative_differences,
)
from test_parallel_layouts import LOSS_RTOL
from tiny_run import spike_norm_figures

from pretrain.layout import simulated_launch
from pretrain.metrics.comm_volume import read_volume
from pretrain.planner.experts import ALL_TO_ALLS_PER_LAYER
from pretrain.preflight import check_expert_parallel, check_experts, warn_run
from pretrain.registry import find_model_size

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

DEMO = "config/qwen2_moe/pretrain_demo_cpu.json"
GRADIENT_RTOL = 1e-6  # each tensor's largest difference over its largest |gradient|; measured up to 5.0e-7
# {run: (layout, load-balancing coefficient 0?)}: DP2 and EP2 with the published coefficient, the rest with 0
RUNS = {
    "DP2": ("DP2", False),
    "EP2": ("EP2", False),
    "1 process aux 0": ("1 process", True),
    "EP2 aux 0": ("EP2", True),
    "EP2xSH2 stage1 aux 0": ("EP2xSH2 stage1", True),
}


@pytest.fixture(scope="module")
def expert_runs(request, tmp_path_factory, demo_dir):
    """{run: output_dir} of ``RUNS``: a 2-layer Qwen2-MoE (4 experts, top-2) from the same initial
    weights, each step's gradients saved (tests/gradient_dump_run.py)."""
    root = fixture_folder(request, tmp_path_factory, "experts")
    weights = initial_weights(f"{root}/init", "qwen2_moe", 2)
    no_aux = shutil.copytree(weights, f"{root}/init_aux0")
    with open(f"{no_aux}/config.json") as f:
        config = json.load(f)
    with open(f"{no_aux}/config.json", "w") as f:
        json.dump({**config, "router_aux_loss_coef": 0.0}, f)
    script = f"{REPO}/tests/gradient_dump_run.py"
    save = ("--save_steps", str(STEPS))  # checkpoint-4's recovery.json: the spike detector's gradient norms
    return {
        run: launch(
            root, run.replace(" ", "_"), no_aux if aux0 else weights, "qwen2_moe", 2, layout, *save, script=script
        )
        for run, (layout, aux0) in RUNS.items()
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    "reference, run", [("DP2", "EP2"), ("1 process aux 0", "EP2 aux 0"), ("1 process aux 0", "EP2xSH2 stage1 aux 0")]
)
def test_expert_parallel_equals_data_parallel_and_one_process(expert_runs, reference, run):
    """Losses of every step within LOSS_RTOL; the first step's gradients (same weights everywhere: later
    steps' start from weights AdamW has moved apart by float32 rounding) within GRADIENT_RTOL, every
    expert's and replicated weight's, gathered from the rank that updates it; the final
    weights, every element (``assert_golden_weights``)."""
    expected, got = losses(expert_runs[reference]), losses(expert_runs[run])
    assert expected[-1] < expected[0]  # it trains
    assert max(relative_differences(expected, got)) <= LOSS_RTOL, (expected, got)
    differences = gradient_differences(rank_gradients(expert_runs[reference], 1), rank_gradients(expert_runs[run], 1))
    assert len([name for name in differences if ".mlp.experts." in name]) == 2 * 4 * 3  # both layers' experts
    worst = max(differences, key=differences.get)
    assert differences[worst] <= GRADIENT_RTOL, (worst, differences[worst])
    reference_weights = final_weights(expert_runs[reference])
    assert len([name for name in reference_weights if ".mlp.experts." in name]) == 2 * 4 * 3  # merged from ranks
    worst = assert_golden_weights(run, reference_weights, final_weights(expert_runs[run]))
    print(f"{run} against {reference}: weights, worst: {worst}")


@pytest.mark.slow
@pytest.mark.parametrize(
    "reference, run", [("DP2", "EP2"), ("1 process aux 0", "EP2 aux 0"), ("1 process aux 0", "EP2xSH2 stage1 aux 0")]
)
def test_the_spike_detector_judges_the_clipped_norm_under_expert_parallelism(expert_runs, reference, run):
    """The gradient norms the detector kept (largest, smallest, moving average over steps 1-4) equal the run
    without expert parallelism's within 1e-6. Before, each rank summed its own experts only: 0.998-0.999 x."""
    figures = {name: spike_norm_figures(expert_runs[name], STEPS) for name in (reference, run)}
    assert figures[run] == pytest.approx(figures[reference], rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("run, layout", [("EP2", "EP2"), ("EP2xSH2 stage1 aux 0", "EP2xSH2 stage1")])
def test_the_planner_expert_parallel_communication_is_what_each_rank_counted(expert_runs, run, layout):
    """What each rank's collectives moved in the last step (``pretrain.metrics.comm_volume``) against the
    planner (``parallel_golden.planned_communication``): 4 all-to-alls per MoE layer per micro-batch, each of
    experts x capacity x hidden float32 with the capacity the busiest expert's tokens (paddlenlp's dropless
    dispatch), so between the planner's payload at routing imbalance 1 (balanced) and at experts / top-k (an
    expert takes every token); every gradient but this rank's experts' all-reduced over the data-parallel
    ranks once a step, and under sharding stage1 every gradient reduced to its owner and every parameter
    broadcast, to the byte (up to SCALAR_BYTES of routing loads and flags). EP2's all-reduce runs on paddle's
    default group (paddlenlp passes no group), which the counter names ``world``."""
    output_dir = expert_runs[run]
    root, name = os.path.split(output_dir)
    weights = f"{root}/init_aux0" if run.endswith("aux 0") else f"{root}/init"
    (planned,), numel = planned_communication(root, name, weights, "qwen2_moe", 2, layout)
    balanced = planned.pop("ep")["all_to_all"]
    with open(f"{weights}/config.json") as f:
        config = json.load(f)
    experts, top_k, layers = config["num_experts"], config["num_experts_per_tok"], config["num_hidden_layers"]
    ranks, arguments = LAYOUTS[layout][:2]
    micro_batches = int(arguments[arguments.index("--gradient_accumulation_steps") + 1])
    gradients = planned.pop("dp")["all_reduce"]
    for rank in range(ranks):
        record = read_volume(output_dir, rank)
        assert record["parameter_numel"] == numel[0]
        last = record["steps"][-1]
        assert last["calls"]["dp"]["all_to_all"] == layers * ALL_TO_ALLS_PER_LAYER * micro_batches
        assert balanced <= last["bytes"]["dp"]["all_to_all"] <= balanced * experts / top_k
        reduced = last["bytes"]["world" if ranks == 2 else "dp"]["all_reduce"]
        assert 0 <= reduced - gradients <= SCALAR_BYTES, (reduced, gradients)
        assert last["bytes"].get("sharding", {}).keys() - {"all_reduce"} == planned.get("sharding", {}).keys()
        for collective, nbytes in planned.get("sharding", {}).items():
            assert last["bytes"]["sharding"][collective] == nbytes


@pytest.mark.slow
def test_deepseek_v3_expert_parallel_with_bias_balancing_equals_one_process(tmp_path, demo_dir):
    """DeepSeek-V3 (MLA, a dense layer then DeepSeekMoE: 8 routed experts in 4 groups, top-2, a shared expert,
    sigmoid scores with routing biases), its sequence-wise loss off (aux_loss_alpha 0: each rank's own by
    design), in EP2 equals 1 process at the same global batch: losses within LOSS_RTOL and every weight, the
    routing biases included, within the golden tolerance. The biases moved (pretrain.bias_balancing), by the
    loads of the whole global batch: a rank moving them by its own tokens' loads would differ."""
    root = str(tmp_path)
    weights = initial_weights(f"{root}/init", "deepseek_v3", 2)
    with open(f"{weights}/config.json") as f:
        config = json.load(f)
    with open(f"{weights}/config.json", "w") as f:
        json.dump({**config, "aux_loss_alpha": 0.0}, f)
    single, spread = (launch(root, name, weights, "deepseek_v3", 2, name) for name in ("1 process", "EP2"))
    assert max(relative_differences(losses(single), losses(spread))) <= LOSS_RTOL
    reference = final_weights(single)
    # merged from ranks: the experts of layer 1 and of the multi-token-prediction module's layer 2
    assert len([name for name in final_weights(spread) if ".mlp.experts." in name]) == 2 * 8 * 3
    biases = [name for name in reference if name.endswith("e_score_correction_bias")]
    assert biases and all(abs(reference[name]).max() > 0 for name in biases)  # balancing ran
    print(f"DeepSeek-V3 EP2: weights, worst: {assert_golden_weights('EP2', reference, final_weights(spread))}")


@pytest.mark.slow
def test_qwen3_moe_expert_parallel_equals_one_process(tmp_path, demo_dir):
    """Qwen3-MoE (pretrain.models.qwen3_moe: paddlenlp's MoELayer without a shared expert, top-2 of 8 experts
    renormalised, layer 1 dense) with its experts spread over 2 ranks equals 1 process at the same global
    batch, its load-balancing coefficient 0 (each rank's own by design): losses within LOSS_RTOL, every weight,
    the experts merged from both ranks, within the golden tolerance."""
    root = str(tmp_path)
    weights = initial_weights(f"{root}/init", "qwen3_moe", 2)
    with open(f"{weights}/config.json") as f:
        config = json.load(f)
    with open(f"{weights}/config.json", "w") as f:
        json.dump({**config, "router_aux_loss_coef": 0.0}, f)
    single, spread = (launch(root, name, weights, "qwen3_moe", 2, name) for name in ("1 process", "EP2"))
    assert losses(single)[-1] < losses(single)[0]
    assert max(relative_differences(losses(single), losses(spread))) <= LOSS_RTOL, (losses(single), losses(spread))
    reference = final_weights(single)
    assert len([name for name in final_weights(spread) if ".mlp.experts." in name]) == 8 * 3  # layer 0's, merged
    print(f"Qwen3-MoE EP2: weights, worst: {assert_golden_weights('EP2', reference, final_weights(spread))}")


def _plan(cards: int, *extra: str):
    with simulated_launch(1, cards):
        return resolve_plan([DEMO, "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "2", *extra])


@pytest.mark.parametrize(
    "extra, expected",
    [
        (("--use_expert_parallel", "true", "--unified_checkpoint", "true"), None),
        (("--use_expert_parallel", "true", "--sharding", "stage1", "--sharding_parallel_degree", "2"), None),
        (
            ("--use_expert_parallel", "true", "--sharding", "stage2", "--sharding_parallel_degree", "2"),
            "use_expert_parallel: verified beside data parallelism and sharding stage1, not with TP1PP1SH2SP2DP2",
        ),
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
    ids=["EP2", "EP2xSH2 stage1", "EP2xSH2 stage2", "spread but not said", "no fleet groups", "mixtral", "dense"],
)
def test_preflight_on_expert_parallel(extra, expected):
    problems = check_expert_parallel(_plan(4 if "--sharding" in extra else 2, *extra))
    assert problems == ([] if expected is None else [problems[0]]) and (expected is None or expected in problems[0])


def test_expert_parallel_over_sharding_alone_is_refused():
    """Found by the support matrix (DeepSeek-V3, sharding stage1 x 2, use_expert_parallel): 4 steps trained, then
    the final save failed, ``ValueError: 'model-00001-of-00001.safetensors' is not in list`` (paddlenlp's
    ``rename_shard_file`` gathers shard names over the tensor, pipeline and data groups, all of 1 rank)."""
    extra = ("--use_expert_parallel", "true", "--sharding", "stage1", "--sharding_parallel_degree", "2")
    (problem,) = check_expert_parallel(_plan(2, *extra))
    assert problem.startswith("use_expert_parallel: 2 ranks with 1 data-parallel rank leave every expert on every")
    assert "rename_shard_file" in problem


def test_a_from_scratch_expert_parallel_run_is_told_its_initial_weights_differ():
    """Measured 2026-11-28: the Qwen2-MoE demo for 1 step at learning rate 0, EP2 (unified_checkpoint) and one
    process, seed 42 both: every tensor of the saved weights differed, the embedding included, and rank 1's
    experts differed from rank 0's. Before issue 42 item 11 no line said so; one process gets no such line."""
    (line,) = [
        w
        for w in warn_run(_plan(2, "--use_expert_parallel", "true", "--unified_checkpoint", "true"))
        if w.startswith("use_expert_parallel:")
    ]
    assert line.startswith("use_expert_parallel: from scratch, the 2 ranks start from other weights than one process")
    assert "builds only its 2 experts per MoE layer" in line and "continue_training true" in line
    assert not [w for w in warn_run(_plan(1, "--use_expert_parallel", "true")) if w.startswith("use_expert_parallel")]


def test_preflight_deepseek_experts_top_k_and_topk_method():
    """DeepSeek-V2 names its experts n_routed_experts; DeepseekV2Config's default topk_method "gready" (sic)
    matches no branch of paddlenlp's gate."""
    config = find_model_size("deepseek_v2-debug").model_config()
    assert check_experts(config, "deepseek_v2-debug") == []
    config.num_experts_per_tok = 5
    assert check_experts(config, "x") == [
        "num_experts_per_tok: 5 in the model config of x is outside [1, n_routed_experts 4]; each token goes to 1 "
        "to 4 experts"
    ]
    config.num_experts_per_tok, config.topk_method = 2, "gready"
    assert check_experts(config, "x") == [
        "topk_method: 'gready' in the model config of x is not one paddlenlp's gate computes (moe_gate.topkgating "
        "would fail); use 'greedy' or 'group_limited_greedy'"
    ]


def test_preflight_experts_divide_and_top_k():
    plan = _plan(2, "--use_expert_parallel", "true", "--unified_checkpoint", "true")
    plan.model_config.num_experts, plan.model_config.num_experts_per_tok = 3, 4
    assert check_experts(plan.model_config, "qwen2_moe-debug") == [
        "num_experts_per_tok: 4 in the model config of qwen2_moe-debug is outside [1, num_experts 3]; each token "
        "goes to 1 to 3 experts"
    ]
    ernie = find_model_size("ernie-4.5-moe-debug").model_config()
    ernie.moe_k = 9  # ERNIE-4.5's own key (num_experts_per_tok reads it through the config's alias)
    assert check_experts(ernie, "ernie-4.5-moe-debug") == [
        "moe_k: 9 in the model config of ernie-4.5-moe-debug is outside [1, moe_num_experts 8]; each token "
        "goes to 1 to 8 experts"
    ]
    assert check_expert_parallel(plan) == [
        "use_expert_parallel: the 3 experts do not divide over the 2 data-parallel ranks (paddlenlp's "
        "expert-parallel degree is the data-parallel degree); launch a number of ranks that divides 3",
    ]
