"""Export a trained model to a Hugging Face transformers folder (safetensors, config, tokenizer).

    python tools/export_hf.py RUN_OR_CHECKPOINT --output DIR [--dtype bfloat16|float16|float32] [--max_shard_size 5GB]
    python tools/export_hf.py output/llama_demo_cpu --output output/llama_demo_cpu_hf

RUN_OR_CHECKPOINT is a run's output_dir (its final model, else its newest complete checkpoint), one of
its ``checkpoint-<step>`` folders, or any folder save_pretrained wrote (a merged LoRA model too); per-rank
files of tensor/pipeline-parallel runs are merged. DIR then loads with
``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` and ``AutoTokenizer.from_pretrained(DIR)``
without custom code: LLaMA and Baichuan-7B style as LlamaForCausalLM, Qwen2 and Qwen v1 as
Qwen2ForCausalLM, GPT-3 as GPT2LMHeadModel (docs/models.md, "From and to Hugging Face"), in
transformers 4.x and 5 alike (config.json holds the RoPE in both versions' keys). --dtype
defaults to the saved model's. Exit status 2 with ``error: ...`` when the model cannot be expressed
(Baichuan-13B's ALiBi), DIR is a file or a folder that is not empty, or a tensor holds NaN/inf or a
value past --dtype's range (float16: max |value| 65504; the line names the tensor); nothing is written then.
"""

# ruff: noqa: E402 -- the filters must be in place before paddle is imported: it warns at import
import argparse

from pretrain.log import silence_known_warnings

silence_known_warnings()

from pretrain.errors import ArgumentParser, run_cli
from pretrain.hf_export import DTYPES, export


def main(argv=None) -> dict:
    """Parse the command line, export, print one line per written part; returns ``export``'s summary."""
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", metavar="RUN_OR_CHECKPOINT", help="Run output_dir, checkpoint or model folder.")
    parser.add_argument("--output", required=True, help="New folder for the transformers model.")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="Weight dtype written (default: the saved one).")
    parser.add_argument(
        "--max_shard_size", default="5GB", help="Largest safetensors file, bytes with a unit (default 5GB = 5e9 bytes)."
    )
    parser.add_argument("--no_tokenizer", action="store_true", help="Export the model without the tokenizer files.")
    args = parser.parse_args(argv)
    summary = export(args.source, args.output, args.dtype, args.max_shard_size, tokenizer=not args.no_tokenizer)
    print(
        f"exported {summary['model_dir']} as {summary['architecture']} ({summary['dtype']}, "
        f"{summary['total_bytes'] / 1e6:,.1f} MB in {summary['shards']} shard(s)) to {args.output}: "
        f"{', '.join(summary['files'])}"
    )
    return summary


if __name__ == "__main__":
    run_cli(main)
