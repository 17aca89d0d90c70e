"""The GPU recipes, proven without GPUs: what each GPU run would receive, read against paddlenlp's own code.

Every shipped GPU config is parsed under a simulated 8-card launch (``pretrain.layout.simulated_launch``,
paddlenlp's own degree derivation) and its model config is compared with what paddlenlp's mechanism
(``LlmMetaConfig.set_llm_config``, as upstream PaddleNLP's run_pretrain.py calls it) sets; the
environment, the weights the model is built from, the preflight checks and warnings are checked
for what they would do on the cluster.
"""

import glob
import importlib.util
import os
import sys
import types

import numpy as np
import paddle
import pytest
from conftest import REPO, load_script, resolve_plan
from paddlenlp.transformers.configuration_utils import LlmMetaConfig
from tiny_run import tiny_args, with_overrides

from pretrain import fused_ops
from pretrain.arguments import parse_arguments
from pretrain.errors import UserError
from pretrain.layout import ParallelLayout, simulated_launch
from pretrain.metrics import hardware
from pretrain.metrics.hardware import find_gpu
from pretrain.metrics.step_timer import step_work
from pretrain.model import build_model, model_class_for
from pretrain.model_config import build_model_config, resolve_model_config
from pretrain.preflight import check_arguments, check_layout, warn_run
from pretrain.registry import find_model_size
from pretrain.resolve import RunPlan

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

GPU_CONFIGS = sorted(
    glob.glob(os.path.join(REPO, "config", "benchmarks", "*.json"))
    + glob.glob(os.path.join(REPO, "config", "*", "pretrain_argument*.json"))
)
DEMOS = sorted(glob.glob(os.path.join(REPO, "config", "*", "pretrain_demo_cpu.json")))


def _name(path):
    return os.path.relpath(path, REPO)


def _on_8_cards(path, *extra):
    """(model_args, data_args, training_args, layout) of ``path`` as launched on 1 x 8 cards."""
    with simulated_launch(1, 8):
        model_args, data_args, training_args = parse_arguments([path, *extra])
        return model_args, data_args, training_args, ParallelLayout.from_arguments(training_args, nnodes=1)


def _published_vocab(model_args) -> int:
    """The vocabulary the recipe's tokenizer folder would give (that folder is not fetched on CPU CI)."""
    return resolve_model_config(model_args.model_name_or_path, model_args.continue_training).vocab_size


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=_name)
def test_model_config_carries_every_llm_meta_field_as_paddlenlp_sets_it(path):
    model_args, data_args, training_args, layout = _on_8_cards(path)
    config = build_model_config(model_args, data_args, training_args, _published_vocab(model_args))
    reference = find_model_size(model_args.model_name_or_path).model_config()
    LlmMetaConfig.set_llm_config(reference, training_args)  # upstream run_pretrain.py's mechanism
    for key in LlmMetaConfig._get_defaults():
        assert getattr(config, key) == getattr(reference, key), key
    # -1: paddlenlp's TrainingArguments without hybrid parallelism (data parallel alone: ERNIE-4.5-MoE's recipe)
    assert max(config.tensor_parallel_degree, 1) == layout.tensor_parallel_degree
    assert max(config.pipeline_parallel_degree, 1) == layout.pipeline_parallel_degree
    assert config.use_flash_attention is True and config.seq_length == data_args.max_seq_length


def test_options_paddlenlp_knows_reach_the_model():
    path = os.path.join(REPO, "config", "llama", "pretrain_argument.json")
    extra = ("--sep_parallel_degree", "2", "--sharding_parallel_degree", "2", "--refined_recompute", "flash_attn:-1")
    model_args, data_args, training_args, layout = _on_8_cards(path, *extra, "--use_fused_linear", "true")
    config = build_model_config(model_args, data_args, training_args, 32000)
    assert (layout.sep_parallel_degree, config.sep_parallel_degree) == (2, 2)
    assert config.refined_recompute["flash_attn"] == -1 and config.use_fused_linear is True  # paddlenlp parses it
    assert config.context_parallel_degree == 1 and config.virtual_pp_degree == 1


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=_name)
def test_published_schedule_passes_preflight(path):
    # 100 measured steps inside a 2000-step warm-up: paddlenlp's schedulers handle it, so must we.
    _, _, training_args, _ = _on_8_cards(path)
    assert check_arguments(training_args) == []


