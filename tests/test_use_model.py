"""docs/models.md "Use your model": a run's output loads with AutoModelForCausalLM / AutoTokenizer and
generates; safetensors from --unified_checkpoint and from save_pretrained; the generate(input_ids=...)
pitfall that the docs describe."""

import os

import numpy as np
import pytest
from conftest import run_script
from tiny_run import tiny_args

MAX_NEW_TOKENS = 6


@pytest.fixture(scope="module")
def trained(tmp_path_factory, demo_dir):
    """A 4-step tiny run saving its model as safetensors (unified_checkpoint)."""
    tmp = tmp_path_factory.mktemp("use_model")
    out = str(tmp / "run")
    extra = ["--unified_checkpoint", "true", "--report_to", "none", "--measure_peak_flops", "false"]
    result = run_script("run_pretrain.py", *tiny_args(out, str(tmp / "cache"), *extra, steps=4, save_steps=100))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _load(folder: str):
    from paddlenlp.transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    model.eval()
    return tokenizer, model


def _generate(model, inputs) -> list:
    ids, _ = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, decode_strategy="greedy_search")
    return ids[0].tolist()


def test_load_and_generate_as_documented(trained):
    import paddle

    assert "model.safetensors.index.json" in os.listdir(trained)  # --unified_checkpoint true
    tokenizer, model = _load(trained)
    assert type(model).__name__ == "LlamaForCausalLM"
    inputs = tokenizer("ROMEO:", return_tensors="pd")
    new_ids = _generate(model, inputs)
    assert len(new_ids) == MAX_NEW_TOKENS  # the new tokens only
    assert isinstance(tokenizer.decode(new_ids), str)
    with paddle.no_grad():  # greedy: the first new token is the trained model's most likely next token
        logits = model(**inputs)[0]
    assert new_ids[0] == int(np.argmax(logits[0, -1].numpy()))


def test_generate_with_input_ids_alone_fails_as_documented(trained):
    tokenizer, model = _load(trained)
    inputs = tokenizer("ROMEO:", return_tensors="pd")
    # a reshape or a concat of the [1, 1, 1, 5] mask fails, depending on USE_CASUAL_MASK (run_pretrain.py sets it);
    # if this stops failing, update docs/models.md
    with pytest.raises(ValueError, match=r"\(InvalidArgument\).*\[1, 1, 1, 5\]"):
        model.generate(input_ids=inputs["input_ids"], max_new_tokens=2, decode_strategy="greedy_search")
    ids, _ = model.generate(
        input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=2
    )  # the workaround
    assert ids.shape == [1, 2]


def test_save_pretrained_converts_to_safetensors(trained, tmp_path):
    tokenizer, model = _load(trained)
    model.save_pretrained(str(tmp_path), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp_path))
    assert "model.safetensors" in os.listdir(tmp_path)
    inputs = tokenizer("ROMEO:", return_tensors="pd")
    assert _generate(_load(str(tmp_path))[1], inputs) == _generate(model, inputs)
