"""What a user sees of a run: the short header, one line per record with the ETA, a few summary lines,
the full configuration in run_config.json, no harmless third-party warnings, one final evaluation, an
MFU never above 1, and the VisualDL board (tags, hparams)."""

import glob
import json
import os
import re

import pytest
from conftest import REPO, resolve_plan, run_script
from tiny_run import tiny_args

from pretrain.log import KNOWN_HARMLESS_WARNINGS
from pretrain.preflight import warn_run
from pretrain.report import format_header

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

STEPS = 6


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, demo_dir):
    """A 6-step tiny run evaluating every 3 steps (so the last step is evaluated during training), against
    a peak of 1 GFLOP/s: the tiny model runs faster than that, so its MFU is not credible."""
    tmp = tmp_path_factory.mktemp("output")
    out, cache = str(tmp / "run"), str(tmp / "cache")
    extra = ["--do_eval", "true", "--evaluation_strategy", "steps", "--eval_steps", "3", "--eval_iters", "2"]
    extra += ["--peak_flops_per_card", "1e9", "--report_to", "visualdl"]
    result = run_script("run_pretrain.py", *tiny_args(out, cache, *extra, steps=STEPS, save_steps=3))
    assert result.returncode == 0, result.stderr[-3000:]
    return out, cache, result


def test_the_console_shows_a_header_records_with_eta_and_a_summary(tiny_run):
    _, _, result = tiny_run
    lines = (result.stdout + result.stderr).splitlines()
    assert len(lines) <= 25, "\n".join(lines)
    text = "\n".join(lines)
    shape = "num_hidden_layers 2, hidden_size 64, intermediate_size 128, num_attention_heads 4, num_key_value_heads 4"
    assert f"] model: llama (llama-debug with {shape}), 1.11 M parameters: 2 layers, hidden 64, 4 heads" in text
    assert "] layout: TP1PP1SH0SP1DP1 on 1 card(s); global batch 4 x 64 = 256 tokens; 6 steps = 1,536 tokens" in text
    assert "(every setting: run_config.json); resume from nothing (fresh start)" in text
    records = re.findall(r"\] step (\d+)/6 \| loss \d\.\d{4} \| lr [\d.e-]+ \|.* elapsed, ETA [\d:?]+$", text, re.M)
    assert records == [str(step) for step in range(1, STEPS + 1)]
    assert "MFU" not in "".join(line for line in lines if "] step " in line)  # not credible: not shown
    assert re.findall(r"\] eval at step (\d)/6 \| loss", text) == ["3", "6"]  # once at step 6, not twice
    assert "] done at step 6: train loss" in text
    # no argument dump, no index building chatter, no known harmless warnings
    assert re.search(r"\] saved the model to \S+ in [\d.]+ s$", text, re.M)  # ours, not paddlenlp's line too
    for noise in ("Training Configuration Arguments", "building dataset index", "number of samples", "Warning"):
        assert noise not in text
    assert "Saving model checkpoint to" not in text
    for pattern in KNOWN_HARMLESS_WARNINGS:
        assert not re.search(pattern, text, re.I), pattern


def test_run_config_holds_the_full_resolved_configuration(tiny_run):
    out, cache, _ = tiny_run
    with open(os.path.join(out, "run_config.json")) as f:
        config = json.load(f)
    training = config["training_arguments"]
    assert training["max_steps"] == STEPS and training["adam_beta2"] == 0.95  # from the command line; the JSON file
    assert training["peak_flops_per_card"] == 1e9
    assert training["weight_decay"] == 0.1 and "seed" in training and "lr_scheduler_type" in training  # defaults too
    assert config["data_arguments"]["data_cache"] == cache
    assert config["model_arguments"]["hidden_size"] == 64
    assert config["model_config"]["hidden_size"] == 64 and config["model_config"]["vocab_size"] == 8064
    assert config["num_parameters"] == 1_114_432
    assert config["layout"]["name"] == "TP1PP1SH0SP1DP1" and config["global_batch_tokens"] == 256
    assert config["resume_checkpoint"] is None


def test_one_final_evaluation_and_no_mfu_above_one(tiny_run):
    out, _, _ = tiny_run
    with open(os.path.join(out, "loss_history.json")) as f:
        history = json.load(f)
    assert [step for step, _ in history["eval"]] == [3, 6]  # no duplicate point at step 6
    with open(os.path.join(out, "run_summary.json")) as f:
        summary = json.load(f)
    assert summary["eval_loss"] == history["eval"][-1][1]
    assert summary["tokens_per_card_per_sec"] * summary["model_flops_per_token"] > 1e9  # faster than the "peak"
    assert summary["mfu"] is None
    assert summary["mfu_null_reason"].startswith("not credible: the run's model FLOP/s are ")
    assert "override: peak_flops_per_card" in summary["mfu_null_reason"]


