"""Benchmark a pretraining config: run it, then write the row a benchmark table publishes.

    python tools/benchmark.py CONFIG [--steps N] [--output_dir DIR] [--nproc_per_node P] [--key value ...]

Runs ``run_pretrain.py CONFIG --max_steps N --logging_steps 1`` (through
``python -m paddle.distributed.launch --nproc_per_node P`` when P > 1); any other ``--key value``
pair overrides the config, as on run_pretrain.py's command line. Then writes into DIR
(default output/benchmark/<config name>):

    benchmark.md    a Markdown table row: config | precision | fix_hp | parallel_strategy |
                    tokens/card/s | memory | MFU | loss  (the format of docs/benchmarks.md)
    loss_curve.png  training (and evaluation) loss per step
    benchmark.json  the raw figures: command, hardware, run_summary.json, loss_history.json
    run/            the run's own output directory (logs/ too when P > 1)

Exit status 2 with ``error: ...`` when the run fails.
"""

import argparse
import json
import os
import platform
import subprocess
import sys

from pretrain.atomic import atomic_outputs
from pretrain.errors import ArgumentParser, UserError, run_cli
from pretrain.metrics.hardware import gpu_name
from pretrain.metrics.loss_curves import LOSS_HISTORY_FILE, plot_loss_curves, read_loss_history
from pretrain.metrics.summary import format_mfu

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLUMNS = ("config", "precision", "fix_hp", "parallel_strategy", "tokens/card/s", "memory", "MFU", "loss")


def training_command(config: str, steps: int, run_dir: str, nproc_per_node: int, log_dir: str, overrides: list) -> list:
    """The argv that trains ``config`` for ``steps`` steps into ``run_dir`` (a launch over P processes when P > 1)."""
    launcher = [sys.executable]
    if nproc_per_node > 1:
        launcher += ["-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc_per_node), "--log_dir", log_dir]
    return [
        *launcher,
        os.path.join(REPO, "run_pretrain.py"),
        config,
        "--max_steps",
        str(steps),
        "--logging_steps",
        "1",
        "--output_dir",
        run_dir,
        "--overwrite_output_dir",
        *overrides,
    ]


def hardware_description() -> str:
    """The card the run used: the CUDA device name, or ``CPU (<cores> cores, <processor>)``."""
    return gpu_name() or f"CPU ({os.cpu_count()} cores, {platform.processor() or platform.machine()})"


def markdown_row(config: str, summary: dict) -> str:
    """One table row in COLUMNS order from a run_summary.json dict (MFU: ``pretrain.metrics.summary.format_mfu``, so
    never above 100%: a value that would be is ``n/a`` with the reason)."""
    tokens = summary["tokens_per_card_per_sec"]
    cells = (
        os.path.splitext(os.path.basename(config))[0],
        summary["precision"],
        f"mbs {summary['per_device_train_batch_size']}, gas {summary['gradient_accumulation_steps']}, "
        f"gbs {summary['global_batch_samples']} x {summary['seq_length']} tokens, "
        f"{summary['steps_run_this_process']} steps ({summary['throughput_warmup_steps']} warm-up)",
        f"{summary['parallel_strategy']}, {summary['world_size']} card(s)",
        "n/a (too few steps)" if tokens is None else f"{tokens:.1f}",
        f"{summary['peak_memory_gib']:.2f} GiB ({summary['peak_memory_kind']})",
        format_mfu(summary),
        f"{summary['train_loss_last']:.3f} at step {summary['global_step']}",
    )
    return "| " + " | ".join(cells) + " |"


def markdown_table(rows: list) -> str:
    """A Markdown table with the COLUMNS header over ``rows``."""
    return "\n".join(["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS), *rows]) + "\n"


def write_text(path: str, text: str) -> None:
    with atomic_outputs(path) as (tmp_path,):
        with open(tmp_path, "w", encoding="utf-8") as f:
            f.write(text)


def main(argv=None) -> dict:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "config", metavar="CONFIG", help="Pretraining JSON config, e.g. config/llama/pretrain_demo_cpu.json."
    )
    parser.add_argument("--steps", type=int, default=20, help="Optimizer steps to run (max_steps).")
    parser.add_argument("--output_dir", default=None, help="Where to write (default output/benchmark/<config name>).")
    parser.add_argument(
        "--nproc_per_node",
        type=int,
        default=1,
        help="Processes (cards) to launch with paddle.distributed.launch; 1 runs in one process.",
    )
    args, overrides = parser.parse_known_args(argv)
    for flag, value in (("--steps", args.steps), ("--nproc_per_node", args.nproc_per_node)):
        if value < 1:
            raise UserError(f"{flag} {value} must be >= 1")
    if not os.path.isfile(args.config):
        raise UserError(
            f"config file {args.config} does not exist; pass a JSON file such as config/llama/pretrain_demo_cpu.json"
        )
    name = os.path.splitext(os.path.basename(args.config))[0]
    output_dir = args.output_dir or os.path.join("output", "benchmark", name)
    run_dir = os.path.join(output_dir, "run")
    command = training_command(
        args.config, args.steps, run_dir, args.nproc_per_node, os.path.join(output_dir, "logs"), overrides
    )
    print("running:", " ".join(command), flush=True)
    status = subprocess.run(command).returncode
    if status != 0:
        raise UserError(
            f"the benchmark run of {args.config} failed with exit status {status}; see its output above"
            + (f" and {output_dir}/logs/workerlog.*" if args.nproc_per_node > 1 else "")
        )

    with open(os.path.join(run_dir, "run_summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    losses = read_loss_history(os.path.join(run_dir, LOSS_HISTORY_FILE))
    row = markdown_row(args.config, summary)
    hardware = hardware_description()
    write_text(os.path.join(output_dir, "benchmark.md"), f"Hardware: {hardware}\n\n" + markdown_table([row]))
    curves = {"train": losses["train"], **({"eval": losses["eval"]} if losses["eval"] else {})}
    plot_loss_curves(curves, os.path.join(output_dir, "loss_curve.png"), title=f"{name}: loss per step ({hardware})")
    raw = {
        "config": args.config,
        "command": command,
        "hardware": hardware,
        "row": row,
        "summary": summary,
        "loss_history": losses,
    }
    write_text(os.path.join(output_dir, "benchmark.json"), json.dumps(raw, indent=2) + "\n")
    print(markdown_table([row]))
    print(f"wrote {output_dir}/benchmark.md, loss_curve.png, benchmark.json")
    return raw


if __name__ == "__main__":
    run_cli(main)
