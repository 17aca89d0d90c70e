"""The native encoders preprocessing uses: the library's own ids for every text, paddlenlp's for ordinary text.

Each family is checked against a reference built here from the library itself (not from
pretrain.preprocess.native), on real text: the demo corpus, Chinese, emoji, whitespace runs and
special-token strings, which must stay text.
"""

import json
import os
import shutil

import numpy as np
import pytest
import sentencepiece
from tokenizers import ByteLevelBPETokenizer, Tokenizer

from pretrain.preprocess.native import (
    LLAMA3_PATTERN,
    LLAMA3_SPECIAL_TOKENS,
    QWEN_PATTERN,
    QWEN_SPECIAL_TOKENS,
    load_encoder,
)
from pretrain.tokenizers import load_tokenizer_from

SPECIAL_TEXT = (
    "a <s> b </s> c <|endoftext|> d <|im_start|>user\nhi<|im_end|> <unk> [INST] <|extra_0|> "
    "<|begin_of_text|>e<|end_of_text|> <|start_header_id|>f<|end_header_id|>\n\ng<|eot_id|>"
)
HARD = [
    SPECIAL_TEXT,
    "<s>",
    "</s>\n",
    "spaces    and\ttabs\t\t and\n\n\nnewlines   ",
    "  leading and trailing  ",
    "今天天气很好。我们去公园散步吧！北京是中国的首都。",
    "emoji 😀👍🏽 👨‍👩‍👧 and ﬁ ligature, café, ｆｕｌｌ width",
    "code:\n    def f(x):\n        return x  # 42\n",
]


@pytest.fixture(scope="module")
def texts(demo_dir):
    """30 real documents of the demo corpus (Shakespeare, KJV) plus the hard cases."""
    with open(os.path.join(demo_dir, "corpus.jsonl"), encoding="utf-8") as f:
        return [json.loads(line)["text"] for line, _ in zip(f, range(30))] + HARD


def references(name: str, folder: str):
    """The library's plain encode of one text for tokenizer ``name``, built from the folder's files here."""
    if name == "mistral":
        return sentencepiece.SentencePieceProcessor(model_file=os.path.join(folder, "tokenizer.model")).encode
    if name == "gpt2":
        bpe = ByteLevelBPETokenizer(os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt"))
        return lambda text: bpe.encode(text, add_special_tokens=False).ids
    if name == "llama3":  # the Rust library on the published tokenizer.json, special tokens as text
        rust = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        rust.encode_special_tokens = True
        return lambda text: rust.encode(text, add_special_tokens=False).ids
    encoding = load_tokenizer_from(folder).tokenizer  # the tiktoken Encoding paddlenlp's QWenTokenizer builds
    return encoding.encode_ordinary


def per_text(encoder, texts: list) -> list:
    ids, lengths = encoder.encode(texts)
    assert ids.ndim == 1 and lengths.tolist() and lengths.sum() == ids.size
    return [chunk.tolist() for chunk in np.split(ids, np.cumsum(lengths)[:-1])]


@pytest.mark.parametrize("name", ["mistral", "gpt2", "qwen", "llama3"])
def test_ids_equal_the_library_encoding_special_tokens_are_text(real_tokenizers, texts, name):
    encoder = load_encoder(real_tokenizers[name])
    reference = references(name, real_tokenizers[name])
    assert per_text(encoder, texts) == [reference(text) for text in texts]
    assert [encoder.reference_encode(text) for text in HARD] == [reference(text) for text in HARD]
    special = per_text(encoder, [SPECIAL_TEXT])[0]
    assert (
        encoder.eos_token_id not in special
        and max(special) < {"mistral": 32000, "gpt2": 50256, "qwen": 151643, "llama3": 128000}[name]
    )


@pytest.mark.parametrize("name", ["mistral", "gpt2", "qwen"])
def test_ids_equal_paddlenlp_for_ordinary_text(real_tokenizers, texts, name):
    tokenizer = load_tokenizer_from(real_tokenizers[name])
    encoder = load_encoder(real_tokenizers[name])
    ordinary = [text for text in texts if text not in (SPECIAL_TEXT, "<s>", "</s>\n")]
    assert per_text(encoder, ordinary) == [tokenizer.encode(t, add_special_tokens=False)["input_ids"] for t in ordinary]
    assert (encoder.vocab_size, encoder.eos_token_id) == (len(tokenizer), tokenizer.eos_token_id)
    # what preprocessing avoids: the wrapper turns the text "</s>" / "<|endoftext|>" into the EOS id
    assert tokenizer.eos_token_id in tokenizer.encode(SPECIAL_TEXT, add_special_tokens=False)["input_ids"]


def test_demo_tokenizer_matches_paddlenlp(demo_dir, texts):
    folder = os.path.join(demo_dir, "tokenizer")
    tokenizer, encoder = load_tokenizer_from(folder), load_encoder(folder)
    assert per_text(encoder, texts[:30]) == [
        tokenizer.encode(t, add_special_tokens=False)["input_ids"] for t in texts[:30]
    ]
    assert (encoder.library, encoder.vocab_size, encoder.eos_token_id) == ("sentencepiece", 8000, 2)


def test_qwen_constants_are_paddlenlp_s():
    from paddlenlp.transformers.qwen import tokenizer as qwen

    assert QWEN_PATTERN == qwen.PAT_STR and QWEN_SPECIAL_TOKENS == qwen.SPECIAL_TOKENS


def test_llama3_constants_are_paddlenlp_s_and_the_published_tokenizer_json_s(real_tokenizers):
    from paddlenlp.transformers.llama import tokenizer as llama

    assert LLAMA3_PATTERN == llama.PAT_STR and LLAMA3_SPECIAL_TOKENS == llama.SPECIAL_TOKENS
    with open(os.path.join(real_tokenizers["llama3"], "tokenizer.json"), encoding="utf-8") as f:
        published = json.load(f)
    assert [(t["id"], t["content"]) for t in published["added_tokens"]] == list(
        enumerate(LLAMA3_SPECIAL_TOKENS, 128000)
    )
    assert published["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == LLAMA3_PATTERN


def test_other_tokenizer_classes_go_through_paddlenlp_with_special_tokens_as_text(demo_dir, tmp_path):
    # T5Tokenizer is no family of ours: any SentencePiece model loads as one, with </s> and <extra_id_N> specials.
    shutil.copy(os.path.join(demo_dir, "tokenizer", "sentencepiece.bpe.model"), tmp_path / "spiece.model")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer"}))
    encoder = load_encoder(str(tmp_path))
    plain = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "spiece.model")).encode
    text = "hello </s> world <extra_id_0> end"
    assert encoder.library == "paddlenlp" and per_text(encoder, [text]) == [plain(text)]
    assert encoder.eos_token_id == 2 and 2 not in plain(text)
