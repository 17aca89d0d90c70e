"""FLOPs per token, MFU (PaLM and nominal forms) and the peak FLOP/s table, against published numbers."""

import pytest
from conftest import pretrain_log_records

from pretrain.metrics import flops, hardware
from pretrain.metrics.hardware import (
    achievable_peak_flops,
    datasheet_peak_flops,
    gpu_name,
    measure_matmul_flops,
    resolve_peak_flops,
)
from pretrain.param_count import count_config_parameters
from pretrain.registry import find_model_size

A100 = "NVIDIA A100-SXM4-40GB"


def test_palm_flops_llama_7b():
    # LLaMA-7B: V 32000, h 4096, i 11008, L 32, H 32, Q 128; at T 2048. N by hand, lm_head counted:
    # 32 x (4·4096² + 3·4096·11008 + 2·4096) + 4096 (final norm) + 32000·4096 (lm_head) = 6,607,343,616
    config = find_model_size("llama-7b").model_config()
    assert flops.flops_parameters(config) == 6_607_343_616
    # 6N = 39,644,061,696; 12·L·H·Q·T = 12·32·32·128·2048 = 3,221,225,472
    assert flops.flops_per_token(6_607_343_616, 32, 32, 128, 2048) == 42_865_287_168
    assert flops.model_flops_per_token(config, 2048) == 42_865_287_168


def test_moe_flops_count_the_activated_parameters():
    """Mixtral-8x7B: N = the 12,879,925,248 activated parameters (2 of 8 experts, router, attention,
    lm_head) less the 32000 x 4096 input embedding; the 6 unused experts per layer cost a token nothing."""
    config = find_model_size("mixtral-8x7b").model_config()
    assert flops.flops_parameters(config) == 12_879_925_248 - 32000 * 4096 == 12_748_853_248
    unused = 32 * 6 * 3 * 4096 * 14336  # layers x unused experts x SwiGLU matrices
    assert count_config_parameters(config)[0] - count_config_parameters(config, activated=True)[0] == unused
    # 6N + 12·L·H·Q·T at T 4096
    assert flops.model_flops_per_token(config, 4096) == 6 * 12_748_853_248 + 12 * 32 * 32 * 128 * 4096


def test_qwen3_moe_flops_count_the_activated_experts_and_its_head_dim():
    """Qwen3-30B-A3B: N = the 3,353,032,704 activated parameters (8 of 128 experts, the router, attention with its
    head norms, lm_head: tests/test_param_count.py) less the 151,936 x 2,048 input embedding; the 120 unused
    experts per layer cost a token nothing; the attention term at its 32 heads of head_dim 128 (hidden / heads
    would be 64)."""
    config = find_model_size("Qwen/Qwen3-30B-A3B").model_config()
    assert flops.flops_parameters(config) == 3_353_032_704 - 151_936 * 2048 == 3_041_867_776
    unused = 48 * 120 * 3 * 2048 * 768  # layers x unused experts x SwiGLU matrices
    assert count_config_parameters(config)[0] - count_config_parameters(config, activated=True)[0] == unused
    assert flops.model_flops_per_token(config, 4096) == 6 * 3_041_867_776 + 12 * 48 * 32 * 128 * 4096


def test_deepseek_v2_lite_flops_count_activated_parameters_and_mla_head_widths():
    """By hand: N = 2,661,150,208 activated parameters (tests/test_param_count.py) less the 102,400 x 2,048 input
    embedding; MLA's scores use 128 + 64 = 192 query/key dims per head and its values 128, so the attention term
    is 6 x 27 layers x 16 heads x (192 + 128) x 4,096 tokens."""
    config = find_model_size("deepseek-ai/DeepSeek-V2-Lite").model_config()
    n = 2_661_150_208 - 102_400 * 2048
    assert flops.flops_parameters(config) == n
    assert flops.model_flops_per_token(config, 4096) == 6 * n + 6 * 27 * 16 * (192 + 128) * 4096


def test_deepseek_v3_flops_count_the_mtp_module_and_its_head_pass():
    """DeepSeek-V3 with its multi-token-prediction module (report section 2.2): N = the main model's 37,552,297,472
    activated parameters less the 129,280 x 7,168 input embedding, plus the module's 688,093,440 activated (one
    MoE layer, enorm, hnorm, eh_proj: tests/test_param_count.py) and one more pass of the shared output head
    (129,280 x 7,168); the attention term counts 61 + 1 layers. Without the module (num_nextn_predict_layers 0)
    the main model's alone."""
    config = find_model_size("deepseek-v3").model_config()
    head = 129_280 * 7168
    main = 37_552_297_472 - head
    assert flops.flops_parameters(config) == main + 688_093_440 + head == 38_240_390_912
    attention = 6 * 128 * (192 + 128) * 4096  # per layer
    assert flops.model_flops_per_token(config, 4096) == 6 * 38_240_390_912 + 62 * attention
    config.num_nextn_predict_layers = 0
    assert flops.model_flops_per_token(config, 4096) == 6 * main + 61 * attention


