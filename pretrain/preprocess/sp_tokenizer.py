"""Train a LLaMA-style SentencePiece BPE tokenizer and save it as a paddlenlp ``LlamaTokenizer`` folder.

The folder holds ``sentencepiece.bpe.model`` (the file name ``LlamaTokenizer`` looks for) and
``tokenizer_config.json`` (so ``AutoTokenizer.from_pretrained(folder)`` picks ``LlamaTokenizer``).
Special ids follow LLaMA: ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, no pad; byte fallback on (a newline is
``<0x0A>``), digits split, no normalization, so decode(encode(text)) == text.
"""

from __future__ import annotations

import os
import re

import sentencepiece as spm

from pretrain.atomic import atomic_outputs, write_json
from pretrain.errors import UserError
from pretrain.preprocess.jsonl import iter_texts

MODEL_FILE = "sentencepiece.bpe.model"
# tokenizer_config.json of a LLaMA-format SentencePiece folder: LLaMA's special pieces, and no BOS/EOS
# added by encode (preprocessing appends EOS by id; see pretrain.preprocess.native).
LLAMA_TOKENIZER_CONFIG = {
    "tokenizer_class": "LlamaTokenizer",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "add_bos_token": False,
    "add_eos_token": False,
}
# SentencePiece silently skips training sentences longer than this (bytes), so lines are fed instead.
MAX_SENTENCE_BYTES = 4192


def _training_lines(jsonl_path: str, json_key: str):
    for text in iter_texts(jsonl_path, json_key):
        for line in text.split("\n"):
            line = line.strip()
            if line and len(line.encode("utf-8")) <= MAX_SENTENCE_BYTES:
                yield line


def _trainer_reason(error: RuntimeError) -> str:
    """SentencePiece's reason without its source location: ``INTERNAL: src/x.cc(638) [check] Reason.`` ->
    ``Reason.`` (the failed check when it gives no reason)."""
    match = re.match(r"^\w+: \S+\(\d+\) \[(.*?)\]\s*(.*)$", str(error).strip(), re.S)
    return (match.group(2) or match.group(1)) if match else str(error).strip()


def train_tokenizer(args) -> str:
    """Train BPE on the lines of a jsonl corpus; write the tokenizer folder; return its path.

    Args:
        args: a ``pretrain.preprocess.arguments.TokenizerTrainingArguments`` (input, output_dir,
            vocab_size: pieces with the special and 256 byte-fallback ones, json_key, num_threads,
            max_lines: lines sampled for training at most, which bounds memory).

    Raises:
        UserError: the corpus holds no line of text, or SentencePiece cannot train ``vocab_size`` pieces
            on it (fewer than its distinct characters, or more than its text yields); its reason is given.
    """
    os.makedirs(args.output_dir, exist_ok=True)
    model_path = os.path.join(args.output_dir, MODEL_FILE)
    fed = 0

    def lines():
        nonlocal fed
        for line in _training_lines(args.input, args.json_key):
            fed += 1
            yield line

    with atomic_outputs(model_path) as (tmp_model,):
        try:
            _train(lines(), tmp_model, args)
        except RuntimeError as error:  # SentencePiece's checks fail as RuntimeError("INTERNAL: ...")
            if not fed:
                raise UserError(
                    f"--input {args.input}: no line of text under '{args.json_key}' to train on; "
                    "give a jsonl corpus with text (or the --json_key that holds it)"
                ) from None
            raise UserError(
                f"--vocab_size {args.vocab_size}: SentencePiece cannot train it on {args.input}: "
                f"{_trainer_reason(error)}"
            ) from None
        os.replace(tmp_model + ".model", tmp_model)
        os.remove(tmp_model + ".vocab")
    write_json(os.path.join(args.output_dir, "tokenizer_config.json"), LLAMA_TOKENIZER_CONFIG, indent=2)
    return args.output_dir


def _train(lines, model_prefix: str, args) -> None:
    """SentencePiece BPE on ``lines``, written to ``<model_prefix>.model`` and ``.vocab``."""
    spm.SentencePieceTrainer.train(
        sentence_iterator=lines,
        model_prefix=model_prefix,
        model_type="bpe",
        vocab_size=args.vocab_size,
        character_coverage=1.0,
        byte_fallback=True,
        split_digits=True,
        normalization_rule_name="identity",  # keep text as is: newlines, spacing, Unicode forms
        remove_extra_whitespaces=False,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=args.num_threads,
        input_sentence_size=args.max_lines,
        shuffle_input_sentence=True,
        minloglevel=2,
    )
