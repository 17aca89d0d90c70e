"""Train a LLaMA-style SentencePiece BPE tokenizer and save it as a paddlenlp ``LlamaTokenizer`` folder.

The folder holds ``sentencepiece.bpe.model`` (the file name ``LlamaTokenizer`` looks for) and
``tokenizer_config.json`` (so ``AutoTokenizer.from_pretrained(folder)`` picks ``LlamaTokenizer``).
Special ids follow LLaMA: ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, no pad; byte fallback on (a newline is
``<0x0A>``), digits split, no normalization, so decode(encode(text)) == text.
"""

from __future__ import annotations

import json
import os

import sentencepiece as spm

from pretrain.atomic import atomic_outputs
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


def train_tokenizer(args) -> str:
    """Train BPE on the lines of a jsonl corpus; write the tokenizer folder; return its path.

    Args:
        args: a ``pretrain.preprocess.arguments.TokenizerTrainingArguments`` (input, output_dir,
            vocab_size: pieces with the special and 256 byte-fallback ones, json_key, num_threads,
            max_lines: lines sampled for training at most, which bounds memory).
    """
    os.makedirs(args.output_dir, exist_ok=True)
    model_path = os.path.join(args.output_dir, MODEL_FILE)
    with atomic_outputs(model_path) as (tmp_model,):
        spm.SentencePieceTrainer.train(
            sentence_iterator=_training_lines(args.input, args.json_key),
            model_prefix=tmp_model,  # writes <prefix>.model and <prefix>.vocab
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
        os.replace(tmp_model + ".model", tmp_model)
        os.remove(tmp_model + ".vocab")
    with open(os.path.join(args.output_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(LLAMA_TOKENIZER_CONFIG, f, indent=2)
    return args.output_dir
