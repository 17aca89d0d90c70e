"""Write docs/arguments.md, the argument reference, from the argument dataclasses' field metadata.

    python tools/argument_docs.py [--output docs/arguments.md] [--check]

Every key of run_pretrain.py, run_finetune.py and the preprocessing tools, with its type, default,
range (the ``range`` entry of its field, ``pretrain.schema``) and help. ``--check`` writes nothing
and exits with status 2 when the file differs from what would be written (tests/test_schema.py
runs it): regenerate after adding or changing a key.
"""

# ruff: noqa: E402 -- the filters must be in place before paddle is imported: it warns at import
import os
import sys

from pretrain.log import silence_known_warnings

silence_known_warnings()

from pretrain.arguments import ARGUMENT_CLASSES
from pretrain.atomic import atomic_outputs
from pretrain.errors import ArgumentParser, UserError, run_cli
from pretrain.finetune.lora_arguments import FinetuneDataArguments, LoRAArguments
from pretrain.preprocess import arguments as preprocess
from pretrain.schema import reference_markdown

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GROUPS = [
    ("run_pretrain.py (and tools/plan.py)", ARGUMENT_CLASSES),
    ("run_finetune.py: the keys it adds (the rest are run_pretrain.py's)", (FinetuneDataArguments, LoRAArguments)),
    ("tools/preprocess/create_pretraining_data.py (flags)", (preprocess.PretrainingDataArguments,)),
    ("tools/preprocess/merge.py (flags)", (preprocess.MergeArguments,)),
    ("tools/preprocess/convert_legacy.py (flags)", (preprocess.ConvertLegacyArguments,)),
    ("tools/preprocess/inspect_data.py (flags)", (preprocess.InspectArguments,)),
    ("tools/preprocess/train_tokenizer.py (flags)", (preprocess.TokenizerTrainingArguments,)),
    ("tools/preprocess/trans_to_json.py (flags)", (preprocess.TextsToJsonArguments,)),
]


def main(argv=None) -> str:
    """Write (or with ``--check`` compare) the reference; returns its text.

    Raises:
        UserError: ``--check`` and the file is not the generated text.
    """
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--output", default=os.path.join(REPO, "docs", "arguments.md"), help="File to write.")
    parser.add_argument("--check", action="store_true", help="Compare instead of writing; status 2 when it differs.")
    args = parser.parse_args(argv)
    text = reference_markdown(GROUPS)
    if args.check:
        current = open(args.output, encoding="utf-8").read() if os.path.isfile(args.output) else ""
        if current != text:
            raise UserError(f"{args.output} is not the generated reference; run python tools/argument_docs.py")
        return text
    with atomic_outputs(args.output) as (partial,), open(partial, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.output}")
    return text


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
