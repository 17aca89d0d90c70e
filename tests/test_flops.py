"""FLOPs per token, MFU (PaLM and nominal forms) and the peak FLOP/s table, against published numbers."""

import json
import os

import pytest
from paddlenlp.transformers import AutoConfig, AutoModelForCausalLM

from conftest import REPO
from pretrain import flops
from pretrain.hardware import datasheet_peak_flops, gpu_name, measure_matmul_flops, resolve_peak_flops
from pretrain.modeling import count_parameters

A100 = "NVIDIA A100-SXM4-40GB"


def llama_params(vocab: int, hidden: int, intermediate: int, layers: int) -> tuple:
    """(total, input embedding) parameters of an untied LLaMA, by hand.

    Per layer: q, k, v, o projections 4·h² + gate, up, down 3·h·i + two RMSNorm weights 2·h;
    then the final norm h, the input embedding V·h and the untied lm_head V·h.
    """
    per_layer = 4 * hidden * hidden + 3 * hidden * intermediate + 2 * hidden
    embedding = vocab * hidden
    return layers * per_layer + hidden + 2 * embedding, embedding


def test_hand_count_matches_a_real_llama():
    with open(os.path.join(REPO, "config/llama/demo-model/config.json")) as f:
        c = json.load(f)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(os.path.join(REPO, "config/llama/demo-model")))
    assert count_parameters(model) == llama_params(c["vocab_size"], c["hidden_size"], c["intermediate_size"],
                                                   c["num_hidden_layers"])


def test_palm_flops_llama_7b():
    # LLaMA-7B: V 32000, h 4096, i 11008, L 32, H 32, Q 128, T 2048; 6,738,415,616 parameters in all.
    total, embedding = llama_params(32000, 4096, 11008, 32)
    assert total == 6_738_415_616
    n = total - embedding  # lm_head counted: 6,607,343,616
    # 6N = 39,644,061,696; 12·L·H·Q·T = 12·32·32·128·2048 = 3,221,225,472
    assert flops.flops_per_token(n, 32, 32, 128, 2048) == 42_865_287_168


def test_model_flops_per_token_reads_the_config():
    config = AutoConfig.from_pretrained(os.path.join(REPO, "config/llama/demo-model"))
    # demo model: L 4, H 4, Q 64; 6·1000 + 12·4·4·64·256
    assert flops.model_flops_per_token(config, 1000, 256) == 6000 + 12 * 4 * 4 * 64 * 256


@pytest.mark.parametrize("tokens_per_card_per_sec, published_mfu", [(2908, 0.391), (2868, 0.386)])
def test_nominal_mfu_matches_the_published_llama2_7b_figures(tokens_per_card_per_sec, published_mfu):
    # REFERENCE.md: Megatron-DeepSpeed Llama-2-7B on A100-40G, MFU = tokens/card/s x 6 x 7e9 / 312e12.
    peak = datasheet_peak_flops(A100).flops_per_sec
    value = flops.mfu(tokens_per_card_per_sec, flops.nominal_flops_per_token(7e9), peak)
    assert round(value, 3) == published_mfu


def test_mfu_or_none_and_bad_peak():
    assert flops.mfu_or_none(None, 1.0, 1.0) is None
    assert flops.mfu_or_none(1.0, None, 1.0) is None
    assert flops.mfu_or_none(1.0, 1.0, None) is None
    assert flops.mfu_or_none(2.0, 3.0, 12.0) == 0.5
    with pytest.raises(ValueError, match="peak_flops_per_card"):
        flops.mfu(1.0, 1.0, 0.0)


@pytest.mark.parametrize("device_name, peak", [
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A100 80GB PCIe", 312e12),
    ("NVIDIA A800-SXM4-80GB", 312e12),
    ("NVIDIA H100 80GB HBM3", 989e12),
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H800", 989e12),
    ("NVIDIA H800 PCIe", 756e12),
    ("NVIDIA H200", 989e12),
    ("NVIDIA H200 NVL", 835e12),
])
def test_datasheet_peaks(device_name, peak):
    assert datasheet_peak_flops(device_name).flops_per_sec == peak


@pytest.mark.parametrize("device_name", ["NVIDIA H20", "NVIDIA RTX A1000", "Tesla V100-SXM2-32GB", "cpu"])
def test_unknown_devices_have_no_datasheet_peak(device_name):
    assert datasheet_peak_flops(device_name) is None


@pytest.mark.skipif(gpu_name() is not None, reason="checks the CPU path: no datasheet entry")
def test_resolve_peak_flops_on_cpu():
    assert resolve_peak_flops(123e12, measure_peak_flops=True) == (123e12, "override: peak_flops_per_card")
    assert resolve_peak_flops(None, measure_peak_flops=False) is None
    measured = resolve_peak_flops(None, measure_peak_flops=True)
    assert measured.source.startswith("measured: float32 matmul")
    assert measured.flops_per_sec > 1e8  # any CPU of this century does > 0.1 GFLOP/s


def test_measure_matmul_flops_is_a_rate():
    assert 1e6 < measure_matmul_flops(size=128, min_seconds=0.05) < 1e15