@pytest.mark.parametrize("path", DEMOS, ids=_name)
def test_dry_run_works_for_every_family(path, tmp_path, demo_dir, capsys):
    argv = [path, "--output_dir", str(tmp_path / "out"), "--data_cache", str(tmp_path / "cache"), "--dry_run", "true"]
    assert load_script("run_pretrain.py").main(argv) is None
    assert "dry run: preflight passed" in capsys.readouterr().out


def test_causal_mask_fast_path_is_set_by_main_not_by_import(tmp_path, demo_dir, monkeypatch):
    monkeypatch.delenv("USE_CASUAL_MASK", raising=False)
    spec = importlib.util.spec_from_file_location("run_pretrain_fresh", os.path.join(REPO, "run_pretrain.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)  # a fresh import of the entry point
    assert "USE_CASUAL_MASK" not in os.environ  # ... changed nothing
    seen = {}

    def stop_at_build(plan):
        seen["flag"] = os.environ.get("USE_CASUAL_MASK")
        raise RuntimeError("stop before training")

    monkeypatch.setattr(script, "build_model", stop_at_build)
    with pytest.raises(RuntimeError, match="stop before training"):
        script.main(tiny_args(str(tmp_path / "out"), str(tmp_path / "cache")))
    assert seen["flag"] == "True"  # paddlenlp reads it (get_use_casual_mask) when the model runs


@pytest.mark.parametrize("family", ["llama", "qwen", "qwen2"])
def test_causal_mask_fast_path_gives_the_same_logits(family, monkeypatch):
    """The fast path drops the dense [batch, 1, seq, seq] mask; on CPU paddlenlp then builds the causal
    mask inside attention: the logits must be identical."""
    plan = resolve_plan([os.path.join(REPO, "config", family, "pretrain_demo_cpu.json")])
    paddle.seed(0)
    model = build_model(plan)
    model.eval()
    input_ids = paddle.to_tensor(np.random.default_rng(0).integers(0, 8000, size=(2, 32)))
    logits = {}
    for flag in ("False", "True"):
        monkeypatch.setenv("USE_CASUAL_MASK", flag)
        with paddle.no_grad():
            logits[flag] = model(input_ids)[0].numpy()
    np.testing.assert_array_equal(logits["True"], logits["False"])


FAMILY_RECIPES = sorted(glob.glob(os.path.join(REPO, "config", "*", "pretrain_argument*.json")))


@pytest.mark.parametrize("path", FAMILY_RECIPES)
def test_family_recipes_keep_fp32_main_gradients(path):
    _, _, training_args, _ = _on_8_cards(path)
    assert training_args.fp16_opt_level == "O2" and training_args.gradient_accumulation_steps > 1
    assert training_args.amp_master_grad  # paddlenlp wraps every parallel mode with MixPrecision* under it
    assert training_args.unified_checkpoint  # merged safetensors: continue_training in any layout


def _plan(path, *extra, vocab=None) -> RunPlan:
    model_args, data_args, training_args, layout = _on_8_cards(path, *extra)
    vocab = vocab or _published_vocab(model_args)
    config = build_model_config(model_args, data_args, training_args, vocab)
    return RunPlan(model_args, data_args, training_args, layout, model_config=config)


@pytest.mark.parametrize("path", FAMILY_RECIPES, ids=_name)
def test_family_recipes_divide_mfu_by_the_peak_of_the_card_they_run_on(path, monkeypatch):
    """On an H100 the run's MFU divides by its 989e12, the figure ``tools/plan.py --gpu H100-SXM5-80GB`` uses
    (the recipes used to set an A100's 312e12, which overrides the card's: MFU 3.17x too high)."""
    monkeypatch.setattr(hardware, "gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    peak = step_work(_plan(path)).peak
    assert peak == (find_gpu("H100-SXM5-80GB").peak_flops_per_sec, "datasheet: H100 SXM bf16/fp16 dense")


def test_master_gradient_warning_names_the_fix():
    path = os.path.join(REPO, "config", "benchmarks", "llama-7b_TP1PP1SH2SP8_A100-80Gx1x8.json")
    (warning,) = warn_run(_plan(path))  # the published case accumulates 64 micro-batches in fp16
    assert warning.startswith("amp_master_grad: float16 weights with gradient_accumulation_steps 64")
    assert warn_run(_plan(path, "--amp_master_grad", "true")) == []


@pytest.mark.parametrize(
    "family, granularity, pipeline, ignored",
    [("gpt3", "full", "1", True), ("gpt3", "full", "2", False), ("gpt3", "full_attn", "1", False)]
    + [("qwen", "full_attn", "1", True), ("qwen", "full", "1", False), ("llama", "full_attn", "1", False)],
)
def test_a_recompute_granularity_the_model_ignores_is_a_warning(family, granularity, pipeline, ignored):
    """paddlenlp 3.0.0b4: GPTForCausalLM recomputes nothing under "full" (only GPTForCausalLMPipe does), QWen v1
    has no full_attn path (gpt/modeling.py, qwen/modeling.py; pretrain.registry.Implementation.recomputed_units)."""
    path = os.path.join(REPO, "config", family, "pretrain_argument.json")
    extra = ("--recompute", "true", "--recompute_granularity", granularity, "--pipeline_parallel_degree", pipeline)
    extra += ("--sharding", "stage1") if pipeline != "1" else ()
    warnings = [line for line in warn_run(_plan(path, *extra)) if line.startswith("recompute_granularity")]
    assert len(warnings) == ignored
    if ignored:
        assert f"'{granularity}' recomputes nothing" in warnings[0] and "Use one of:" in warnings[0]


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=os.path.basename)
def test_no_shipped_config_recomputes_nothing(path):
    assert not [line for line in warn_run(_plan(path)) if line.startswith("recompute_granularity")]


def test_a_vocabulary_that_is_not_the_architectures_is_named():
    path = os.path.join(REPO, "config", "baichuan", "pretrain_argument.json")
    assert warn_run(_plan(path)) == []  # Baichuan2's own tokenizer: 125,696 tokens
    (warning,) = warn_run(_plan(path, vocab=32000))  # a LLaMA tokenizer under the Baichuan2 name
    assert "the model gets 32000 embedding rows, baichuan2-7b has 125696" in warning
    assert "set vocab_size 125696" in warning


TP8 = ("--tensor_parallel_degree", "8")
PP8 = ("--pipeline_parallel_degree", "8")


@pytest.mark.parametrize(
    "extra, key",
    [
        (TP8, None),  # LLaMA-2-7B: 32 heads, MLP 11008, vocabulary 32000, all divisible by 8
        ((*TP8, "--num_attention_heads", "20", "--hidden_size", "2560"), "tensor_parallel_degree"),
        ((*TP8, "--intermediate_size", "11004"), "tensor_parallel_degree"),
        ((*TP8, "--fuse_attention_qkv", "true", "--num_key_value_heads", "4"), "fuse_attention_qkv"),
        ((*PP8, "--virtual_pp_degree", "8"), "pipeline_parallel_degree"),  # 64 stages for 32 layers
        ((*PP8, "--virtual_pp_degree", "3"), "virtual_pp_degree"),  # 32 layers over 24 stages
        (("--sep_parallel_degree", "8", "--num_attention_heads", "12", "--hidden_size", "1536"), "sep_parallel_degree"),
        (("--context_parallel_degree", "8", "--max_seq_length", "4092"), "context_parallel_degree"),
        (("--sharding_parallel_degree", "8", "--sequence_parallel", "true"), "sequence_parallel"),
    ],
)
def test_layouts_that_do_not_divide_the_model_are_refused(extra, key):
    """Each refused case is an assertion inside paddlenlp's or paddle's layers at model build on GPUs."""
    path = os.path.join(REPO, "config", "llama", "pretrain_argument.json")
    plain = ("--tensor_parallel_degree", "1", "--sharding", "stage1", "--sharding_parallel_degree", "-1")
    problems = check_layout(_plan(path, *with_overrides(list(plain), *extra)))
    assert problems == [] if key is None else problems[0].startswith(f"{key}:"), problems


def test_mixture_of_experts_pipelines_are_refused():
    """paddlenlp 3.0.0b4 has no MixtralForCausalLMPipe: preflight names the key, and so does model building.
    Qwen2-MoE has a Pipe class, but the pipeline schedule would skip the trainer's load-balancing loss."""
    layout = ("--tensor_parallel_degree", "4", "--pipeline_parallel_degree", "2")
    plan = _plan(os.path.join(REPO, "config", "mixtral", "pretrain_argument.json"), *layout)
    (problem,) = check_layout(plan)
    assert problem.startswith("pipeline_parallel_degree: 2, but paddlenlp has no pipeline-parallel class")
    with pytest.raises(UserError, match="pipeline_parallel_degree"):
        model_class_for(plan.model_config, 2)
    (problem,) = check_layout(_plan(os.path.join(REPO, "config", "qwen2_moe", "pretrain_argument.json"), *layout))
    assert problem.startswith("pipeline_parallel_degree: 2, but a mixture of experts (qwen2_moe) adds its")


def test_kv_heads_and_vocabulary_that_do_not_divide_are_replicated_with_a_warning():
    path = os.path.join(REPO, "config", "llama", "pretrain_argument.json")
    extra = ("--tensor_parallel_degree", "8", "--sharding", "", "--num_key_value_heads", "4", "--vocab_size", "32004")
    plan = _plan(path, *extra)
    assert check_layout(plan) == []  # LlamaModel falls back to a full copy of K/V and of the embedding
    assert [w.split(":")[0] for w in warn_run(plan)] == ["num_key_value_heads", "vocab_size", "vocab_size"]


def test_fused_ln_is_called_on_the_runs_device(monkeypatch):
    assert fused_ops.fused_ln_problem(paddle.CPUPlace()) is None  # the CPU build here really runs

    def no_kernel(x, w, eps):
        raise RuntimeError(
            "The kernel with key (GPU, Undefined(AnyLayout), float32) of kernel `fused_rms_norm` is not registered"
        )

    fake = types.SimpleNamespace(fused_rms_norm=no_kernel)
    monkeypatch.setitem(sys.modules, "fused_ln_gpu_less_build", fake)
    problem = fused_ops.call_problem("fused_ln_gpu_less_build", paddle.CPUPlace())
    assert "fails on" in problem and "not registered" in problem and "external_ops/setup.py install" in problem

    fake.fused_rms_norm = lambda x, w, eps: (x * 2,)  # runs, but is not RMSNorm
    assert "disagrees with RMSNorm" in fused_ops.call_problem("fused_ln_gpu_less_build", paddle.CPUPlace())


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "config", "benchmarks", "*.json"))), ids=_name)
def test_benchmark_reports_name_the_published_case(path):
    model_args, _, training_args, layout = _on_8_cards(path)
    published = os.path.basename(path).split("_")[1]  # e.g. TP2PP4SH1SP1, or TP4PP1DP2 (Megatron's naming)
    if published.endswith("DP2"):  # DeepSpeed ZeRO-1 over 2 data replicas = sharding stage1 over 2
        assert layout.name == "TP4PP1SH1SP2DP1" and layout.dataset_world_size == 2
    else:
        assert layout.name.startswith(published)
    arch = find_model_size(model_args.model_name_or_path)
    assert training_args.nominal_params == pytest.approx(arch.published_params, rel=0.08)  # the name's size


@pytest.mark.parametrize("gas, tokens_per_card_per_sec, published_mfu", [(32, 2868, 0.386), (512, 2908, 0.391)])
def test_megatron_case_mfu_is_the_published_figure(gas, tokens_per_card_per_sec, published_mfu):
    """FlagPerf's MFU for the case: tokens/card/s x 6 x 7e9 / 312e12, from the config's own fields."""
    path = os.path.join(REPO, "config", "benchmarks", f"llama-2-7b_TP4PP1DP2_A100-40Gx1x8_gas{gas}.json")
    work = step_work(_plan(path))
    assert work.global_batch_samples == 2 * gas and work.world_size == 8
    steps_per_sec = tokens_per_card_per_sec * work.world_size / (work.global_batch_samples * work.seq_len)
    rates = work.rates(steps_per_sec)
    assert rates["tokens_per_card_per_sec"] == pytest.approx(tokens_per_card_per_sec)
    assert round(rates["mfu_nominal"], 3) == published_mfu