def test_qwen3_attention_term_uses_its_head_dim_not_hidden_over_heads():
    """Qwen3-0.6B: 16 heads of head_dim 128 on hidden 1024 (hidden / heads would be 64). N = the 596,049,920
    parameters (tests/test_param_count.py; tied: the embedding is also the output matmul); at T 4096 the
    attention term is 12 x 28 x 16 x 128 x 4096. Before, it read hidden / heads: 6N + 12 x 28 x 16 x 64 x 4096,
    1,409,286,144 FLOPs per token fewer (measured on this branch before the fix)."""
    config = find_model_size("Qwen/Qwen3-0.6B").model_config()
    assert flops.flops_parameters(config) == 596_049_920
    assert flops.model_flops_per_token(config, 4096) == 6 * 596_049_920 + 12 * 28 * 16 * 128 * 4096


def test_ernie4_5_0_3b_flops_use_its_head_dim():
    """ERNIE-4.5-0.3B: 16 heads of head_dim 128 on hidden 1024 (hidden / heads would be 64), tied. N = the
    360,748,032 parameters (tests/test_param_count.py); at T 4096 the attention term is 12 x 18 x 16 x 128 x 4096:
    3,976,427,520 FLOPs per token in all."""
    config = find_model_size("baidu/ERNIE-4.5-0.3B-PT").model_config()
    assert flops.flops_parameters(config) == 360_748_032
    assert flops.model_flops_per_token(config, 4096) == 6 * 360_748_032 + 12 * 18 * 16 * 128 * 4096 == 3_976_427_520


def test_ernie4_5_moe_flops_count_the_activated_and_shared_experts():
    """ERNIE-4.5-21B-A3B: N = the 3,352,150,208 activated parameters (6 of 64 experts and the 2 shared ones in 27
    layers, a dense layer 0, attention, the routers and their routing biases: tests/test_param_count.py), tied (the
    embedding is also the output matmul); the 58 unused experts per MoE layer cost a token nothing; at T 4096
    the attention term is 12 x 28 x 20 x 128 x 4096: 23,636,116,608 FLOPs per token in all."""
    config = find_model_size("baidu/ERNIE-4.5-21B-A3B-PT").model_config()
    assert flops.flops_parameters(config) == 3_352_150_208
    unused = 27 * 58 * 3 * 2560 * 1536  # MoE layers x unused experts x SwiGLU matrices
    assert count_config_parameters(config)[0] - count_config_parameters(config, activated=True)[0] == unused
    expected = 6 * 3_352_150_208 + 12 * 28 * 20 * 128 * 4096
    assert flops.model_flops_per_token(config, 4096) == expected == 23_636_116_608


def test_tied_output_layer_is_counted_once_and_positions_are_not():
    qwen2 = find_model_size("qwen2-debug").model_config()  # tied: the embedding is also the output matmul
    assert qwen2.tie_word_embeddings
    assert flops.flops_parameters(qwen2) == count_config_parameters(qwen2)[0]
    gpt = find_model_size("gpt3-debug").model_config()  # tied, plus a learned position table (a lookup)
    positions = gpt.max_position_embeddings * gpt.hidden_size
    assert flops.flops_parameters(gpt) == count_config_parameters(gpt)[0] - positions


@pytest.mark.parametrize("tokens_per_card_per_sec, published_mfu", [(2908, 0.391), (2868, 0.386)])
def test_nominal_mfu_matches_the_published_llama2_7b_figures(tokens_per_card_per_sec, published_mfu):
    # FlagPerf training/nvidia/llama2_7b-megatron-deepspeed: Llama-2-7B on A100-40G,
    # MFU = tokens/card/s x 6 x 7e9 / 312e12.
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


def test_mfu_above_one_is_never_reported_and_says_why():
    # 1,000 tokens/s x 34.8 MFLOPs per token = 34.8 GFLOP/s against a peak measured at 11 GFLOP/s on a busy
    # machine: 3.2x the "peak" (the MFU of 1.56 in the log and 127.1% in a benchmark row)
    assert flops.mfu(1000, 34.8e6, 11e9) > 3
    assert flops.mfu_or_none(1000, 34.8e6, 11e9) is None
    reason = flops.mfu_null_reason(1000, 34.8e6, 11e9, "measured: float32 matmul on cpu")
    assert reason.startswith("not credible: the run's model FLOP/s are 3.16x the peak of 0.011 TFLOP/s")
    assert "measured: float32 matmul on cpu" in reason and "peak_flops_per_card" in reason
    assert flops.mfu_or_none(1000, 11e6, 11e9) == flops.MFU_CREDIBLE_MAX == 1.0  # exactly at the peak: allowed
    assert flops.mfu_null_reason(1000, 11e6, 11e9) is None
    assert "peak_flops_per_card" in flops.mfu_null_reason(1000, 34.8e6, None)
    assert "nominal_params" in flops.mfu_null_reason(1000, None, 11e9)
    assert "warm-up" in flops.mfu_null_reason(None, 34.8e6, 11e9)


