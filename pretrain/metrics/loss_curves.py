"""Loss curves: reading them (a run's ``loss_history.json`` or a reference text file), the published
loss-alignment rule, and a PNG plot; for tools/compare_loss.py and tools/benchmark.py.

Imports neither paddle nor paddlenlp, so the tools that only read and plot start in a fraction of
a second. The ``loss_history.json`` a run writes (``pretrain.metrics.loss_history``)::

    {"train": [[global_step, loss], ...], "eval": [[global_step, eval_loss], ...]}
"""

from __future__ import annotations

import json
import math
import os

from pretrain.atomic import atomic_outputs
from pretrain.errors import UserError

LOSS_HISTORY_FILE = "loss_history.json"


def read_loss_history(path: str) -> dict:
    """``{"train": [(step, loss)], "eval": [(step, loss)], "skipped": [step], "samples": [(step, hash)]}``
    from a loss_history.json file (``skipped``: the steps whose update was not applied; ``samples``:
    ``pretrain.sample_log``'s per-step hashes; each [] when the file has none).

    Raises:
        OSError, ValueError (json.JSONDecodeError), KeyError: the file is missing or not in this format.
    """
    with open(path, encoding="utf-8") as f:
        history = json.load(f)
    losses = {kind: [(int(step), float(loss)) for step, loss in history[kind]] for kind in ("train", "eval")}
    return {
        **losses,
        "skipped": [int(step) for step in history.get("skipped", [])],
        "samples": [(int(step), str(digest)) for step, digest in history.get("samples", [])],
    }


# Loss alignment rule of the published Llama-2-7B case (FlagPerf training/nvidia/llama2_7b-megatron-deepspeed):
# from step 21 on, the mean relative error of each step's loss against the reference run's loss at the same step < 2%.
ALIGNMENT_FIRST_STEP = 21
ALIGNMENT_TOLERANCE = 0.02


def load_train_losses(path: str) -> list:
    """``[(step, loss)]`` of the training losses in ``path``, sorted by step.

    ``path`` is a run's output directory (its loss_history.json), a loss_history.json file, or a
    text file of ``step loss`` lines: an integer step, then the loss, blank or comma separated; blank
    lines and lines starting with ``#`` (e.g. a ``# step loss`` header) are skipped. E.g. a reference
    curve taken from another framework's log.

    Raises:
        UserError: the path does not exist, the file is not in one of these formats (naming file:line
            for a text file), or a loss is not a finite number (nan, inf).
    """
    if os.path.isdir(path):
        path = os.path.join(path, LOSS_HISTORY_FILE)
    if not os.path.isfile(path):
        raise UserError(
            f"{path} does not exist; give a run's output directory (with {LOSS_HISTORY_FILE}) or a loss file"
        )
    if path.endswith(".json"):
        try:
            losses = sorted(read_loss_history(path)["train"])
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(
                f'{path}: not a loss history ({e!r}); expected {{"train": [[step, loss], ...], "eval": [...]}}'
            ) from e
        for step, loss in losses:
            if not math.isfinite(loss):
                raise UserError(f"{path}: train loss {loss} at step {step} is not a finite number; {_NOT_FINITE}")
        return losses
    losses = []
    with open(path, encoding="utf-8", errors="replace") as f:  # a line with bad bytes is named below
        for line_number, line in enumerate(f, 1):
            fields = line.replace(",", " ").split()
            if not fields or fields[0].startswith("#"):
                continue
            where = f"{path}:{line_number}"
            try:
                step, loss = int(fields[0]), float(fields[1])
            except (ValueError, IndexError):
                raise UserError(
                    f"{where}: {line.strip()!r} is not an integer step and a loss; "
                    "every line must be two numbers (start a header or comment line with '#')"
                ) from None
            if not math.isfinite(loss):
                raise UserError(f"{where}: loss {fields[1]} at step {step} is not a finite number; {_NOT_FINITE}")
            losses.append((step, loss))
    return sorted(losses)


_NOT_FINITE = "the run diverged there: compare curves whose losses are all finite"