def test_the_board_has_our_scalars_hparams_and_settings(tiny_run):
    from visualdl import LogReader

    out, _, _ = tiny_run
    (record,) = glob.glob(os.path.join(out, "runs", "*", "vdlrecords.*.log"))
    reader = LogReader(file_path=record)
    tags = reader.get_tags()
    assert sorted(tags["scalar"]) == [
        "train/learning_rate",
        "train/loss",
        "train/peak_memory_gib",
        "train/tokens_per_card_per_sec",
        "validation/loss",
    ]  # no train/mfu: never credible in this run
    assert tags["scalars"] == ["train/time_per_step"]  # the stacked time breakdown: one chart of several lines
    lines = {line.tag_value.tag for line in reader.get_data("scalars", "train/time_per_step")}
    assert {"1 data_wait", "2 +forward_backward", "5 +evaluation", "6 +checkpoint_save"} <= lines
    assert [r.id for r in reader.get_data("scalar", "validation/loss")] == [3, 6]
    (hparams,) = reader.get_data("hyper_parameters", "hparam")
    values = {info.name: getattr(info, info.WhichOneof("type")) for info in hparams.hparam.hparamInfos}
    assert values["model"] == "llama-debug" and values["layout"] == "TP1PP1SH0SP1DP1"
    assert values["global_batch_tokens"] == 256 and values["seq_length"] == 64 and values["learning_rate"] == 0.002
    assert [info.name for info in hparams.hparam.metricInfos] == [
        "train/loss",
        "validation/loss",
        "train/tokens_per_card_per_sec",
        "train/mfu",
    ]
    assert sorted(tags["text"]) == ["settings/data", "settings/model", "settings/model_config", "settings/training"]


def test_rerunning_a_finished_run_says_so_and_trains_nothing(tiny_run):
    out, cache, _ = tiny_run
    result = run_script("run_pretrain.py", *tiny_args(out, cache, steps=STEPS))  # would resume from checkpoint-6
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"] {out} already finished at step 6 (max_steps 6): nothing to train" in result.stdout
    assert "] step " not in result.stdout  # no training record
    assert len((result.stdout + result.stderr).splitlines()) <= 25


def test_resuming_with_a_larger_max_steps_warns_how_the_stretched_schedule_moves_the_rate(tiny_run):
    out, cache, _ = tiny_run
    plan = resolve_plan(tiny_args(out, cache, steps=2 * STEPS))
    assert plan.resume_checkpoint == os.path.join(out, "checkpoint-6")
    (line,) = [warning for warning in warn_run(plan) if warning.startswith("max_steps:")]
    assert line == (
        "max_steps: raised from 6 (the checkpoint's run) to 12, which stretches the cosine decay to end at step 12: "
        "the learning rate goes from 0.0002 at step 6 to 0.0011 at step 7 (0.0002 on the old schedule); "
        "set decay_steps 6 to keep the old one"
    )
    assert not [w for w in warn_run(resolve_plan(tiny_args(out, cache, steps=STEPS))) if w.startswith("max_steps")]


def test_captured_output_goes_to_a_file_and_to_stderr_on_failure(tmp_path, capfd):
    from pretrain.log import captured_stdout

    path = str(tmp_path / "out" / "data_build.rank0.log")
    with captured_stdout(path):
        print("from python")
        os.write(1, b"from C++\n")  # what the fast_dataindex helpers do
    assert capfd.readouterr().out == ""
    with open(path) as f:
        assert sorted(f.read().splitlines()) == ["from C++", "from python"]
    with pytest.raises(RuntimeError), captured_stdout(path):
        print("index building failed here")
        raise RuntimeError("boom")
    assert "index building failed here" in capfd.readouterr().err


def test_captured_output_reaches_the_file_as_it_is_printed(tmp_path):
    from pretrain.log import captured_stdout

    path = str(tmp_path / "data_build.rank0.log")
    with captured_stdout(path):
        print("building indices")
        os.write(1, b"from C++\n")
        print("still building")
        with open(path) as f:  # read while the block still runs (an index build that takes long, or waits)
            assert f.read().splitlines() == ["building indices", "from C++", "still building"]


def test_the_header_names_an_overridden_shape_by_its_family_and_the_overrides(tmp_path):
    demo = os.path.join(REPO, "config", "llama", "pretrain_demo_cpu.json")
    own = resolve_plan([demo, "--output_dir", str(tmp_path / "own")])
    assert format_header(own)[0].startswith("model: llama-debug (llama), 7.34 M parameters: 4 layers, hidden 256")
    shaped = resolve_plan([demo, "--output_dir", str(tmp_path / "shaped"), "--num_hidden_layers", "2"])
    assert format_header(shaped)[0].startswith(
        "model: llama (llama-debug with num_hidden_layers 2), 5.74 M parameters: 2 layers, hidden 256"
    )
