"""Tokenize a jsonl corpus into <output_prefix>.bin/.idx for run_pretrain.py.

    python tools/preprocess/create_pretraining_data.py --input data/demo/corpus.jsonl \
        --tokenizer_name_or_path data/demo/tokenizer --output_prefix data/demo/demo_text_document
"""

import argparse

from pretrain.errors import run_cli
from pretrain.modeling import load_tokenizer_from
from pretrain.preprocess.indexed import write_indexed_dataset


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="jsonl corpus, one document per line.")
    parser.add_argument("--tokenizer_name_or_path", required=True, help="Local tokenizer folder.")
    parser.add_argument("--output_prefix", required=True, help="Writes <prefix>.bin and <prefix>.idx.")
    parser.add_argument("--json_key", default="text", help="Field holding the document text.")
    parser.add_argument("--append_eos", action=argparse.BooleanOptionalAction, default=True,
                        help="Append the tokenizer's EOS id to every document.")
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer_from(args.tokenizer_name_or_path)
    stats = write_indexed_dataset(args.input, tokenizer, args.output_prefix, args.json_key, args.append_eos)
    print(f"wrote {args.output_prefix}.bin/.idx: {stats}")


if __name__ == "__main__":
    run_cli(main)
