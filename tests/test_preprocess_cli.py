"""PaddleNLP's documented create_pretraining_data.py command lines run unchanged (local folders for hub names).

The command lines are those of PaddleNLP's llm/tools/preprocess README and its docs/OpenWebText2.md,
CLUECorpusSmall.md and WuDaoCorpusBase.md, flag for flag; only the hub model names and the paths
are replaced by local ones.
"""

import dataclasses
import json
import os
import re
import shlex

import pytest
import zstandard
from conftest import run_script

from pretrain.preprocess.arguments import PretrainingDataArguments, parse

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

SCRIPT = "tools/preprocess/create_pretraining_data.py"
# PaddleNLP's commands after `python -u create_pretraining_data.py`; {model} is a local tokenizer folder.
LLAMA_COMMANDS = {
    "README baike": '--model_name "{model}" --tokenizer_name "LlamaTokenizer" --input_path "baike_sample.jsonl" '
    '--output_prefix "baike_sample" --data_format "JSON" --json_key "text" --data_impl "mmap" --append_eos '
    "--log_interval 5 --workers 40",
    "OpenWebText2": "--model_name {model} --tokenizer_name LlamaTokenizer --data_format JSON "
    "--input_path ./openwebtext/ --append_eos --output_prefix llama_openwebtext --workers 40 --log_interval 10000 "
    '--data_impl "mmap"',
    "CLUECorpusSmall": '--model_name "{model}" --tokenizer_name "LlamaTokenizer" --input_path "baike_sample.jsonl" '
    '--output_prefix "clue_corpus_small_14g" --data_format "JSON" --json_key "text" --data_impl "mmap" '
    "--append_eos --log_interval 10000 --workers 48",
    "WuDaoCorpusBase": '--model_name "{model}" --input_path "baike_sample.jsonl" --output_prefix "wudao_corpus_200g" '
    '--data_format "JSON" --json_key "text" --data_impl "mmap" --append_eos --log_interval 10000 --workers 48',
}
ERNIE_COMMAND = (
    '--model_name "ernie-3.0-base-zh" --tokenizer_name "ErnieTokenizer" --input_path "baike_sample.jsonl" '
    '--output_prefix "baike_sample" --data_format "JSON" --json_key "text" --split_sentences --data_impl "mmap" '
    '--chinese --cn_whole_word_segment --cn_seg_func "jieba" --log_interval 5 --workers 40'
)
TEXTS = [
    "飞桨是功能完备、开源开放的产业级深度学习平台。",
    "PaddleNLP是自然语言处理领域的优秀工具。",
    "An English line, too.",
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A folder holding baike_sample.jsonl and openwebtext/ (the same documents as two .jsonl.zst shards)."""
    folder = tmp_path_factory.mktemp("paddlenlp")
    lines = [json.dumps({"text": text}, ensure_ascii=False).encode() + b"\n" for text in TEXTS * 20]
    (folder / "baike_sample.jsonl").write_bytes(b"".join(lines))
    (folder / "openwebtext").mkdir()
    for i, part in enumerate((lines[:30], lines[30:])):
        (folder / "openwebtext" / f"part{i}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b"".join(part)))
    return folder


def read_bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_paddlenlp_llama_commands_write_what_our_flags_write(inputs, real_tokenizers):
    model = real_tokenizers["mistral"]
    ours = run_script(
        SCRIPT,
        *("--input_path", "baike_sample.jsonl", "--tokenizer_name_or_path", model, "--output_prefix", "ours"),
        cwd=str(inputs),
    )
    assert ours.returncode == 0, ours.stderr
    for name, command in LLAMA_COMMANDS.items():
        args = shlex.split(command.format(model=model))
        result = run_script(SCRIPT, *args, cwd=str(inputs))
        assert result.returncode == 0, (name, result.stderr[-2000:])
        prefix = inputs / args[args.index("--output_prefix") + 1]
        for suffix in (".bin", ".idx"):  # PaddleNLP's names for --output_prefix, in the working directory
            assert read_bytes(f"{prefix}{suffix}") == read_bytes(inputs / f"ours{suffix}"), (name, suffix)


def test_paddlenlp_defaults_and_values_have_their_meaning(real_tokenizers):
    command = shlex.split(LLAMA_COMMANDS["WuDaoCorpusBase"].format(model=real_tokenizers["mistral"]))
    args = parse(PretrainingDataArguments, command + ["--max_doc_num", "7", "--max_repeated_len", "3"])
    assert (args.tokenizer_name_or_path, args.input_path, args.workers, args.log_interval) == (
        real_tokenizers["mistral"],
        "baike_sample.jsonl",
        48,
        10000,
    )
    assert (args.append_eos, args.max_doc_num, args.max_repeated_len, args.data_impl) == (True, 7, 3, "mmap")
    assert parse(PretrainingDataArguments, command + ["--append_eos", "false"]).append_eos is False
    assert parse(PretrainingDataArguments, command + ["--no_append_eos"]).append_eos is False


@pytest.mark.parametrize(
    "command, message",
    [
        (
            ERNIE_COMMAND,
            r"--cn_whole_word_segment: Chinese whole-word segmentation marks BERT/ERNIE tokens.*drop the flag",
        ),
        (
            LLAMA_COMMANDS["CLUECorpusSmall"].replace('"{model}"', "idea-ccnl/ziya-llama-13b-v1"),
            r"tokenizer_name_or_path: idea-ccnl/ziya-llama-13b-v1 is not a directory; point it at a local folder",
        ),
        (
            LLAMA_COMMANDS["OpenWebText2"]
            .replace("{model}", "meta-llama/Llama-2-7b")
            .replace("./openwebtext/", "baike_sample.jsonl"),
            r"names the llama-2-7b architecture .* offline source: Meta's model is on the model hub only",
        ),
        (
            LLAMA_COMMANDS["README baike"].replace('"mmap"', '"lazy"'),
            r"--data_impl lazy: only mmap is written",
        ),
        (
            LLAMA_COMMANDS["README baike"].replace('"LlamaTokenizer"', "GPTTokenizer"),
            r"--tokenizer_name GPTTokenizer: .*tokenizer_config.json names LlamaTokenizer",
        ),
        (  # would write the hidden files out/.bin and out/.idx
            LLAMA_COMMANDS["README baike"].replace('"baike_sample"', "out/"),
            r"--output_prefix 'out/' names a folder, .*hidden files .*; give a file prefix such as out/name",
        ),
        (  # an existing folder, without the trailing separator
            LLAMA_COMMANDS["README baike"].replace('--output_prefix "baike_sample"', "--output_prefix ."),
            r"--output_prefix '.' names a folder, .*; give a file prefix such as ./name",
        ),
    ],
)
def test_what_cannot_be_honoured_is_one_line(inputs, real_tokenizers, tmp_path, command, message):
    (tmp_path / "baike_sample.jsonl").write_bytes(read_bytes(inputs / "baike_sample.jsonl"))
    command = command.replace("{model}", real_tokenizers["mistral"])
    result = run_script(SCRIPT, *shlex.split(command), cwd=str(tmp_path))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert re.match(f"error: .*{message}", lines[0]), lines[0]
    assert os.listdir(tmp_path) == ["baike_sample.jsonl"]


def test_every_flag_is_documented():
    from conftest import REPO

    with open(os.path.join(REPO, "docs", "dataset.md"), encoding="utf-8") as f:
        table = [line for line in f if line.startswith("| `--")]
    for spec in dataclasses.fields(PretrainingDataArguments):
        assert any(f"`--{spec.name}`" in line for line in table), spec.name
