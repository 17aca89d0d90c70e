"""Concatenate several <prefix>.bin/.idx pairs into one, in the order given.

    python tools/preprocess/merge.py --inputs out/part-00 out/part-01 --output_prefix out/all
    python tools/preprocess/merge.py --inputs out/ --output_prefix out/all   # every pair in the folder, by name

All inputs must hold the same token dtype. A merged .stats.json (counts summed, the largest
max_token_id) is written when every input has one.
"""

import os

from pretrain.data import resolve_data_sources
from pretrain.preprocess.arguments import MergeArguments, parse
from pretrain.preprocess.indexed import merge
from pretrain.preprocess.interrupt import run_tool


def _prefixes(inputs: list) -> list:
    """Each input as prefixes: a folder gives every pair in it (sorted by name), a prefix itself."""
    prefixes = []
    for item in inputs:
        prefixes += [source.prefix for source in resolve_data_sources(item)] if os.path.isdir(item) else [item]
    return prefixes


def main(argv=None):
    args = parse(MergeArguments, argv, __doc__)
    merge(_prefixes(args.inputs), args.output_prefix)


if __name__ == "__main__":
    run_tool(main)
