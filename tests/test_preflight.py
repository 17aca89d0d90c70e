"""Preflight: the dry run (config, model size, data summary, nothing built), the parameter formula,
and how the largest token id is found (sidecar, full scan, bounded scan)."""

import json
import os
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from conftest import DEMO_DIR, count_parameters, load_script, resolve_plan
from tiny_run import tiny_args

from pretrain import corpus
from pretrain.checkpoint import checkpoint_bytes
from pretrain.corpus import summarize_prefix
from pretrain.layout import ParallelLayout
from pretrain.model import build_model
from pretrain.preflight import (
    check_arguments,
    check_continue_training_output,
    check_data_source,
    check_reentrant_recompute_of_router_loss,
    check_spike_rollback_layout,
    check_tokenizer_agreement,
)

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

DEMO_PREFIX = os.path.join(DEMO_DIR, "demo_text_document")


def _demo_max_token_id() -> int:
    return int(np.memmap(DEMO_PREFIX + ".bin", dtype=np.uint16, mode="r").max())


def test_dry_run_prints_config_model_and_data_and_builds_nothing(tmp_path, demo_dir, capsys):
    out, cache = tmp_path / "out", tmp_path / "cache"
    assert load_script("run_pretrain.py").main(tiny_args(str(out), str(cache), "--dry_run", "true")) is None
    text = capsys.readouterr().out
    assert "dry run: preflight passed" in text
    assert '"num_hidden_layers": 2' in text and '"vocab_size": 8064' in text
    assert "model: 1,114,432 parameters" in text
    assert "global batch 4 samples = 256 tokens per step" in text
    assert "2398 documents, 2657388 tokens, dtype uint16" in text
    source = "sidecar" if os.path.isfile(DEMO_PREFIX + ".stats.json") else "full scan"
    assert f"max token id {_demo_max_token_id()} ({source})" in text
    assert "reading sizes" not in text  # paddlenlp's index reader is kept quiet
    assert not out.exists() and not cache.exists()  # no output, no index cache, no model


def test_parameter_formula_matches_the_built_model(demo_dir):
    plan = resolve_plan(tiny_args("/tmp/unused", "/tmp/unused"))
    assert plan.problems == []
    paddle.seed(0)
    assert plan.num_parameters == count_parameters(build_model(plan))[0]
    # fp32 weights + two fp32 Adam moments = 12 bytes per parameter
    assert checkpoint_bytes(plan.num_parameters, plan.training_args) == 12 * plan.num_parameters


def _linked_demo(tmp_path) -> str:
    prefix = str(tmp_path / "demo")
    for suffix in (".bin", ".idx"):
        os.symlink(DEMO_PREFIX + suffix, prefix + suffix)
    return prefix


def test_sidecar_is_used_instead_of_scanning(tmp_path, demo_dir):
    prefix = _linked_demo(tmp_path)
    with open(prefix + ".stats.json", "w") as f:  # written by create_pretraining_data.py
        json.dump({"max_token_id": 7777, "dtype": "uint16", "vocab_size": 8000}, f)
    summary = summarize_prefix(prefix, "949,50,1")
    assert (summary.max_token_id, summary.max_token_id_source) == (7777, "sidecar")
    assert check_data_source(prefix, "949,50,1", vocab_size=8064, need_valid=True) == []
    (problem,) = check_data_source(prefix, "949,50,1", vocab_size=7000, need_valid=True)
    assert "holds token id 7777 but the model has 7000 embedding rows" in problem


def test_stale_sidecar_is_reported(tmp_path, demo_dir):
    prefix = _linked_demo(tmp_path)
    with open(prefix + ".stats.json", "w") as f:
        json.dump({"max_token_id": 7777, "dtype": "int32", "vocab_size": 8000}, f)
    (problem,) = check_data_source(prefix, "949,50,1", vocab_size=8064, need_valid=True)
    assert "stale" in problem


def test_scan_without_sidecar_is_bounded(tmp_path, demo_dir, monkeypatch):
    prefix = _linked_demo(tmp_path)
    monkeypatch.setattr(corpus, "SCAN_BYTES", 2**20)  # the demo .bin is 4.7 MiB: read 1 MiB per end
    tokens = np.memmap(DEMO_PREFIX + ".bin", dtype=np.uint16, mode="r")
    per_end = 2**20 // 2
    expected = max(int(tokens[:per_end].max()), int(tokens[-per_end:].max()))
    summary = summarize_prefix(prefix, "949,50,1")
    assert summary.max_token_id == expected
    assert summary.max_token_id_source.startswith("bounded scan of the first and last 1 MiB")


@pytest.mark.parametrize("fp16_opt_level, expected_bytes", [("O1", 12), ("O2", 2 + 8 + 4)])
def test_checkpoint_estimate(fp16_opt_level, expected_bytes):
    # bf16 O2 keeps bf16 weights, fp32 Adam moments and an fp32 master copy; O1 keeps fp32 weights.
    args = SimpleNamespace(fp16_opt_level=fp16_opt_level, bf16=True, fp16=False, amp_master_grad=False)
    assert checkpoint_bytes(1000, args) == 1000 * expected_bytes


