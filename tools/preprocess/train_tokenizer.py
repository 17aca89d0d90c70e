"""Train a LLaMA-style SentencePiece BPE tokenizer on a jsonl corpus; write a LlamaTokenizer folder.

    python tools/preprocess/train_tokenizer.py --input data/demo/corpus.jsonl \
        --output_dir data/demo/tokenizer --vocab_size 8000

The tokenizer pads nothing: run_pretrain.py pads the embedding to a multiple of 128 rows.
"""

import argparse

from pretrain.errors import run_cli
from pretrain.preprocess.sp_tokenizer import train_tokenizer


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="jsonl corpus, one document per line.")
    parser.add_argument(
        "--output_dir", required=True, help="Folder for sentencepiece.bpe.model + tokenizer_config.json."
    )
    parser.add_argument("--vocab_size", type=int, default=8000, help="Pieces, including 3 special and 256 byte pieces.")
    parser.add_argument("--json_key", default="text", help="Field holding the document text.")
    parser.add_argument("--num_threads", type=int, default=2, help="Training threads.")
    args = parser.parse_args(argv)
    train_tokenizer(args.input, args.output_dir, args.vocab_size, args.json_key, args.num_threads)
    print(f"wrote tokenizer to {args.output_dir}")


if __name__ == "__main__":
    run_cli(main)
