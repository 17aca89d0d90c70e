"""Concatenate several <prefix>.bin/.idx pairs into one, in the order given.

    python tools/preprocess/merge.py --inputs out/part-00 out/part-01 --output_prefix out/all
    python tools/preprocess/merge.py --inputs out/ --output_prefix out/all   # every pair in the folder, by name

All inputs must hold the same token dtype. A merged .stats.json (counts summed, the largest
max_token_id) is written when every input has one. A folder input leaves out the output prefix's own
pair, so a second run into the same folder gives the same result; naming the output prefix itself as
an input is an error.
"""

import os

from pretrain.corpus import merge
from pretrain.data import resolve_data_sources
from pretrain.errors import UserError
from pretrain.preprocess.arguments import MergeArguments, parse
from pretrain.preprocess.interrupt import run_tool


def _prefixes(inputs: list, output_prefix: str) -> list:
    """Each input as prefixes: a folder gives every pair in it (sorted by name) except ``output_prefix``'s,
    a prefix itself.

    Raises:
        UserError: a folder holds no pair, or none but the output's.
    """
    output = os.path.realpath(output_prefix)
    prefixes = []
    for item in inputs:
        if os.path.isdir(item):
            found = [
                source.prefix
                for source in resolve_data_sources(item)
                if os.path.realpath(source.prefix) != output  # an earlier run's output is not an input
            ]
            if not found:
                raise UserError(f"--inputs {item}: the folder holds no pair but --output_prefix's own; add inputs")
            prefixes += found
        else:
            prefixes.append(item)
    return prefixes


def main(argv=None):
    args = parse(MergeArguments, argv, __doc__)
    merge(_prefixes(args.inputs, args.output_prefix), args.output_prefix)


if __name__ == "__main__":
    run_tool(main)
