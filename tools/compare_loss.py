"""Compare a run's per-step training losses with a reference run's, by the published alignment rule.

    python tools/compare_loss.py RUN REFERENCE [--plot loss_compare.png]

RUN and REFERENCE are each a run's output directory (its loss_history.json, written by
run_pretrain.py), a loss_history.json file, or a text file of ``step loss`` lines (an integer step
and the loss; a header or comment line must start with ``#``).

Rule (Llama-2-7B Megatron-DeepSpeed case, FlagPerf training/nvidia/llama2_7b-megatron-deepspeed): from
step 21 on, the mean over steps of |loss_run - loss_reference| / loss_reference, at the steps both curves hold, must be
below 2%. Train with ``--logging_steps 1`` so that every step has its own loss.

Prints the verdict and the error, writes a PNG of both curves and, below them on the same steps,
the running mean of the relative error (the verdict's figure) against the tolerance.
Exit status: 0 aligned, 1 not aligned, 2 bad input (``error: ...``): a missing or malformed file
(named with its line) or one without a loss, a loss that is nan or inf, a reference loss of 0 at a
compared step (the relative error is undefined there: refused, not counted), a --tolerance that is not
a positive number, or a --plot path that is a folder or whose folder does not exist (checked before
anything is read).
"""

import argparse
import math
import os
import sys

from pretrain.errors import ArgumentParser, UserError, run_cli
from pretrain.metrics.loss_curves import (
    ALIGNMENT_FIRST_STEP,
    ALIGNMENT_TOLERANCE,
    load_train_losses,
    plot_loss_curves,
    relative_errors,
    short_label,
)


def default_plot_path(run: str) -> str:
    """``<RUN dir>/loss_compare.png``, or next to RUN when it is a file."""
    folder = run if os.path.isdir(run) else os.path.dirname(os.path.abspath(run))
    return os.path.join(folder, "loss_compare.png")


def check_plot_path(path: str) -> None:
    """Refuse a --plot path the PNG cannot be written to: a folder, or a file in a missing folder.

    Raises:
        UserError: naming the path and the fix.
    """
    if os.path.isdir(path):
        raise UserError(
            f"--plot {path} is a folder; give a PNG file path such as {os.path.join(path, 'loss_compare.png')}"
        )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserError(f"--plot {path}: folder {folder} does not exist; create it or give a path in an existing one")


def main(argv=None) -> int:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", metavar="RUN", help="Run output directory or loss file to check.")
    parser.add_argument("reference", metavar="REFERENCE", help="Reference run output directory or loss file.")
    parser.add_argument(
        "--plot",
        default=None,
        help="PNG file to write, in an existing folder (default: <RUN dir>/loss_compare.png).",
    )
    parser.add_argument(
        "--first_step",
        type=int,
        default=ALIGNMENT_FIRST_STEP,
        help="First optimizer step compared (the published rule: 21).",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=ALIGNMENT_TOLERANCE,
        help="Largest mean relative error that passes, a fraction (the published rule: 0.02).",
    )
    args = parser.parse_args(argv)

    if not 0 < args.tolerance < math.inf:  # nan fails the comparison too
        raise UserError(f"--tolerance {args.tolerance}: give a fraction > 0, e.g. the published rule's 0.02")
    if args.plot is not None:
        check_plot_path(args.plot)
    run, reference = load_train_losses(args.run), load_train_losses(args.reference)
    for path, losses in ((args.run, run), (args.reference, reference)):
        if not losses:
            raise UserError(f"{path}: no train loss logged in it; give a run that logged some (--logging_steps 1)")
    errors = relative_errors(run, reference, args.first_step, reference_name=args.reference)
    if not errors:
        raise UserError(
            f"{args.run} and {args.reference} share no logged step >= {args.first_step}; "
            "train both for more steps with --logging_steps 1"
        )
    mean_error = sum(e for _, e in errors) / len(errors)
    aligned = mean_error < args.tolerance
    verdict = "ALIGNED" if aligned else "NOT ALIGNED"
    print(
        f"{verdict}: mean relative loss error {100 * mean_error:.3f}% over {len(errors)} steps "
        f"({errors[0][0]}..{errors[-1][0]}), tolerance {100 * args.tolerance:g}%; "
        f"max {100 * max(e for _, e in errors):.3f}% at step {max(errors, key=lambda x: x[1])[0]}"
    )
    plot_path = args.plot or default_plot_path(args.run)
    plot_loss_curves(
        {f"run: {short_label(args.run)}": run, f"reference: {short_label(args.reference)}": reference},
        plot_path,
        title=f"{verdict}: mean relative error {100 * mean_error:.2f}% (steps >= {args.first_step})",
        errors=errors,
        tolerance=args.tolerance,
    )
    print(f"plot: {plot_path}")
    return 0 if aligned else 1


if __name__ == "__main__":
    sys.exit(run_cli(main))
