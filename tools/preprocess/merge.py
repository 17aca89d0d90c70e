"""Concatenate several <prefix>.bin/.idx pairs into one, in the order given.

    python tools/preprocess/merge.py --inputs out/part-00 out/part-01 --output_prefix out/all
    python tools/preprocess/merge.py --inputs out/ --output_prefix out/all   # every pair in the folder, by name

All inputs must hold the same token dtype. A merged .stats.json (counts summed, the largest
max_token_id) is written when every input has one.
"""

import argparse
import os

from pretrain.data import resolve_data_sources
from pretrain.errors import run_cli
from pretrain.preprocess.indexed import merge


def _prefixes(inputs: list) -> list:
    """Each input as prefixes: a folder gives every pair in it (sorted by name), a prefix itself."""
    prefixes = []
    for item in inputs:
        prefixes += [source.prefix for source in resolve_data_sources(item)] if os.path.isdir(item) else [item]
    return prefixes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", nargs="+", required=True, help="Prefixes (without .bin/.idx) or folders of pairs.")
    parser.add_argument("--output_prefix", required=True, help="Writes <prefix>.bin, <prefix>.idx (and .stats.json).")
    args = parser.parse_args(argv)
    merge(_prefixes(args.inputs), args.output_prefix)


if __name__ == "__main__":
    run_cli(main)
