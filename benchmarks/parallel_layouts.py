"""Every parallel layout that run_pretrain.py executes on CPU processes: equal to one process, its step time,
and the planner's communication bytes against the bytes each rank counted.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/parallel_layouts.py [--layouts TP2 PP2 ...] [--folder DIR]

The runs of tests/test_parallel_layouts.py (``tests/parallel_golden.py``): the llama CPU demo config at 2
layers (6 for PP3xVPP2), hidden 256, 64-token samples, fp32, 4 steps of 4 samples (6 for PP3xVPP2) from
the same initial weights and batches as a 1-process reference. Printed per layout:

- loss: the largest relative difference of the per-step losses to the reference;
- step s: the slowest rank's seconds per optimizer step (the run summary's ``per_rank``, its step phases
  over the 4 steps, startup excluded) and comm: the communication share of rank 0's step phases
  (the seconds inside gloo collectives, ``pretrain.metrics.comm_volume``). All ranks share the machine's
  cores, with each other and any other job (the 1-minute load average is printed): CPU step times say
  what runs, not how fast a GPU would;
- per group kind (mp, pp, sharding), the planner's payload bytes per step (one card of each stage, min-max,
  ``pretrain.planner.estimate.communication_volume`` as ``pretrain.cpu_comm`` runs the layout: whole
  pipeline sends, 4096-byte sharding alignment) and the bytes counted in step 4 (each rank, min-max),
  in MB (1e6 bytes); the last column says whether every
  collective the planner models was counted to the byte and each rank holds its stage's planned
  parameters (``communication_mismatches``), or the first disagreement.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

from parallel_golden import (  # noqa: E402  (tests/ holds the golden-run helpers)
    PLANNED_KINDS,
    STEPS,
    communication_mismatches,
    initial_weights,
    launch,
    losses,
    planned_communication,
    relative_differences,
)

from pretrain.metrics.comm_volume import FILE_PATTERN, read_volume  # noqa: E402

PARALLEL = ("TP2", "TP2+SP", "PP2", "TP2xPP2", "TP2xSH2 stage1", "TP2xSH2 stage2", "PP3xVPP2")


def _layers(layout: str) -> int:
    return 6 if layout in ("PP3xVPP2", "1 process, 6 samples") else 2


def _reference(layout: str) -> str:
    return "1 process, 6 samples" if _layers(layout) == 6 else "1 process"


def _name(layout: str) -> str:
    return layout.replace("+", "_").replace(" ", "_").replace(",", "")


def _megabytes(values: list) -> str:
    low, high = min(values) / 1e6, max(values) / 1e6
    return f"{low:.3f}" if low == high else f"{low:.3f}-{high:.3f}"


def report(folder: str, layout: str, weights: str, reference: list) -> str:
    """One line per layout: loss difference, step time, communication share, bytes per group kind."""
    out = launch(folder, _name(layout), weights, "llama", _layers(layout), layout)
    loss = max(relative_differences(reference, losses(out)))
    with open(os.path.join(out, "run_summary.json")) as f:
        summary = json.load(f)
    step = max(summary["per_rank"]["step_seconds"])
    phases = summary["time_breakdown"]
    productive = sum(phases[phase] for phase in ("forward_backward", "communication", "optimizer"))
    planned, numel = planned_communication(folder, _name(layout), weights, "llama", _layers(layout), layout)
    records = [
        read_volume(out, rank) for rank in range(len(glob.glob(os.path.join(out, FILE_PATTERN.format(rank="*")))))
    ]
    columns = []
    for kind in PLANNED_KINDS:
        plan = [sum(stage.get(kind, {}).values()) for stage in planned]
        counted = [
            sum(next(s["bytes"] for s in record["steps"] if s["step"] == STEPS).get(kind, {}).values())
            for record in records
        ]
        if max(plan) or max(counted):
            columns.append(f"{kind} {_megabytes(plan)} / {_megabytes(counted)}")
    mismatches = communication_mismatches(out, planned, numel)
    verdict = "equal" if not mismatches else f"DIFFERS: {mismatches[0]}"
    return (
        f"{layout:<15} {loss:9.1e} {step:7.3f} {phases['communication'] / productive:5.0%}  "
        f"{'; '.join(columns):<58} {verdict}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", nargs="+", default=list(PARALLEL), choices=PARALLEL)
    parser.add_argument("--folder", help="where the runs go (default: a temporary folder)")
    args = parser.parse_args()
    folder = args.folder or tempfile.mkdtemp(prefix="parallel_layouts_")
    weights = {n: initial_weights(os.path.join(folder, f"init{n}"), "llama", n) for n in (2, 6)}
    references = {}
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; runs in {folder}")
    print(f"{'layout':<15} {'loss diff':>9} {'step s':>7} {'comm':>5}  planned / counted MB per step per card")
    for layout in args.layouts:
        reference = _reference(layout)
        if reference not in references:
            out = launch(folder, _name(reference), weights[_layers(layout)], "llama", _layers(layout), reference)
            references[reference] = losses(out)
        print(report(folder, layout, weights[_layers(layout)], references[reference]), flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
