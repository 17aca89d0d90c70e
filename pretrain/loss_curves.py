"""Loss curves: reading them (a run's ``loss_history.json`` or a reference text file), the published
loss-alignment rule, and a PNG plot; for tools/compare_loss.py and tools/benchmark.py.

Imports neither paddle nor paddlenlp, so the tools that only read and plot start in a fraction of
a second. The ``loss_history.json`` a run writes (``pretrain.loss_history``)::

    {"train": [[global_step, loss], ...], "eval": [[global_step, eval_loss], ...]}
"""

from __future__ import annotations

import json
import os

from pretrain.atomic import atomic_outputs
from pretrain.errors import UserError

LOSS_HISTORY_FILE = "loss_history.json"


def read_loss_history(path: str) -> dict:
    """``{"train": [(step, loss)], "eval": [(step, loss)]}`` from a loss_history.json file.

    Raises:
        OSError, ValueError (json.JSONDecodeError), KeyError: the file is missing or not in this format.
    """
    with open(path, encoding="utf-8") as f:
        history = json.load(f)
    return {kind: [(int(step), float(loss)) for step, loss in history[kind]] for kind in ("train", "eval")}


# Loss alignment rule of the published Llama-2-7B case (FlagPerf training/nvidia/llama2_7b-megatron-deepspeed):
# from step 21 on, the mean relative error of each step's loss against the reference run's loss at the same step < 2%.
ALIGNMENT_FIRST_STEP = 21
ALIGNMENT_TOLERANCE = 0.02


def load_train_losses(path: str) -> list:
    """``[(step, loss)]`` of the training losses in ``path``, sorted by step.

    ``path`` is a run's output directory (its loss_history.json), a loss_history.json file, or a
    text file of ``step loss`` lines (blank or comma separated; lines starting with ``#`` skipped),
    e.g. a reference curve taken from another framework's log.

    Raises:
        UserError: the path does not exist, or the file is not in one of these formats.
    """
    if os.path.isdir(path):
        path = os.path.join(path, LOSS_HISTORY_FILE)
    if not os.path.isfile(path):
        raise UserError(
            f"{path} does not exist; give a run's output directory (with {LOSS_HISTORY_FILE}) or a loss file"
        )
    if path.endswith(".json"):
        try:
            return sorted(read_loss_history(path)["train"])
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(
                f'{path}: not a loss history ({e!r}); expected {{"train": [[step, loss], ...], "eval": [...]}}'
            ) from e
    losses = []
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, 1):
            fields = line.replace(",", " ").split()
            if not fields or fields[0].startswith("#"):
                continue
            try:
                losses.append((int(fields[0]), float(fields[1])))
            except (ValueError, IndexError):
                raise UserError(f"{path}:{line_number}: expected 'step loss', got {line.strip()!r}") from None
    return sorted(losses)


def relative_errors(run: list, reference: list, first_step: int = ALIGNMENT_FIRST_STEP) -> list:
    """``[(step, |run - reference| / |reference|)]`` at the steps >= ``first_step`` present in both curves."""
    reference_by_step = dict(reference)
    return [
        (step, abs(loss - reference_by_step[step]) / abs(reference_by_step[step]))
        for step, loss in run
        if step >= first_step and step in reference_by_step
    ]


def plot_loss_curves(curves: dict, path: str, title: str, errors: list = None) -> None:
    """Write a PNG of the loss curves ``{label: [(step, loss)]}`` to ``path`` (atomically).

    With ``errors`` (``[(step, relative error)]``) a second panel shows them in percent against
    the 2% alignment tolerance.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    panels = 2 if errors else 1
    figure, axes = plt.subplots(panels, 1, figsize=(8, 3.5 * panels), squeeze=False)
    loss_axes = axes[0][0]
    for label, losses in curves.items():
        marker = "o" if len(losses) <= 30 else None  # a short curve (or one eval point) stays visible
        loss_axes.plot(
            [s for s, _ in losses], [v for _, v in losses], label=label, linewidth=1.2, marker=marker, markersize=3
        )
    loss_axes.set_xlabel("step")
    loss_axes.set_ylabel("loss")
    loss_axes.set_title(title)
    loss_axes.legend()
    loss_axes.grid(alpha=0.3)
    if errors:
        error_axes = axes[1][0]
        error_axes.plot([s for s, _ in errors], [100 * e for _, e in errors], color="tab:red", linewidth=1.2)
        error_axes.axhline(100 * ALIGNMENT_TOLERANCE, color="gray", linestyle="--", label="2% tolerance")
        error_axes.set_xlabel("step")
        error_axes.set_ylabel("relative error (%)")
        error_axes.legend()
        error_axes.grid(alpha=0.3)
    figure.tight_layout()
    with atomic_outputs(path) as (tmp_path,):
        figure.savefig(tmp_path, format="png", dpi=100)
    plt.close(figure)
