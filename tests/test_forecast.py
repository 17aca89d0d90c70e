"""The forecast (tools/plan.py): every shipped GPU config plans for its cluster on this CPU machine;
bad layouts are one-line errors naming the key; the JSON carries what scripts read."""

import glob
import json
import os

import pytest
from conftest import REPO, load_script, run_script

from pretrain import forecast
from pretrain.errors import UserError
from pretrain.forecast import rate_text, resolve_for_cluster

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

GPU_CONFIGS = sorted(
    glob.glob(os.path.join(REPO, "config", "benchmarks", "*.json"))
    + glob.glob(os.path.join(REPO, "config", "*", "pretrain_argument*.json"))
)
JSON_KEYS = {
    "layout",
    "global_batch_size",
    "seq_length",
    "params_per_card",
    "tokens_per_card_per_sec",
    "mfu",
    "memory_gib",
    "memory_breakdown",
    "fits",
}


def published_batch_tokens(name: str) -> int:
    """FlagPerf's global batches: LLaMA 4M tokens, GPT-3 2M; Megatron-DeepSpeed Llama-2-7B 64 x 4096 (GAS 32)."""
    if "gas32" in name:
        return 64 * 4096
    return 2 * 2**20 if name.startswith("gpt3") else 4 * 2**20


def plan(*argv):
    return load_script("tools/plan.py").main(list(argv))


# Mixtral-8x7B's model states alone (46.7B parameters x 18 bytes: 783 GiB) and Qwen3-30B-A3B's (549 GB) exceed
# 8 x 80 GiB, which the planner refuses in one line; their recipes are for 8 x H200 (docs/gpu.md)
CARD_OF = {
    os.path.join(REPO, "config", family, "pretrain_argument.json"): "H200 SXM" for family in ("mixtral", "qwen3_moe")
}


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=lambda path: os.path.relpath(path, REPO))
def test_every_gpu_config_plans_on_8_a100s(path, capsys):
    result = plan(path, "--nnodes", "1", "--nproc_per_node", "8", "--gpu", CARD_OF.get(path, "A100-SXM4-80GB"))
    assert JSON_KEYS <= set(result)
    layout = result["layout"]
    degrees = ("tensor_parallel_degree", "pipeline_parallel_degree", "sharding_parallel_degree", "data_parallel_degree")
    assert (
        layout["world_size"] == 8 == layout[degrees[0]] * layout[degrees[1]] * layout[degrees[2]] * layout[degrees[3]]
    )
    assert len(result["memory_gib"]) == layout["pipeline_parallel_degree"]
    assert 0 < result["mfu"] < 1 and result["tokens_per_card_per_sec"] > 0
    name = os.path.basename(path)
    if os.sep + "benchmarks" + os.sep in path:
        assert result["global_batch_size"] * result["seq_length"] == published_batch_tokens(name)
        if "80G" in name:
            assert result["fits"]  # the published runs ran on these cards
    assert "preflight passed" in capsys.readouterr().out


def test_json_is_the_last_line_of_stdout(capsys):
    path = os.path.join(REPO, "config", "benchmarks", "llama-7b_TP2PP4SH1SP1_A100-80Gx1x8.json")
    result = plan(path, "--json")
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == json.loads(json.dumps(result))
    assert printed["layout"]["pipeline_parallel_degree"] == 4 and len(printed["memory_gib"]) == 4
    assert printed["memory_gib"][0] == max(printed["memory_gib"])  # the first stage holds the most
    assert set(printed["memory_breakdown"]) == {"stage 0", "stage 1", "stage 2", "stage 3"}


def test_a_two_node_plan_resolves_the_layout_launch_would():
    path = os.path.join(REPO, "config", "llama", "pretrain_argument.json")
    result = plan(path, "--nnodes", "2", "--nproc_per_node", "8")
    assert result["layout"]["world_size"] == 16 and result["layout"]["nnodes"] == 2
    assert result["layout"]["sharding_parallel_degree"] == 8  # -1: every card tensor parallelism leaves
    # the recipe pins global_batch_size 1024: 8 data ranks x 1 sample x 128 accumulation (256 on one node)
    assert result["global_batch_size"] == 1024


