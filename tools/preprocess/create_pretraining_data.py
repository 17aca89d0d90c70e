"""Tokenize a jsonl corpus into <output_prefix>.bin/.idx (+ .stats.json) for run_pretrain.py.

    python tools/preprocess/create_pretraining_data.py --input data/demo/corpus.jsonl \\
        --tokenizer_name_or_path data/demo/tokenizer --output_prefix data/demo/demo_text_document --workers 2

Input: a .jsonl, .jsonl.gz or .jsonl.zst file, or a folder of them (read in sorted order), one
JSON object per line with the text under --json_key. Output: paddlenlp's mmap indexed dataset
(uint16 tokens when the vocabulary fits, else int32) and a stats sidecar; see docs/dataset.md.
"""

import argparse

from pretrain.errors import run_cli
from pretrain.preprocess.indexed import DTYPES
from pretrain.preprocess.pipeline import create_pretraining_data


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="A .jsonl/.jsonl.gz/.jsonl.zst file or a folder of them.")
    parser.add_argument(
        "--tokenizer_name_or_path",
        required=True,
        help="Local tokenizer folder: tokenizer_config.json + sentencepiece.bpe.model or tokenizer.model "
        "(LLaMA), vocab.json + merges.txt (GPT-3/GPT-2), or qwen.tiktoken (Qwen).",
    )
    parser.add_argument(
        "--output_prefix", required=True, help="Writes <prefix>.bin, <prefix>.idx and <prefix>.stats.json."
    )
    parser.add_argument("--json_key", default="text", help="Field of each JSON line holding the document text.")
    parser.add_argument(
        "--append_eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="End every document with the tokenizer's EOS id.",
    )
    parser.add_argument(
        "--split_sentences",
        action="store_true",
        help="Store each sentence as its own item (sentencex, offline); documents stay documents.",
    )
    parser.add_argument(
        "--language", default="en", help="Language code for --split_sentences, e.g. en or zh (any sentencex language)."
    )
    parser.add_argument("--workers", type=int, default=1, help="Tokenizing processes (count).")
    parser.add_argument(
        "--max_doc_num", type=int, default=None, help="Stop after this many documents (count; default: all)."
    )
    parser.add_argument(
        "--on_bad_line",
        choices=("skip", "fail"),
        default="skip",
        help="Lines that are not UTF-8, not JSON, lack --json_key or hold an empty document: "
        "skip them (counted and reported with file:line) or fail at the first.",
    )
    parser.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        default=None,
        help="Token dtype of the .bin; default uint16 when the vocabulary has <= 65536 ids, else int32.",
    )
    parser.add_argument("--no_progress", action="store_true", help="Hide the progress bar.")
    args = parser.parse_args(argv)
    create_pretraining_data(
        input_path=args.input,
        tokenizer_name_or_path=args.tokenizer_name_or_path,
        output_prefix=args.output_prefix,
        json_key=args.json_key,
        append_eos=args.append_eos,
        split_sentences=args.split_sentences,
        language=args.language,
        workers=args.workers,
        max_doc_num=args.max_doc_num,
        on_bad_line=args.on_bad_line,
        dtype=args.dtype,
        progress=not args.no_progress,
    )


if __name__ == "__main__":
    run_cli(main)
