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

from pretrain.errors import ArgumentParser, UserError, run_cli
from pretrain.finetune.lora import load_lora_model, save_merged
from pretrain.preflight import writable_folder_problem
from pretrain.tokenizers import load_tokenizer_from


def check_output(args) -> None:
    """Refuse an ``--output`` that would overwrite an input or cannot be written, before anything is loaded.

    Raises:
        UserError: ``--output`` is the ``--base_model`` or ``--lora_path`` folder (compared after
            resolving links), is a file or lies under one, or its nearest existing folder is not writable.
    """
    for flag, folder in (("--base_model", args.base_model), ("--lora_path", args.lora_path)):
        if os.path.realpath(args.output) == os.path.realpath(folder):
            raise UserError(
                f"--output {args.output} is the {flag} folder; the merged model would overwrite it; "
                "give a new folder (e.g. <lora_path>/merged)"
            )
    problem = writable_folder_problem("--output", args.output)[1]
    if problem:
        raise UserError(problem)


def main(argv=None) -> str:
    """Merge ``--lora_path`` into ``--base_model`` and save the result to ``--output``; returns ``--output``.

    Raises:
        UserError: see ``check_output``, ``load_tokenizer_from`` and ``load_lora_model`` (nothing is
            written then).
    """
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base_model", required=True, help="Folder of the base model the adapter was trained on.")
    parser.add_argument(
        "--lora_path", required=True, help="Folder holding lora_model_state.pdparams + lora_config.json."
    )
    parser.add_argument("--output", required=True, help="Folder to write the merged model and tokenizer to.")
    args = parser.parse_args(argv)
    check_output(args)

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
