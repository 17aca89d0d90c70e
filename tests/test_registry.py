"""The registry: names and hub-style aliases resolve offline to the right paddlenlp classes and configs."""

import os
import re
from dataclasses import replace

import pytest
from conftest import REPO
from paddlenlp.transformers import (
    GPTForCausalLM,
    GPTForCausalLMPipe,
    LlamaForCausalLM,
    LlamaForCausalLMPipe,
    Qwen2ForCausalLM,
    QWenForCausalLM,
)

from pretrain import registry
from pretrain.errors import UserError
from pretrain.hf_export import export
from pretrain.model import model_class_for
from pretrain.model_config import resolve_model_config
from pretrain.param_count import count_config_parameters
from pretrain.registry import FAMILIES, MODEL_SIZES, find_model_size
from pretrain.tokenizers import load_tokenizer_from


@pytest.mark.parametrize(
    "alias, name",
    [
        ("meta-llama/Llama-2-7b", "llama-2-7b"),
        ("facebook/llama-7b", "llama-7b"),
        ("qwen/qwen-7b", "qwen-7b"),
        ("Qwen/Qwen-7B", "qwen-7b"),
        ("Qwen/Qwen2-0.5B", "qwen2-0.5b"),
        ("baichuan-inc/Baichuan2-7B-Base", "baichuan2-7b"),
        ("baichuan-inc/Baichuan-13B-Base", "baichuan-13b"),
        ("meta-llama/Meta-Llama-3-8B", "llama-3-8b"),
        ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
        ("meta-llama/Meta-Llama-3.1-405B", "llama-3.1-405b"),
        ("meta-llama/Llama-3.2-1B", "llama-3.2-1b"),
        ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.3-70b"),
        ("Qwen/Qwen2.5-72B", "qwen2.5-72b"),
        ("gpt3-13B-en", "gpt3-13b"),
        ("LLaMA-65B", "llama-65b"),
    ],
)
def test_alias_resolves(alias, name):
    assert find_model_size(alias).name == name


def test_names_and_aliases_are_unique():
    keys = [key.lower() for arch in MODEL_SIZES.values() for key in (arch.name, *arch.aliases)]
    assert len(keys) == len(set(keys))


def test_every_family_has_a_debug_size_and_every_entry_a_source():
    assert {arch.family for arch in MODEL_SIZES.values() if arch.name.endswith("-debug")} == set(FAMILIES)
    for arch in MODEL_SIZES.values():
        assert arch.family in FAMILIES and arch.source
        assert (arch.published_params is None) == arch.name.endswith("-debug")


@pytest.mark.parametrize(
    "name, model_class, alibi",
    [
        ("llama-2-7b", LlamaForCausalLM, False),
        ("baichuan-7b", LlamaForCausalLM, False),
        ("baichuan2-13b", LlamaForCausalLM, True),  # Baichuan 13B: ALiBi instead of RoPE
        ("qwen-14b", QWenForCausalLM, None),
        ("qwen2-7b", Qwen2ForCausalLM, None),
        ("gpt3-175b", GPTForCausalLM, None),
    ],
)
def test_family_maps_to_paddlenlp_class(name, model_class, alibi):
    config = resolve_model_config(name, continue_training=False)
    assert model_class_for(config, pipeline_parallel_degree=1) is model_class
    assert getattr(config, "alibi", None) == alibi


def test_pipeline_parallel_uses_the_pipe_class():
    assert model_class_for(resolve_model_config("llama-7b", False), 4) is LlamaForCausalLMPipe
    assert model_class_for(resolve_model_config("gpt3-6.7b", False), 2) is GPTForCausalLMPipe


def test_gqa_and_tying_reach_the_config():
    llama3 = resolve_model_config("meta-llama/Meta-Llama-3-70B", False)
    assert (llama3.num_key_value_heads, llama3.rope_theta, llama3.vocab_size) == (8, 500000.0, 128256)
    assert resolve_model_config("qwen2-0.5b", False).tie_word_embeddings is True
    assert resolve_model_config("gpt3-1.3b", False).ignore_index == -100  # paddlenlp's default 0 drops token 0