@pytest.mark.parametrize(
    "extra, pattern",
    [
        # cards that do not split into whole model replicas: our line, before paddlenlp's assertion
        (
            ("--tensor_parallel_degree", "16"),
            r"^tensor_parallel_degree 16 splits each model replica over 16 cards, which do not divide the 8 cards "
            r"of the launch; launch on a multiple of 16 cards \(e\.g\. 16\)",
        ),
        (("--tensor_parallel_degree", "3"), r"^tensor_parallel_degree 3 .* \(e\.g\. 6 or 9\)"),
        (("--nproc_per_node", "7"), r"^tensor_parallel_degree 2 splits .* the 7 cards .* \(e\.g\. 6 or 8\)"),
        (("--num_attention_heads", "25", "--num_key_value_heads", "25", "--hidden_size", "3200"), r"^tensor_parallel"),
        (("--pipeline_parallel_degree", "2"), r"pipeline parallel is not compatible for sharding stage2"),
        # paddlenlp's _wrap_model asserts stage1 or stage2 with tensor parallelism (pretrain.layout_rules)
        (("--sharding", "stage3"), r"^sharding: stage3 does not combine with tensor parallelism"),
        # kept by paddlenlp with TP2 (it drops it without TP/PP): refused, it breaks resume (pretrain.preflight)
        (("--distributed_dataloader", "true"), r"^distributed_dataloader: not supported"),
        (("--gpu", "V100"), r"--gpu 'V100' is not a GPU the planner knows"),
        (("--nproc_per_node", "0"), r"^--nproc_per_node 0: a cluster needs at least 1"),
        (("--nnodes", "-1"), r"^--nnodes -1: a cluster needs at least 1"),
        (("--bf16", "false"), r"^use_flash_attention: flash attention runs in fp16 or bf16 only"),
        # paddlenlp's checks of the fleet strategy it builds, run as on the cluster
        (("--sharding_parallel_config", "bogus_option"), r"unknown sharding mode config bogus_option"),
        (
            ("--sharding", "stage1", "--sharding_parallel_config", "split_param", "--amp_master_grad", "false"),
            "master_grad",
        ),
        (("--bf16", "true", "--gpu", "A100-SXM4-40GB", "--use_flash_attention", "false", "--fp16", "true"), r"fp16"),
    ],
)
def test_bad_layouts_are_one_line_errors_naming_the_key(extra, pattern):
    path = os.path.join(REPO, "config", "llama", "pretrain_argument.json")
    with pytest.raises(UserError, match=pattern) as error:
        plan(path, *extra)
    assert "\n" not in str(error.value)


def test_search_ranks_layouts_that_fit(capsys):
    path = os.path.join(REPO, "config", "benchmarks", "llama-7b_TP1PP1SH2SP8_A100-40Gx1x8.json")
    plan(path, "--gpu", "A100-SXM4-40GB", "--search")
    ranked = [line for line in capsys.readouterr().out.splitlines() if line[:4].strip().rstrip(".").isdigit()]
    assert len(ranked) == 10
    rates = [float(line.split("tokens/card/s")[0].split()[-1].replace(",", "")) for line in ranked]
    assert rates == sorted(rates, reverse=True)


def test_the_command_line_tool_exits_2_on_a_bad_layout():
    path = os.path.join(REPO, "config", "llama", "pretrain_argument.json")
    result = run_script("tools/plan.py", path, "--tensor_parallel_degree", "3")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")


@pytest.mark.parametrize("path", [p for p in GPU_CONFIGS if "40G" in p], ids=os.path.basename)
def test_published_40g_cases_fit_a_40g_card(path):
    assert plan(path, "--gpu", "A100-SXM4-40GB")["fits"]


def test_a_predicted_peak_over_95_percent_of_the_card_is_a_warning(capsys):
    path = os.path.join(REPO, "config", "benchmarks", "llama-7b_TP1PP1SH2SP8_A100-80Gx1x8.json")  # 70 GiB published
    result = plan(path, "--num_hidden_layers", "34")  # 77.2 GiB predicted
    assert result["fits"]
    (warning,) = [w for w in result["warnings"] if w.startswith("memory:")]
    assert "over 95% of the A100-SXM4-80GB's 80.0 GiB" in warning and "--search" in warning
    assert "model llama (llama-7b with num_hidden_layers 34):" in capsys.readouterr().out


def test_a_plan_that_does_not_fit_is_printed_then_refused(capsys):
    path = os.path.join(REPO, "config", "benchmarks", "llama-7b_TP1PP1SH2SP8_A100-80Gx1x8.json")
    with pytest.raises(UserError, match=r"^memory: predicted peak 73.4 GiB \(pipeline stage 0\) does not fit the "):
        plan(path, "--gpu", "A100-SXM4-40GB", "--json")
    out = capsys.readouterr().out
    assert "(DOES NOT FIT)" in out and json.loads(out.splitlines()[-1])["fits"] is False
    assert "warning: memory" not in out  # the error, not also a warning


def test_an_absurd_model_is_refused_by_its_shape_before_anything_is_estimated(capsys):
    path = os.path.join(REPO, "config", "llama", "pretrain_argument.json")
    with pytest.raises(UserError) as error:
        plan(path, "--num_hidden_layers", "1000000", "--hidden_size", "1000000")
    assert str(error.value).startswith(
        "memory: llama (meta-llama/Llama-2-7b with num_hidden_layers 1000000, hidden_size 1000000) has "
        "4,033,026,064,001,000,000 parameters, whose model states alone (18 bytes each: "
    )
    assert str(error.value).endswith(
        "of the cluster together: no layout fits; use a smaller model or more cards (the model states alone need "
        "845,110,849 or more; tools/plan.py --search ranks the layouts that fit a card count)"
    )
    assert capsys.readouterr().out == ""