def relative_errors(
    run: list, reference: list, first_step: int = ALIGNMENT_FIRST_STEP, reference_name: str = "the reference"
) -> list:
    """``[(step, |run - reference| / |reference|)]`` at the steps >= ``first_step`` present in both curves.

    Raises:
        UserError: the reference loss is 0 at such a step, where the relative error is undefined
            (the message names ``reference_name`` and the step).
    """
    reference_by_step = dict(reference)
    errors = []
    for step, loss in run:
        if step >= first_step and step in reference_by_step:
            if reference_by_step[step] == 0:
                raise UserError(
                    f"{reference_name}: loss 0 at step {step}, so the relative error |run - reference| / |reference| "
                    "is undefined; a training loss is never exactly 0: check the reference curve"
                )
            errors.append((step, abs(loss - reference_by_step[step]) / abs(reference_by_step[step])))
    return errors


def running_mean(errors: list) -> list:
    """``[(step, mean of the errors up to and including step)]`` of ``[(step, error)]``: the alignment
    verdict compares its last value with the tolerance."""
    total, means = 0.0, []
    for count, (step, error) in enumerate(errors, 1):
        total += error
        means.append((step, total / count))
    return means


def short_label(path: str) -> str:
    """A legend label for a loss source: a run folder's name, or a file's name (its folder's name for
    ``loss_history.json``)."""
    path = os.path.normpath(path)
    if os.path.basename(path) == LOSS_HISTORY_FILE:
        path = os.path.dirname(path)
    return os.path.basename(path) or path


PLOT_WIDTH_INCHES, PLOT_DPI = 12, 100  # 1200 px wide


def loss_figure(curves: dict, title: str, errors: list = None, tolerance: float = ALIGNMENT_TOLERANCE):
    """A 1200 px wide matplotlib figure of the loss curves ``{label: [(step, loss)]}``.

    With ``errors`` (``[(step, relative error)]``) a second panel, on the same step axis, shows the
    running mean of the relative error (what the alignment verdict compares) against ``tolerance``,
    with each step's error faint behind it. Steps are integers on the axis.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = 2 if errors else 1
    figure, axes = plt.subplots(
        panels, 1, figsize=(PLOT_WIDTH_INCHES, 4 * panels), squeeze=False, sharex=True, dpi=PLOT_DPI
    )
    loss_axes = axes[0][0]
    for label, losses in curves.items():
        marker = "o" if len(losses) <= 30 else None  # a short curve (or one eval point) stays visible
        loss_axes.plot(
            [s for s, _ in losses], [v for _, v in losses], label=label, linewidth=1.2, marker=marker, markersize=3
        )
    loss_axes.set_ylabel("loss")
    loss_axes.set_title(title)
    loss_axes.legend()
    loss_axes.grid(alpha=0.3)
    loss_axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    if errors:
        error_axes = axes[1][0]
        steps = [s for s, _ in errors]
        error_axes.plot(
            steps,
            [100 * e for _, e in errors],
            color="tab:red",
            alpha=0.3,
            linewidth=0.8,
            label="relative error at each step",
        )
        error_axes.plot(
            steps,
            [100 * m for _, m in running_mean(errors)],
            color="tab:red",
            linewidth=1.8,
            label=f"mean relative error from step {steps[0]} (the verdict)",
        )
        error_axes.axhline(100 * tolerance, color="gray", linestyle="--", label=f"{100 * tolerance:g}% tolerance")
        error_axes.set_ylabel("relative error (%)")
        error_axes.legend()
        error_axes.grid(alpha=0.3)
    axes[-1][0].set_xlabel("step")
    figure.tight_layout()
    return figure


def plot_loss_curves(
    curves: dict, path: str, title: str, errors: list = None, tolerance: float = ALIGNMENT_TOLERANCE
) -> None:
    """Write ``loss_figure(curves, title, errors, tolerance)`` to ``path`` as a PNG (atomically)."""
    import matplotlib.pyplot as plt

    figure = loss_figure(curves, title, errors, tolerance)
    with atomic_outputs(path) as (tmp_path,):
        figure.savefig(tmp_path, format="png", dpi=PLOT_DPI)
    plt.close(figure)
