"""continue_training: a saved tiny model resumes with its own weights, and mismatches are refused."""

import json
import os

import paddle
import pytest
from conftest import REPO, run_script

from pretrain.arguments import parse_arguments
from pretrain.data import build_datasets, collate_causal_lm
from pretrain.errors import UserError
from pretrain.modeling import build_model, build_model_config
from pretrain.tokenizers import load_tokenizer

DEMO = os.path.join(REPO, "config", "llama", "pretrain_demo_cpu.json")
BATCH = 4
SHORT_RUN = (
    "--warmup_steps",
    "2",
    "--logging_steps",
    "1",
    "--per_device_train_batch_size",
    str(BATCH),
    "--max_seq_length",
    "128",
    "--do_eval",
    "false",
    "--evaluation_strategy",
    "no",
    "--save_steps",
    "1000",
)


def _run(tmp_path, name, *args):
    out = tmp_path / name
    result = run_script(
        "run_pretrain.py", DEMO, "--output_dir", str(out), "--data_cache", str(tmp_path / "cache"), *SHORT_RUN, *args
    )
    return out, result


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, demo_dir):
    """A llama-debug model trained for 4 steps and saved by the Trainer (save_pretrained)."""
    tmp_path = tmp_path_factory.mktemp("saved")
    out, result = _run(tmp_path, "saved", "--max_steps", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.mark.slow
def test_first_loss_equals_the_saved_models_loss(saved_model, tmp_path):
    continued = ("--model_name_or_path", str(saved_model), "--continue_training", "true", "--max_steps", "2")
    out, result = _run(tmp_path, "continued", *continued)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out / "run_summary.json") as f:
        first_loss = json.load(f)["train_loss_first"]

    # The saved model's loss on the continued run's first batch (the sampler reads in order).
    argv = [DEMO, "--output_dir", str(out), "--data_cache", str(tmp_path / "cache"), *SHORT_RUN, *continued]
    model_args, data_args, training_args = parse_arguments(argv)
    config = build_model_config(model_args, data_args, training_args, len(load_tokenizer(model_args)))
    model = build_model(model_args, training_args, config)
    train, _, _ = build_datasets(data_args, training_args)
    batch = collate_causal_lm([train[i] for i in range(BATCH)])
    with paddle.no_grad():
        loss = model(paddle.to_tensor(batch["input_ids"]), labels=paddle.to_tensor(batch["labels"]))[0]
    assert first_loss == pytest.approx(float(loss), rel=1e-5)
    assert first_loss < 8.0  # trained weights, not a fresh init (ln 8064 = 9.0)


def _continue_args(path, *extra):
    return parse_arguments([DEMO, "--model_name_or_path", str(path), "--continue_training", "true", *extra])


@pytest.mark.slow
def test_architecture_mismatch_is_one_line(saved_model, tmp_path):
    _, result = _run(
        tmp_path,
        "mismatch",
        "--model_name_or_path",
        str(saved_model),
        "--continue_training",
        "true",
        "--max_steps",
        "2",
        "--num_hidden_layers",
        "2",
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: continue_training: {saved_model} holds a model with num_hidden_layers 4, but this run asks for 2; "
        "drop the num_hidden_layers override to continue it, or set continue_training false"
    )


@pytest.mark.slow
def test_vocab_mismatch_is_refused(saved_model):
    model_args, data_args, training_args = _continue_args(saved_model, "--vocab_size", "16000")
    with pytest.raises(UserError, match="holds a model with vocab_size 8064, but this run asks for 16000"):
        build_model_config(model_args, data_args, training_args, 8000)


def test_directory_without_weights_is_refused(tmp_path):
    paddle_config = build_model_config(*parse_arguments([DEMO]), 8000)
    paddle_config.save_pretrained(str(tmp_path))
    model_args, data_args, training_args = _continue_args(tmp_path)
    config = build_model_config(model_args, data_args, training_args, 8000)
    with pytest.raises(UserError, match=r"continue_training: .* holds no weights \(none of model.safetensors"):
        build_model(model_args, training_args, config)


def test_directory_without_config_is_refused(tmp_path):
    model_args, data_args, training_args = _continue_args(tmp_path)
    with pytest.raises(UserError, match=r"has no config.json; give a directory saved by save_pretrained"):
        build_model_config(model_args, data_args, training_args, 8000)