def test_unknown_name_suggests_close_ones():
    with pytest.raises(
        UserError, match=r"'llama-2-7' is neither a local directory nor a registry name; did you mean 'llama-2-7b'"
    ):
        resolve_model_config("llama-2-7", continue_training=False)


def test_continue_training_from_a_registry_name_is_refused():
    with pytest.raises(UserError, match=r"continue_training needs saved weights.*llama-2-7b"):
        resolve_model_config("meta-llama/Llama-2-7b", continue_training=True)


@pytest.mark.parametrize(
    "name, files",
    [
        ("meta-llama/Llama-2-7b", "sentencepiece.bpe.model"),
        ("gpt3-6.7b", "vocab.json, merges.txt"),
        ("qwen/qwen-7b", "qwen.tiktoken"),
    ],
)
def test_tokenizer_from_a_registry_name_says_which_files(name, files):
    with pytest.raises(UserError, match=rf"tokenizer_config.json, {files} \(\w+Tokenizer; offline source"):
        load_tokenizer_from(name)


def test_docs_table_lists_every_architecture_with_its_count():
    with open(os.path.join(REPO, "docs", "models.md")) as f:
        rows = {line.split("|")[2].strip(" `"): line for line in f if line.startswith("| ") and "`" in line}
    for arch in MODEL_SIZES.values():
        assert arch.name in rows, arch.name
        total, _ = count_config_parameters(arch.model_config())
        count = f"{total / 1e9:.2f}B" if total >= 1e9 else f"{total / 1e6:.1f}M"
        assert count in rows[arch.name], (arch.name, count)


# A comparison with, membership test on, or table lookup by a model_type: what the registry record replaces.
MODEL_TYPE_TEST = re.compile(r"model_type\s*(==|!=|in\s|not\s+in\s)|\[[^\]\n]*model_type\]|\.get\([\w.]*model_type\b")


# The modules that may: the registry and the family modules it gathers.
MODEL_TYPE_MODULES = (os.path.join(REPO, "pretrain", "registry.py"), os.path.join(REPO, "pretrain", "families", ""))


def _model_type_tests(text: str) -> list:
    return [line.strip() for line in text.splitlines() if MODEL_TYPE_TEST.search(line)]


def test_only_the_registry_and_the_family_modules_test_model_type():
    """Every per-model-type fact lives in its ``Implementation`` record (its module in pretrain/families/), read
    through ``registry.implementation_for``: no other module of the application compares, looks up or lists a
    model_type."""
    assert _model_type_tests(
        'if config.model_type == "gpt":\n    x = TABLE[config.model_type]\n    y = T.get(model_type, 1)'
    ) == [
        'if config.model_type == "gpt":',
        "x = TABLE[config.model_type]",
        "y = T.get(model_type, 1)",
    ]
    found = {}
    for folder in ("pretrain", "tools"):
        for root, _, names in os.walk(os.path.join(REPO, folder)):
            for name in names:
                path = os.path.join(root, name)
                if name.endswith(".py") and not path.startswith(MODEL_TYPE_MODULES):
                    with open(path, encoding="utf-8") as f:
                        if lines := _model_type_tests(f.read()):
                            found[os.path.relpath(path, REPO)] = lines
    assert found == {}


def test_export_refuses_a_model_type_without_a_hugging_face_format(tmp_path, monkeypatch):
    """``Implementation.hf`` defaults to None (a new type may have no transformers class): export says so."""
    monkeypatch.setitem(registry.IMPLEMENTATIONS, "llama", replace(registry.IMPLEMENTATIONS["llama"], hf=None))
    find_model_size("llama-debug").model_config().save_pretrained(str(tmp_path / "model"))
    with pytest.raises(UserError, match=r"model_type llama has no HFFormat in pretrain.registry"):
        export(str(tmp_path / "model"), str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out") and not os.path.exists(str(tmp_path / "out") + ".partial")
