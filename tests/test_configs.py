"""Every JSON under config/ parses and resolves to a model config; benchmark JSONs match the published cases.

GPU recipes are validated here on CPU. paddlenlp's ``TrainingArguments.__post_init__`` accepts
fp16/bf16 and the sharding flags without a GPU, but in a single process (world size 1) it resets
``tensor_parallel_degree``, ``pipeline_parallel_degree``, ``sharding_parallel_degree`` and
``sharding`` to their single-card defaults ("disable sharding when we have only single gpu"), and
runs its hybrid-parallel checks only when world size > 1. So the parsed arguments are checked
for what survives, and the parallel layout and batch arithmetic are checked on the JSON values
against the published cases (FlagPerf training/nvidia/llama1_7B-paddle and its sibling case READMEs) here.
"""

import glob
import json
import os
import re

import pytest
from conftest import REPO

from pretrain.arguments import parse_arguments
from pretrain.model_config import build_model_config, resolve_model_config
from pretrain.param_count import count_config_parameters
from pretrain.registry import find_model_size
from pretrain.tokenizers import load_tokenizer

# run_finetune.py's configs (config/*/lora_*.json) are tested in tests/test_finetune.py.
CONFIGS = sorted(
    path
    for path in glob.glob(os.path.join(REPO, "config", "**", "*.json"), recursive=True)
    if not os.path.basename(path).startswith("lora_")
)
# FlagPerf's Paddle cases (the Megatron-DeepSpeed Llama-2-7B case has its own test below)
BENCHMARKS = [path for path in CONFIGS if os.sep + "benchmarks" + os.sep in path and "SP" in os.path.basename(path)]
MEGATRON = [path for path in CONFIGS if "TP4PP1DP2" in os.path.basename(path)]
CARDS = 8  # every published case runs on one DGX A100: 8 cards
SEQ_LEN = 2048
GLOBAL_BATCH_TOKENS = {"llama": 4 * 2**20, "gpt3": 2 * 2**20}  # "4M tokens" / "2M tokens"

# FlagPerf case definitions: (model, memory GB, strategy) -> (micro batch, accumulation, recompute)
PUBLISHED = {
    ("llama-7b", 80, "TP1PP1SH2SP8"): (4, 64, False),
    ("llama-7b", 80, "TP2PP1SH1SP4"): (4, 128, False),
    ("llama-7b", 80, "TP2PP1SH2SP4"): (4, 128, False),
    ("llama-7b", 80, "TP2PP4SH1SP1"): (4, 512, False),
    ("llama-7b", 40, "TP1PP1SH2SP8"): (2, 128, True),
    ("llama-7b", 40, "TP2PP1SH1SP4"): (2, 256, True),
    ("llama-7b", 40, "TP2PP1SH2SP4"): (2, 256, True),
    ("llama-7b", 40, "TP2PP4SH1SP1"): (2, 1024, True),
    ("llama-13b", 80, "TP1PP1SH2SP8"): (2, 128, True),
    ("llama-13b", 80, "TP2PP1SH1SP4"): (2, 256, True),
    ("llama-13b", 80, "TP2PP1SH2SP4"): (2, 256, True),
    ("llama-13b", 80, "TP2PP4SH1SP1"): (4, 512, True),
    ("gpt3-6.7b", 80, "TP1PP1SH2SP8"): (4, 32, False),
    ("gpt3-6.7b", 80, "TP2PP1SH1SP4"): (4, 64, False),
    ("gpt3-6.7b", 80, "TP2PP1SH2SP4"): (4, 64, False),
    ("gpt3-6.7b", 80, "TP2PP4SH1SP1"): (4, 256, False),
    ("gpt3-13b", 80, "TP1PP1SH2SP8"): (2, 64, True),
    ("gpt3-13b", 80, "TP2PP1SH1SP4"): (2, 128, True),
    ("gpt3-13b", 80, "TP2PP1SH2SP4"): (2, 128, True),
    ("gpt3-13b", 80, "TP2PP4SH1SP1"): (4, 256, True),
}
NAME = re.compile(r"^(?P<model>[\w.-]+)_TP(?P<tp>\d+)PP(?P<pp>\d+)SH(?P<stage>\d)SP(?P<sd>\d+)_A100-(?P<mem>\d+)Gx1x8$")


def _name(path):
    return os.path.relpath(path, REPO)


def _load(path):
    with open(path) as f:
        return json.load(f)


@pytest.mark.parametrize("path", CONFIGS, ids=_name)
def test_config_parses_and_resolves(path):
    model_args, data_args, training_args = parse_arguments([path])
    if os.path.isdir(model_args.tokenizer_name_or_path or ""):
        vocab = len(load_tokenizer(model_args))
    else:  # GPU recipes name tokenizer folders a user prepares (docs/models.md); use the published vocabulary
        vocab = resolve_model_config(model_args.model_name_or_path, model_args.continue_training).vocab_size
    config = build_model_config(model_args, data_args, training_args, vocab)
    assert config.vocab_size >= vocab and config.vocab_size % 128 == 0
    assert config.seq_length == data_args.max_seq_length + getattr(config, "num_nextn_predict_layers", 0)  # MTP inputs
    assert config.use_flash_attention == training_args.use_flash_attention
    total, embedding = count_config_parameters(config)
    assert total > embedding > 0
    arch = find_model_size(model_args.model_name_or_path)
    assert arch is not None, "configs name registry architectures"
    if arch.published_params:  # a padded vocabulary moves the count by < 1% at published sizes
        assert total == pytest.approx(count_config_parameters(arch.model_config())[0], rel=0.01)


def test_every_published_case_has_a_config():
    expected = {f"{model}_{strategy}_A100-{memory}Gx1x8" for model, memory, strategy in PUBLISHED}
    assert {os.path.basename(path)[:-5] for path in BENCHMARKS} == expected


