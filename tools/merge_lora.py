"""Merge a saved LoRA adapter into its base model and save the result as a plain model folder.

    python tools/merge_lora.py --base_model BASE --lora_path ADAPTER --output OUT

BASE is the folder the adapter was trained on (``model_name_or_path`` of run_finetune.py); ADAPTER
is run_finetune.py's output_dir or one of its ``checkpoint-<step>`` folders (``lora_model_state.pdparams``
+ ``lora_config.json``). OUT then loads with ``AutoModelForCausalLM.from_pretrained`` and holds the
tokenizer of ADAPTER (or of BASE when ADAPTER has none). ``run_finetune.py --merge_lora true`` does
the same at the end of training; this tool merges any checkpoint later, on one card.
"""

import argparse
import os

from pretrain.errors import run_cli
from pretrain.lora import load_lora_model, save_merged
from pretrain.tokenizers import load_tokenizer_from


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base_model", required=True, help="Folder of the base model the adapter was trained on.")
    parser.add_argument(
        "--lora_path", required=True, help="Folder holding lora_model_state.pdparams + lora_config.json."
    )
    parser.add_argument("--output", required=True, help="Folder to write the merged model and tokenizer to.")
    args = parser.parse_args(argv)

    tokenizer_dir = (
        args.lora_path if os.path.isfile(os.path.join(args.lora_path, "tokenizer_config.json")) else args.base_model
    )
    tokenizer = load_tokenizer_from(tokenizer_dir)
    model = load_lora_model(args.base_model, args.lora_path)
    save_merged(model, tokenizer, args.output)
    print(f"merged {args.lora_path} into {args.base_model}: {args.output}")
    return args.output


if __name__ == "__main__":
    run_cli(main)
