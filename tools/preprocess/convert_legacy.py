"""Convert an older <name>_ids.npy + <name>_idx.npz pair (e.g. FlagPerf's llama_openwebtext_100k,
gpt_en_dataset_300m) to paddlenlp's mmap <output_prefix>.bin/.idx.

    python tools/preprocess/convert_legacy.py --input_prefix data/gpt_en_dataset_300m --output_prefix data/gpt_en_300m

run_pretrain.py reads the legacy pair as it is too; converting gives the faster mmap format, a
format merge.py and inspect_data.py share, and uint16 tokens where the ids fit.
"""

from pretrain.corpus import DTYPES, convert_legacy
from pretrain.preprocess.arguments import ConvertLegacyArguments, parse
from pretrain.preprocess.interrupt import run_tool


def main(argv=None):
    args = parse(ConvertLegacyArguments, argv, __doc__)
    convert_legacy(args.input_prefix, args.output_prefix, DTYPES.get(args.dtype))


if __name__ == "__main__":
    run_tool(main)
