"""The SentencePiece tokenizer trainer writes a folder paddlenlp's AutoTokenizer loads, and it round-trips."""

import json

import pytest
from paddlenlp.transformers import LlamaTokenizer

from pretrain.preprocess.arguments import TokenizerTrainingArguments
from pretrain.preprocess.sp_tokenizer import train_tokenizer
from pretrain.tokenizers import load_tokenizer_from

TEXTS = [
    "To be, or not to be, that is the question:",
    "In the beginning God created the heaven and the earth.",
    "Numbers 1234 and unusual glyphs \u00e9\u00e8 \u4e2d\u6587 survive via byte fallback.",
]


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory, demo_dir):
    folder = tmp_path_factory.mktemp("tok")
    corpus = folder / "corpus.jsonl"
    with open(f"{demo_dir}/corpus.jsonl", encoding="utf-8") as src, open(corpus, "w", encoding="utf-8") as dst:
        for _, line in zip(range(300), src):
            dst.write(line)
    return load_tokenizer_from(
        train_tokenizer(TokenizerTrainingArguments(str(corpus), str(folder / "tokenizer"), vocab_size=1000))
    )


def test_trained_tokenizer_loads_as_llama_tokenizer(small_tokenizer):
    assert isinstance(small_tokenizer, LlamaTokenizer)
    assert len(small_tokenizer) == 1000
    assert (small_tokenizer.unk_token_id, small_tokenizer.bos_token_id, small_tokenizer.eos_token_id) == (0, 1, 2)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(small_tokenizer, text):
    ids = small_tokenizer.encode(text, add_special_tokens=False)["input_ids"]
    assert ids and max(ids) < 1000
    assert small_tokenizer.decode(ids, clean_up_tokenization_spaces=False) == text


def test_demo_tokenizer_round_trips_the_corpus(demo_dir):
    tokenizer = load_tokenizer_from(f"{demo_dir}/tokenizer")
    with open(f"{demo_dir}/corpus.jsonl", encoding="utf-8") as f:
        text = json.loads(f.readline())["text"]
    ids = tokenizer.encode(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, clean_up_tokenization_spaces=False) == text
    assert len(text) / len(ids) > 3.0  # an 8000-piece BPE compresses English to > 3 characters per token
