"""continue_training: a saved tiny model resumes with its own weights, and mismatches are refused."""

import os
import re
import shutil

import paddle
import pytest
from conftest import REPO, load_script, resolve_plan
from tiny_run import SHORT_DEMO_RUN

from pretrain.arguments import parse_arguments
from pretrain.checkpoint import mark_complete
from pretrain.data import build_datasets, collate_causal_lm
from pretrain.errors import UserError
from pretrain.layout import ParallelLayout
from pretrain.model import build_model, saved_weights_problem
from pretrain.model_config import build_model_config
from pretrain.preflight import check_resume_architecture

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

DEMO = os.path.join(REPO, "config", "llama", "pretrain_demo_cpu.json")
BATCH = 4
SHORT_RUN = SHORT_DEMO_RUN  # batch 4 (BATCH) x 128 tokens


def _run(tmp_path, name, *args) -> tuple:
    """(output_dir, run summary) of run_pretrain.py's main on the demo config, in this process."""
    out = tmp_path / name
    argv = [DEMO, "--output_dir", str(out), "--data_cache", str(tmp_path / "cache"), *SHORT_RUN, *args]
    return out, load_script("run_pretrain.py").main(argv)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, demo_dir):
    """A llama-debug model trained for 4 steps and saved by the Trainer (save_pretrained)."""
    out, _ = _run(tmp_path_factory.mktemp("saved"), "saved", "--max_steps", "4")
    return out


@pytest.mark.slow
def test_first_loss_equals_the_saved_models_loss(saved_model, tmp_path):
    continued = ("--model_name_or_path", str(saved_model), "--continue_training", "true", "--max_steps", "2")
    out, summary = _run(tmp_path, "continued", *continued)
    first_loss = summary["train_loss_first"]

    # The saved model's loss on the continued run's first batch (the sampler reads in order).
    argv = [DEMO, "--output_dir", str(out), "--data_cache", str(tmp_path / "cache"), *SHORT_RUN, *continued]
    plan = resolve_plan(argv)
    model = build_model(plan)
    train, _, _ = build_datasets(plan)
    batch = collate_causal_lm([train[i] for i in range(BATCH)])
    with paddle.no_grad():
        loss = model(paddle.to_tensor(batch["input_ids"]), labels=paddle.to_tensor(batch["labels"]))[0]
    assert first_loss == pytest.approx(float(loss), rel=1e-5)
    assert first_loss < 8.0  # trained weights, not a fresh init (ln 8064 = 9.0)


def _continue_args(path, *extra):
    return parse_arguments([DEMO, "--model_name_or_path", str(path), "--continue_training", "true", *extra])


@pytest.mark.slow
def test_architecture_mismatch_is_one_line(saved_model, tmp_path):
    mismatch = ("--model_name_or_path", str(saved_model), "--continue_training", "true", "--num_hidden_layers", "2")
    with pytest.raises(UserError) as error:
        _run(tmp_path, "mismatch", "--max_steps", "2", *mismatch)
    assert str(error.value) == (
        f"continue_training: {saved_model} holds a model with num_hidden_layers 4, but this run asks for 2; "
        "drop the num_hidden_layers override to continue it, or set continue_training false"
    )


@pytest.mark.slow
def test_vocab_mismatch_is_refused(saved_model):
    model_args, data_args, training_args = _continue_args(saved_model, "--vocab_size", "16000")
    with pytest.raises(UserError, match="holds a model with vocab_size 8064, but this run asks for 16000"):
        build_model_config(model_args, data_args, training_args, 8000)


def test_directory_without_weights_is_refused(tmp_path):
    build_model_config(*parse_arguments([DEMO]), 8000).save_pretrained(str(tmp_path))
    plan = resolve_plan([DEMO, "--model_name_or_path", str(tmp_path), "--continue_training", "true"])
    assert re.match(
        r"continue_training: .* holds no weights \(none of model.safetensors",
        saved_weights_problem(str(tmp_path), plan.layout),
    )


def test_a_saved_config_with_other_token_ids_gets_the_tokenizers_with_one_line_and_the_header_names_the_weights(
    tmp_path,
):
    """A Qwen2 config.json with paddlenlp's default ids (bos = eos = 151643, past the demo vocabulary; what every
    Qwen2 run saved until now) continued with the demo tokenizer: the run's config takes the tokenizer's (<s> 1,
    </s> 2), preflight's warnings name both, and the header names the weights the run starts from.

    Today's main: the config keeps 151643 for the run to save again, no warning, and the header's last line ends
    "resume from nothing (fresh start)"."""
    from pretrain.preflight import warn_run
    from pretrain.report import format_header

    qwen2 = os.path.join(REPO, "config", "qwen2", "pretrain_demo_cpu.json")
    saved = build_model_config(*parse_arguments([qwen2]), 8000)
    assert (saved.bos_token_id, saved.eos_token_id) == (151643, 151643)  # the registry's, as paddlenlp has them
    saved.save_pretrained(str(tmp_path))
    plan = resolve_plan([qwen2, "--model_name_or_path", str(tmp_path), "--continue_training", "true"])
    assert (plan.model_config.bos_token_id, plan.model_config.eos_token_id) == (1, 2)
    assert (
        f"continue_training: {tmp_path}/config.json has bos_token_id 151643 (the tokenizer's: 1), eos_token_id "
        "151643 (the tokenizer's: 2); the run saves the tokenizer's, which its data ends documents with"
    ) in warn_run(plan)
    assert format_header(plan)[-1].endswith(f"resume from nothing (weights from {tmp_path}: continue_training)")
    fresh = resolve_plan([qwen2])
    assert not [line for line in warn_run(fresh) if "token_id" in line]
    assert format_header(fresh)[-1].endswith("resume from nothing (fresh start)")


