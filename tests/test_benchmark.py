"""tools/benchmark.py: runs a config and writes the published-format row, a loss-curve PNG and raw JSON."""

import json

import pytest
from conftest import load_script, run_script
from tiny_run import CONFIG, TINY_MODEL

from pretrain.errors import UserError

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def load_tool():
    return load_script("tools/benchmark.py")


def test_row_in_the_published_format():
    benchmark = load_tool()
    summary = {  # FlagPerf's Megatron-DeepSpeed Llama-2-7B case, as our summary would carry it
        "precision": "bf16 O2",
        "per_device_train_batch_size": 1,
        "gradient_accumulation_steps": 512,
        "global_batch_samples": 1024,
        "seq_length": 4096,
        "steps_run_this_process": 100,
        "throughput_warmup_steps": 1,
        "parallel_strategy": "TP4PP1SH0SP1DP2",
        "world_size": 8,
        "tokens_per_card_per_sec": 2908.0,
        "peak_memory_gib": 32.0,
        "peak_memory_kind": "gpu_max_allocated",
        "mfu": 0.40,
        "mfu_nominal": 0.3914,
        "peak_flops_per_card": 312e12,
        "peak_flops_source": "datasheet: A100 bf16/fp16 dense",
        "train_loss_last": 7.86,
        "global_step": 100,
    }
    row = benchmark.markdown_row("config/llama/pretrain-llama2-7b.json", summary)
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert len(cells) == len(benchmark.COLUMNS) == 8
    assert cells[0] == "pretrain-llama2-7b"
    assert cells[2] == "mbs 1, gas 512, gbs 1024 x 4096 tokens, 100 steps (1 warm-up)"
    assert cells[3] == "TP4PP1SH0SP1DP2, 8 card(s)"
    assert cells[4] == "2908.0"
    assert cells[5] == "32.00 GiB (gpu_max_allocated)"
    assert cells[6].startswith("40.0% (PaLM; peak 312 TFLOP/s") and cells[6].endswith("39.1% nominal")
    assert cells[7] == "7.860 at step 100"


def test_a_row_never_publishes_an_mfu_above_100_percent():
    # the row: 127.1% against a peak measured at 11 GFLOP/s on a busy machine; the summary holds null
    reason = "not credible: the run's model FLOP/s are 1.27x the peak of 0.011 TFLOP/s per card (measured: ...)"
    summary = {
        "precision": "fp32",
        "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 1,
        "global_batch_samples": 16,
        "seq_length": 256,
        "steps_run_this_process": 10,
        "throughput_warmup_steps": 1,
        "parallel_strategy": "TP1PP1SH0SP1DP1",
        "world_size": 1,
        "tokens_per_card_per_sec": 401.0,
        "peak_memory_gib": 1.6,
        "peak_memory_kind": "cpu_peak_rss",
        "mfu": None,
        "mfu_null_reason": reason,
        "mfu_nominal": None,
        "peak_flops_per_card": 11e9,
        "peak_flops_source": "measured: float32 matmul on cpu",
        "train_loss_last": 6.842,
        "global_step": 10,
    }
    cells = [cell.strip() for cell in load_tool().markdown_row("pretrain_demo_cpu.json", summary).strip("|").split("|")]
    assert cells[6] == f"n/a ({reason})"


def test_missing_config_is_a_user_error(tmp_path):
    result = run_script("tools/benchmark.py", str(tmp_path / "nope.json"))
    assert result.returncode == 2 and "does not exist" in result.stderr


def test_a_failing_run_is_a_user_error(tmp_path, capfd):
    argv = ["config/llama/pretrain_demo_cpu.json", "--steps", "2", "--output_dir", str(tmp_path)]
    with pytest.raises(UserError, match="failed with exit status 2"):
        load_tool().main([*argv, "--max_sequence_length", "64"])
    assert "unknown key 'max_sequence_length'" in capfd.readouterr().err  # run_pretrain.py's own message


@pytest.mark.slow
def test_benchmark_the_demo_config(tmp_path, demo_dir):
    out = tmp_path / "bench"
    result = run_script(
        "tools/benchmark.py",
        CONFIG,
        "--steps",
        "4",
        "--output_dir",
        str(out),
        *TINY_MODEL,
        "--per_device_train_batch_size",
        "4",
        "--warmup_steps",
        "2",
        "--do_eval",
        "false",
        "--evaluation_strategy",
        "no",
        "--data_cache",
        str(tmp_path / "cache"),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    with open(out / "run" / "run_summary.json") as f:
        summary = json.load(f)
    with open(out / "benchmark.json") as f:
        raw = json.load(f)
    assert raw["summary"] == summary
    assert [step for step, _ in raw["loss_history"]["train"]] == [1, 2, 3, 4]  # logging_steps 1
    assert raw["hardware"].startswith("CPU")

    table = (out / "benchmark.md").read_text().splitlines()
    assert table[0].startswith("Hardware: CPU")
    assert table[2] == "| config | precision | fix_hp | parallel_strategy | tokens/card/s | memory | MFU | loss |"
    assert table[4] == raw["row"]
    cells = [cell.strip() for cell in raw["row"].strip("|").split("|")]
    assert cells[:2] == ["pretrain_demo_cpu", "fp32"]
    assert float(cells[4]) == pytest.approx(summary["tokens_per_card_per_sec"], abs=0.06)
    assert "physical: " in cells[6]  # the CPU's peak from /proc/cpuinfo, whatever the load
    assert 0 < summary["mfu"] <= 1 and cells[6].startswith(f"{100 * summary['mfu']:.1f}% (PaLM; peak ")
    assert (out / "loss_curve.png").read_bytes()[:8] == PNG_SIGNATURE