def _arguments(**overrides):
    fields = dict(
        max_steps=10,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=1,
        lr_scheduler_type="cosine",
        throughput_warmup_steps=1,
    )
    return SimpleNamespace(**{**fields, **overrides})


def test_arguments_are_checked_before_anything_is_built():
    assert check_arguments(_arguments()) == []
    assert [p.split(":")[0] for p in check_arguments(_arguments(max_steps=0))] == ["max_steps"]


def test_continue_training_may_not_write_into_the_folder_it_loads(tmp_path):
    source = tmp_path / "llama_demo_cpu"
    source.mkdir()
    continuing = SimpleNamespace(model_name_or_path=str(source), continue_training=True)
    # docs/models.md's example before the fix: output_dir from the config = the folder of the weights
    (problem,) = check_continue_training_output(continuing, SimpleNamespace(output_dir=f"{tmp_path}/./llama_demo_cpu"))
    assert problem.startswith(f"output_dir: {tmp_path}/./llama_demo_cpu is the folder continue_training loads from")
    assert problem.endswith("set output_dir to a new folder")
    assert check_continue_training_output(continuing, SimpleNamespace(output_dir=str(tmp_path / "continued"))) == []
    from_scratch = SimpleNamespace(model_name_or_path=str(source), continue_training=False)
    assert check_continue_training_output(from_scratch, SimpleNamespace(output_dir=str(source))) == []


def test_data_tokenized_with_another_eos_is_refused_unless_waived(tmp_path, demo_dir):
    data = tmp_path / "data"
    data.mkdir()
    for suffix in (".bin", ".idx"):
        os.symlink(DEMO_PREFIX + suffix, data / f"demo_text_document{suffix}")
    with open(DEMO_PREFIX + ".stats.json") as f:
        stats = json.load(f)
    (data / "demo_text_document.stats.json").write_text(json.dumps({**stats, "eos_token_id": 1}))
    argv = tiny_args(str(tmp_path / "out"), str(tmp_path / "cache"), "--input_dir", str(data))
    (problem,) = check_tokenizer_agreement(resolve_plan(argv))
    assert problem.startswith("tokenizer_name_or_path: ") and ": EOS id 1 vs 2;" in problem  # class and size agree
    assert problem.endswith("allow_tokenizer_mismatch true waives this")
    assert check_tokenizer_agreement(resolve_plan([*argv, "--allow_tokenizer_mismatch", "true"])) == []


def test_reentrant_recompute_of_a_trainer_added_router_loss_is_refused(demo_dir):
    """Before: accepted silently, and the load-balancing loss trained nothing (its router logits, read in a
    forward hook that reentrant recompute runs under no_grad, had stop_gradient True)."""
    argv = ["config/qwen2_moe/pretrain_demo_cpu.json", "--recompute", "true"]
    reentrant = resolve_plan([*argv, "--recompute_use_reentrant", "true"])
    assert check_reentrant_recompute_of_router_loss(reentrant.model_config, reentrant.training_args) == [
        "recompute_use_reentrant: true drops the gradient of qwen2_moe's load-balancing loss (its router logits "
        "are read in a forward hook, which reentrant recompute runs under no_grad); set recompute_use_reentrant "
        "false (paddlenlp's default), or router_aux_loss_coef 0"
    ]
    plain = resolve_plan(argv)  # paddlenlp's default: not reentrant
    assert check_reentrant_recompute_of_router_loss(plain.model_config, plain.training_args) == []
    dense = resolve_plan(
        ["config/llama/pretrain_demo_cpu.json", "--recompute", "true", "--recompute_use_reentrant", "true"]
    )
    assert check_reentrant_recompute_of_router_loss(dense.model_config, dense.training_args) == []


@pytest.mark.parametrize("stage, refused", [(3, True), (2, False), (1, False)])
def test_spike_rollback_under_sharding_stage3_is_refused(stage, refused):
    """Before: accepted; the first rollback crashed (`Tensor holds no memory` on rank 1, a gloo timeout on rank 0;
    on NCCL a hang until the watchdog): stage3 had released the parameters the checkpoint was loaded into."""
    plan = SimpleNamespace(
        layout=ParallelLayout(2, 1, sharding_parallel_degree=2, sharding_stage=stage),
        training_args=SimpleNamespace(loss_spike_policy="rollback"),
    )
    expected = ["loss_spike_policy: rollback cannot reload weights into sharding stage3's released parameters"]
    assert [line.split(" (they")[0] for line in check_spike_rollback_layout(plan)] == (expected if refused else [])
    plan.training_args.loss_spike_policy = "skip"
    assert check_spike_rollback_layout(plan) == []
