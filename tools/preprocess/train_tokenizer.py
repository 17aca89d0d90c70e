"""Train a LLaMA-style SentencePiece BPE tokenizer on a jsonl corpus; write a LlamaTokenizer folder.

    python tools/preprocess/train_tokenizer.py --input data/demo/corpus.jsonl \
        --output_dir data/demo/tokenizer --vocab_size 8000

The tokenizer pads nothing: run_pretrain.py pads the embedding to a multiple of 128 rows.
"""

from pretrain.preprocess.arguments import TokenizerTrainingArguments, parse
from pretrain.preprocess.interrupt import run_tool
from pretrain.preprocess.sp_tokenizer import train_tokenizer


def main(argv=None):
    print(f"wrote tokenizer to {train_tokenizer(parse(TokenizerTrainingArguments, argv, __doc__))}")


if __name__ == "__main__":
    run_tool(main)