@pytest.mark.parametrize(
    "device_name, peak",
    [
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
    ],
)
def test_datasheet_peaks(device_name, peak):
    assert datasheet_peak_flops(device_name).flops_per_sec == peak


@pytest.mark.parametrize(
    "device_name, peak",
    [
        ("NVIDIA A100-SXM4-40GB", 156e12),
        ("NVIDIA A800-SXM4-80GB", 156e12),
        ("NVIDIA H100 80GB HBM3", 494.5e12),
        ("NVIDIA H100 PCIe", 378e12),
        ("NVIDIA H200 NVL", 417.5e12),
    ],
)
def test_datasheet_tf32_peaks_for_float32_runs(device_name, peak):
    tf32 = datasheet_peak_flops(device_name, half=False)
    assert tf32.flops_per_sec == peak and tf32.source.endswith("tf32 dense (float32 matmuls run as TF32)")


def test_every_gpu_of_the_table_has_a_tf32_peak_of_half_its_16_bit_one():
    # on A100/A800 and Hopper the datasheets' TF32 tensor-core rate is half the bf16/fp16 one
    for _, spec in hardware.GPU_SPECS:
        assert hardware.TF32_PEAK_FLOPS[spec.datasheet_name] == spec.peak_flops_per_sec / 2, spec.part


def test_the_run_precision_picks_the_gpu_peak(monkeypatch):
    monkeypatch.setattr(hardware, "gpu_name", lambda: A100)
    assert resolve_peak_flops(None, half=True) == (312e12, "datasheet: A100 bf16/fp16 dense")
    assert resolve_peak_flops(None, half=False).flops_per_sec == 156e12
    assert resolve_peak_flops(200e12, half=False) == (200e12, "override: peak_flops_per_card")


def test_a_peak_override_that_differs_from_the_card_wins_with_one_warning(monkeypatch):
    monkeypatch.setattr(hardware, "gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    with pretrain_log_records() as messages:
        assert resolve_peak_flops(312e12, half=True) == (312e12, "override: peak_flops_per_card")
        assert resolve_peak_flops(989e12, half=True) == (989e12, "override: peak_flops_per_card")  # agrees: silent
        assert resolve_peak_flops(None, half=True) == (989e12, "datasheet: H100 SXM bf16/fp16 dense")
    assert messages == [
        "peak_flops_per_card 3.12e+14 differs from the datasheet: H100 SXM bf16/fp16 dense figure of this card "
        "(NVIDIA H100 80GB HBM3): MFU divides by peak_flops_per_card; unset it to use the card's"
    ]


@pytest.mark.parametrize("device_name", ["NVIDIA H20", "NVIDIA RTX A1000", "Tesla V100-SXM2-32GB", "cpu"])
def test_unknown_devices_have_no_datasheet_peak(device_name):
    assert datasheet_peak_flops(device_name) is None


@pytest.mark.skipif(gpu_name() is not None, reason="checks the CPU path: no datasheet entry")
def test_resolve_peak_flops_on_cpu():
    assert resolve_peak_flops(123e12, half=False) == (123e12, "override: peak_flops_per_card")
    assert resolve_peak_flops(None, half=False).definition == "physical"  # tests/test_time_breakdown.py: its derivation
    assert achievable_peak_flops(measure_peak_flops=False) is None
    measured = achievable_peak_flops(measure_peak_flops=True)
    assert measured.definition == "measured"
    assert measured.source.startswith("measured: float32 matmul on cpu, best of 3 sizes x 3; load average ")
    # any CPU of this century does > 0.1 GFLOP/s; a 2-socket AVX-512 server about 10 TFLOP/s in float32
    assert 1e8 < measured.flops_per_sec < 2e13


def test_measure_matmul_flops_is_a_rate():
    assert 1e6 < measure_matmul_flops(sizes=(128, 256), repeats=2, min_seconds=0.02) < 1e15


def test_measure_matmul_flops_keeps_the_best_trial(monkeypatch):
    # other jobs only slow a trial down: the peak is the fastest trial over every size and round
    trial_rates = iter([30e9, 80e9, 50e9, 20e9, 60e9, 70e9])
    calls = []

    def fake_trial(a, b, min_seconds):
        calls.append((a.shape[0], min_seconds))
        return next(trial_rates)

    monkeypatch.setattr(hardware, "_timed_matmuls", fake_trial)
    assert measure_matmul_flops(sizes=(8, 16), repeats=3, min_seconds=0.5) == 80e9
    assert calls == [(8, 0.5), (16, 0.5)] * 3  # rounds over all sizes in turn
