"""Convert an older <name>_ids.npy + <name>_idx.npz pair (e.g. FlagPerf's llama_openwebtext_100k,
gpt_en_dataset_300m) to paddlenlp's mmap <output_prefix>.bin/.idx.

    python tools/preprocess/convert_legacy.py --input_prefix data/gpt_en_dataset_300m --output_prefix data/gpt_en_300m

run_pretrain.py reads the legacy pair as it is too; converting gives the faster mmap format, a
format merge.py and inspect_data.py share, and uint16 tokens where the ids fit.
"""

import argparse

from pretrain.errors import run_cli
from pretrain.preprocess.indexed import DTYPES, convert_legacy


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--input_prefix", required=True, help="Reads <prefix>_ids.npy and <prefix>_idx.npz (keys lens, docs)."
    )
    parser.add_argument("--output_prefix", required=True, help="Writes <prefix>.bin and <prefix>.idx.")
    parser.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        default=None,
        help="Token dtype of the .bin; default uint16 when the largest id fits, else int32.",
    )
    args = parser.parse_args(argv)
    convert_legacy(args.input_prefix, args.output_prefix, DTYPES.get(args.dtype))


if __name__ == "__main__":
    run_cli(main)