def test_a_slow_plan_shows_its_rate_not_zero():
    assert [rate_text(rate) for rate in (3616.4, 17.2, 7.44e-06)] == ["3,616", "17", "7.4e-06"]


def test_a_model_name_instead_of_a_config_gets_the_plan_command():
    with pytest.raises(UserError) as error:
        plan("llama-2-70b")
    assert str(error.value) == (
        "llama-2-70b is a model name, not a JSON config file; give a config and the model as a key, e.g. "
        "`python tools/plan.py config/llama/pretrain_argument.json --model_name_or_path llama-2-70b`"
    )


def test_the_plan_of_a_mixture_of_experts_says_how_it_counts_the_experts(capsys):
    """Qwen1.5-MoE-A2.7B expert parallel over 4 H200 (data parallelism alone): the step time has the all-to-all,
    the plan says what it assumed, the card holds 15 of the 60 experts per layer; Mixtral's recipe (TP8, no
    expert parallelism in paddlenlp's Mixtral) says every expert is on every card and has no all-to-all."""
    path = os.path.join(REPO, "config", "qwen2_moe", "pretrain_argument.json")
    layout = ("--tensor_parallel_degree", "1", "--sharding", "", "--use_expert_parallel", "true")
    result = plan(path, "--nproc_per_node", "4", "--gpu", "H200 SXM", *layout)
    out = capsys.readouterr().out
    assert result["time_breakdown"]["expert-parallel all-to-all"] > 0
    (step,) = [line for line in out.splitlines() if line.startswith("  step time: ")]
    assert "expert-parallel all-to-all " in step
    assert "parameter shapes on one card (tensor_parallel_degree 1, expert parallel 4: rank 0's 15 experts" in out
    assert "experts.0-14.gate_proj.weight [2048, 1408]" in out and "experts.15." not in out
    assert (
        "  assumed: mixture of experts: 60 experts per MoE layer, top-4; expert parallel over the 4 data-parallel "
        "ranks: each card holds 15 experts per layer" in out
    )
    assert "  assumed: expert-parallel all-to-all: 4 per MoE layer per micro batch (dispatch + combine" in out

    capsys.readouterr()
    mixtral = plan(os.path.join(REPO, "config", "mixtral", "pretrain_argument.json"), "--gpu", "H200 SXM")
    assert mixtral["time_breakdown"]["expert-parallel all-to-all"] == 0.0
    assert (
        "  assumed: mixture of experts: 8 experts per MoE layer, top-2; no expert parallelism (paddlenlp 3.0.0b4's "
        "MixtralSparseMoeBlock" in capsys.readouterr().out
    )


def test_ernie4_5_moe_recipe_fits_8_a100_80gb_by_expert_parallelism(capsys):
    """ERNIE-4.5-21B-A3B's recipe: its 21.8B parameters' model states (393 GB) fit 8 x 80 GB with each card holding 8
    of the 64 experts per MoE layer (expert parallel over the 8 data-parallel ranks: 3.99B parameters per card,
    77.5 GiB predicted); without expert parallelism, sharding stage2 over the 8 does not (94.4 GiB)."""
    path = os.path.join(REPO, "config", "ernie4_5_moe", "pretrain_argument.json")
    result = plan(path, "--gpu", "A100-SXM4-80GB")
    assert result["fits"] and result["layout"]["data_parallel_degree"] == 8
    assert result["params_per_card"] == 3_989_160_128
    out = capsys.readouterr().out
    assert "expert parallel over the 8 data-parallel ranks: each card holds 8 experts per layer" in out
    no_experts_spread = ("--use_expert_parallel", "false", "--sharding", "stage2", "--sharding_parallel_degree", "8")
    with pytest.raises(UserError, match=r"^memory: predicted peak 94.4 GiB \(pipeline stage 0\) does not fit the "):
        plan(path, "--gpu", "A100-SXM4-80GB", *no_experts_spread)


def test_a_launch_of_a_recipe_that_cannot_fit_is_refused_not_warned(monkeypatch):
    """The Mixtral recipe on 8 x A100-80GB: 783 GiB of model states. Before, a real launch logged the planner's
    line as a warning and ran out of memory at the first optimizer step; now every rank refuses it as
    tools/plan.py does, naming the card count the model states alone need."""
    run = resolve_for_cluster([os.path.join(REPO, "config", "mixtral", "pretrain_argument.json")], 1, 8)
    monkeypatch.setattr(forecast, "runs_on_gpu", lambda args: True)
    monkeypatch.setattr(forecast, "gpu_name", lambda: "A100-SXM4-80GB")
    with pytest.raises(UserError) as error:
        forecast.estimate_on_this_gpu(run)
    message = str(error.value)
    assert message.startswith("memory: ") and "more than the 8 x 80.0 GiB of the cluster together" in message
    assert "the model states alone need 10 or more" in message, message