@pytest.mark.parametrize("path", BENCHMARKS, ids=_name)
def test_benchmark_matches_the_published_case(path):
    match = NAME.match(os.path.basename(path)[:-5])
    assert match, "benchmark names read <model>_TP{t}PP{p}SH{stage}SP{degree}_A100-{memory}Gx1x8"
    case = match.groupdict()
    config = _load(path)
    tp, pp, sharding_degree = int(case["tp"]), int(case["pp"]), int(case["sd"])
    strategy = f"TP{tp}PP{pp}SH{case['stage']}SP{sharding_degree}"
    micro, accumulation, recompute = PUBLISHED[(case["model"], int(case["mem"]), strategy)]

    assert config["model_name_or_path"] == case["model"]
    assert config["tensor_parallel_degree"] == tp
    assert config["pipeline_parallel_degree"] == pp
    assert config["sharding"] == f"stage{case['stage']}"
    assert config["sharding_parallel_degree"] == sharding_degree
    assert CARDS % (tp * pp * sharding_degree) == 0
    data_parallel = CARDS // (tp * pp)  # replicas of the model: sharding degree x plain data parallel
    assert config["per_device_train_batch_size"] == micro
    assert config["gradient_accumulation_steps"] == accumulation
    assert config["recompute"] is recompute
    family = case["model"].split("-")[0]
    if recompute and family == "gpt3":
        # paddlenlp 3.0.0b4 GPT: "full" recomputes only in GPTForCausalLMPipe; without a pipeline,
        # GPTForCausalLM recomputes whole layers under "full_attn" and ignores "full".
        assert config["recompute_granularity"] == ("full" if pp > 1 else "full_attn")
    assert micro * accumulation * data_parallel * SEQ_LEN == GLOBAL_BATCH_TOKENS[family]

    assert config["max_seq_length"] == SEQ_LEN
    assert config["fp16"] is True and config["fp16_opt_level"] == "O2" and config["scale_loss"] == 1024
    assert config["use_flash_attention"] is True
    if family == "llama":  # GPT-3 uses LayerNorm: no RMSNorm to fuse
        assert config["use_fused_rms_norm"] is (case["mem"] == "80")  # 40G cases: fused RMSNorm off
    recipe = {
        key: config[key]
        for key in (
            "learning_rate",
            "min_learning_rate",
            "warmup_steps",
            "weight_decay",
            "adam_beta1",
            "adam_beta2",
            "adam_epsilon",
            "split",
            "max_steps",
        )
    }
    assert recipe == {
        "learning_rate": 3e-4,
        "min_learning_rate": 3e-5,
        "warmup_steps": 2000,
        "weight_decay": 0.1,
        "adam_beta1": 0.9,
        "adam_beta2": 0.95,
        "adam_epsilon": 1e-6,
        "split": "998,1,1",
        "max_steps": 100,
    }
    assert config["lr_scheduler_type"] == "cosine"


@pytest.mark.parametrize("path", BENCHMARKS[:1], ids=_name)
def test_parsed_gpu_arguments_keep_precision_and_batch(path):
    """What paddlenlp keeps on CPU: precision, batch and recompute flags."""
    config = _load(path)
    _, data_args, training_args = parse_arguments([path])
    assert training_args.fp16 and training_args.fp16_opt_level == "O2"
    assert training_args.per_device_train_batch_size == config["per_device_train_batch_size"]
    assert training_args.gradient_accumulation_steps == config["gradient_accumulation_steps"]
    assert training_args.recompute == config["recompute"]
    assert data_args.max_seq_length == SEQ_LEN


@pytest.mark.parametrize("path", MEGATRON, ids=_name)
def test_megatron_deepspeed_case_as_published(path):
    """FlagPerf training/nvidia/llama2_7b-megatron-deepspeed: Llama-2-7B, TP 4, 2 data replicas (DeepSpeed
    ZeRO-1: sharding stage1 over them), micro batch 1, seq 4096, GAS 32 or 512, amp, flash attention 2."""
    config = _load(path)
    gas = int(os.path.basename(path).split("_gas")[1][:-5])
    assert config["model_name_or_path"] == "llama-2-7b" and gas in (32, 512)
    assert (config["tensor_parallel_degree"], config["pipeline_parallel_degree"]) == (4, 1)
    assert (config["sharding"], config["sharding_parallel_degree"]) == ("stage1", 2)
    assert config["per_device_train_batch_size"] == 1 and config["gradient_accumulation_steps"] == gas
    assert config["max_seq_length"] == 4096 and config["use_flash_attention"] and config["bf16"]
    assert config["nominal_params"] == 7e9 and config["peak_flops_per_card"] == 312e12  # the case's MFU form
    # megatron-deepspeed_main.sh: LR 3e-4 to 3e-5 cosine after 20 warm-up steps, --split 949,50,1, Adam
    # (0.9, 0.95) with Megatron's default epsilon, weight decay 0.1, clip 1, no activation recompute, and
    # ds_config "grad_accum_dtype": "bf16" (bf16 gradients: no float32 master gradients)
    schedule = {key: config[key] for key in ("learning_rate", "min_learning_rate", "lr_scheduler_type", "warmup_steps")}
    assert schedule == {
        "learning_rate": 3e-4,
        "min_learning_rate": 3e-5,
        "lr_scheduler_type": "cosine",
        "warmup_steps": 20,
    }
    assert (config["adam_beta1"], config["adam_beta2"], config["adam_epsilon"]) == (0.9, 0.95, 1e-8)
    assert (config["weight_decay"], config["max_grad_norm"], config["split"]) == (0.1, 1.0, "949,50,1")
    assert config["recompute"] is False and config["amp_master_grad"] is False