def test_an_end_of_text_list_holding_the_tokenizers_agrees():
    """Llama 3 Instruct's config.json names three end-of-text ids; the tokenizer's <|eot_id|> among them is no
    difference, a tokenizer without a BOS token leaves the saved one be."""
    from types import SimpleNamespace

    from pretrain.model_config import set_token_ids, token_id_differences

    config = SimpleNamespace(bos_token_id=128000, eos_token_id=[128001, 128008, 128009])
    assert token_id_differences(config, {"bos_token_id": 128000, "eos_token_id": 128009}) == {}
    assert token_id_differences(config, {"bos_token_id": None, "eos_token_id": 2}) == {
        "eos_token_id": ([128001, 128008, 128009], 2)
    }
    set_token_ids(config, {"bos_token_id": None, "eos_token_id": 2}, from_scratch=False)
    assert (config.bos_token_id, config.eos_token_id) == (128000, 2)
    set_token_ids(config, {"bos_token_id": None, "eos_token_id": 2}, from_scratch=True)
    assert (config.bos_token_id, config.eos_token_id) == (None, 2)


def test_directory_without_config_is_refused(tmp_path):
    model_args, data_args, training_args = _continue_args(tmp_path)
    with pytest.raises(UserError, match=r"has no config.json; give a directory saved by save_pretrained"):
        build_model_config(model_args, data_args, training_args, 8000)


def _touch(folder, *names):
    for name in names:
        (folder / name).write_bytes(b"")


@pytest.mark.parametrize(
    "files, tp, pp, loads",
    [
        (["model_state.pdparams"], 4, 2, True),  # merged: paddlenlp splits it for any layout
        (["model.safetensors.index.json"], 2, 1, True),  # unified checkpoint, sharded safetensors
        (["model_state.tp00.pdparams", "model_state.tp01.pdparams"], 2, 1, True),
        (["model_state.tp00.pdparams", "model_state.tp01.pdparams"], 4, 1, False),  # rank 2, 3 have nothing
        (["model_state.tp00.pdparams", "model_state.tp01.pdparams"], 1, 1, False),  # no merged file
        ([f"model_state.tp0{t}_pp0{p}.pdparams" for t in range(2) for p in range(4)], 2, 4, True),
        ([f"model.tp0{t}.safetensors" for t in range(2)], 2, 1, True),
    ],
)
def test_per_rank_weights_load_only_into_the_layout_that_saved_them(tmp_path, files, tp, pp, loads):
    _touch(tmp_path, "config.json", *files)
    layout = ParallelLayout(world_size=tp * pp, nnodes=1, tensor_parallel_degree=tp, pipeline_parallel_degree=pp)
    problem = saved_weights_problem(str(tmp_path), layout)
    if loads:
        assert problem is None
    else:
        assert f"than this run's TP{tp}PP{pp}" in problem and "unified_checkpoint true" in problem


@pytest.mark.slow
def test_resuming_a_checkpoint_of_another_shape_is_one_line(saved_model, tmp_path):
    """Without the check paddle refuses the weights after the index and model are built, with a traceback."""
    out = tmp_path / "run"
    shutil.copytree(saved_model, out / "checkpoint-2")  # the saved model's config.json and weights
    mark_complete(str(out / "checkpoint-2"), 2)
    argv = [DEMO, "--output_dir", str(out), "--data_cache", str(tmp_path / "cache"), *SHORT_RUN, "--max_steps", "4"]
    plan = resolve_plan(argv)
    assert plan.resume_checkpoint == str(out / "checkpoint-2") and check_resume_architecture(plan) == []
    (problem,) = check_resume_architecture(resolve_plan([*argv, "--num_hidden_layers", "3"]))
    assert problem.startswith("num_hidden_layers: this run asks for 3, but ") and "checkpoint-2" in problem
    assert "keep num_hidden_layers 4" in problem  # llama-debug: 4 layers and "\n" not in problem
    assert (
        check_resume_architecture(resolve_plan([*argv, "--num_hidden_layers", "3", "--overwrite_output_dir", "true"]))
        == []
    )
