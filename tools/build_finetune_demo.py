"""Build the CPU fine-tuning demo's src/tgt pairs ("the Bible or Shakespeare?") from the demo corpus.

    python tools/build_finetune_demo.py --corpus data/demo/corpus.jsonl --output_dir data/finetune_demo

Writes train.json and dev.json (held-out documents); see ``pretrain/finetune/demo.py``.
"""

import argparse
import os

from pretrain.errors import ArgumentParser, UserError, run_cli
from pretrain.finetune.demo import build_pairs, write_pairs


def main(argv=None) -> tuple:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="data/demo/corpus.jsonl", help="The demo corpus jsonl (`make data`).")
    parser.add_argument("--output_dir", default="data/finetune_demo", help="Folder for train.json and dev.json.")
    parser.add_argument("--per_document", type=int, default=3, help="Passages taken from each training document.")
    parser.add_argument(
        "--eval_every",
        type=int,
        default=10,
        help="Every n-th Bible chapter and Shakespeare document is held out for dev.json.",
    )
    args = parser.parse_args(argv)
    for flag, value in (("--per_document", args.per_document), ("--eval_every", args.eval_every)):
        if value < 1:
            raise UserError(f"{flag} {value} must be >= 1")
    train, dev = build_pairs(args.corpus, args.per_document, args.eval_every)
    write_pairs(train, os.path.join(args.output_dir, "train.json"))
    write_pairs(dev, os.path.join(args.output_dir, "dev.json"))
    print(f"wrote {len(train)} training and {len(dev)} held-out pairs to {args.output_dir}")
    return train, dev


if __name__ == "__main__":
    run_cli(main)
