"""Preflight: the dry run (config, model size, data summary, nothing built), the parameter formula,
and how the largest token id is found (sidecar, full scan, bounded scan)."""

import json
import os

import numpy as np
import paddle
import pytest
from conftest import DEMO_DIR, count_parameters, run_script
from tiny_run import tiny_args

from pretrain import preflight
from pretrain.arguments import parse_arguments
from pretrain.modeling import build_model
from pretrain.preflight import summarize_prefix

DEMO_PREFIX = os.path.join(DEMO_DIR, "demo_text_document")


def _demo_max_token_id() -> int:
    return int(np.memmap(DEMO_PREFIX + ".bin", dtype=np.uint16, mode="r").max())


def test_dry_run_prints_config_model_and_data_and_builds_nothing(tmp_path, demo_dir):
    out, cache = tmp_path / "out", tmp_path / "cache"
    result = run_script("run_pretrain.py", *tiny_args(str(out), str(cache), "--dry_run", "true"))
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout
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
    model_args, data_args, training_args = parse_arguments(tiny_args("/tmp/unused", "/tmp/unused"))
    report = preflight.PreflightReport()
    assert preflight._model_problems(model_args, data_args, training_args, report) == []
    paddle.seed(0)
    model = build_model(model_args, training_args, report.model_config)
    assert report.num_parameters == count_parameters(model)[0]
    # fp32 weights + two fp32 Adam moments = 12 bytes per parameter
    assert report.checkpoint_bytes == 12 * report.num_parameters


def _linked_demo(tmp_path) -> str:
    prefix = str(tmp_path / "demo")
    for suffix in (".bin", ".idx"):
        os.symlink(DEMO_PREFIX + suffix, prefix + suffix)
    return prefix


def test_sidecar_is_used_instead_of_scanning(tmp_path, demo_dir):
    prefix = _linked_demo(tmp_path)
    with open(prefix + ".stats.json", "w") as f:  # written by create_pretraining_data.py
        json.dump({"max_token_id": 7777, "dtype": "uint16", "vocab_size": 8000}, f)
    summary, problems = summarize_prefix(prefix, "949,50,1", vocab_size=8064, need_valid=True)
    assert problems == []
    assert (summary.max_token_id, summary.max_token_id_source) == (7777, "sidecar")
    summary, problems = summarize_prefix(prefix, "949,50,1", vocab_size=7000, need_valid=True)
    assert len(problems) == 1 and "holds token id 7777 but the model has 7000 embedding rows" in problems[0]


def test_stale_sidecar_is_reported(tmp_path, demo_dir):
    prefix = _linked_demo(tmp_path)
    with open(prefix + ".stats.json", "w") as f:
        json.dump({"max_token_id": 7777, "dtype": "int32", "vocab_size": 8000}, f)
    _, problems = summarize_prefix(prefix, "949,50,1", vocab_size=8064, need_valid=True)
    assert len(problems) == 1 and "stale" in problems[0]


def test_scan_without_sidecar_is_bounded(tmp_path, demo_dir, monkeypatch):
    prefix = _linked_demo(tmp_path)
    monkeypatch.setattr(preflight, "SCAN_BYTES", 2**20)  # the demo .bin is 4.7 MiB: read 1 MiB per end
    tokens = np.memmap(DEMO_PREFIX + ".bin", dtype=np.uint16, mode="r")
    per_end = 2**20 // 2
    expected = max(int(tokens[:per_end].max()), int(tokens[-per_end:].max()))
    summary, _ = summarize_prefix(prefix, "949,50,1", vocab_size=8064, need_valid=True)
    assert summary.max_token_id == expected
    assert summary.max_token_id_source.startswith("bounded scan of the first and last 1 MiB")


@pytest.mark.parametrize("fp16_opt_level, expected_bytes", [("O1", 12), ("O2", 2 + 8 + 4)])
def test_checkpoint_estimate(fp16_opt_level, expected_bytes):
    # bf16 O2 keeps bf16 weights, fp32 Adam moments and an fp32 master copy; O1 keeps fp32 weights.
    args = type("Args", (), {"fp16_opt_level": fp16_opt_level, "bf16": True, "fp16": False})()
    assert preflight.checkpoint_bytes(1000, args) == 1000 * expected_bytes
