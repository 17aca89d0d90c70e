"""Step time of a tiny mixture of experts in 1 process and with its experts spread over 2 (EP2), per MoE family.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/expert_parallel.py [--steps 6]

Each family's CPU demo config at 2 layers and 64-token samples, global batch 4 (1 process: micro-batch
2 x accumulation 2; EP2: 2 ranks x micro-batch 1 x accumulation 2, ``use_expert_parallel``, the all-to-all
through ``pretrain.cpu_comm``: the support matrix's layouts, ``pretrain.support_matrix.LAYOUTS``), every
registry family with experts. Printed per layout: seconds per
step (forward+backward, communication and optimizer time of the run's ``time_history.json``, startup
excluded, over every step), the last log record's load-balancing loss (unscaled) and worst layer's
imbalance (busiest expert's share / mean share). A family whose paddlenlp model cannot spread its experts
prints why (``registry.Routing.no_expert_parallel``). On 2 cores the 2 ranks share them with each other
(and with any other job: the 1-minute load average is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

from pretrain.registry import FAMILIES
from pretrain.support_matrix import LAYOUTS as MATRIX_LAYOUTS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = re.compile(r"aux ([\d.]+), z [\d.]+, imbalance ([\d.]+)")
LAYOUTS = {name: MATRIX_LAYOUTS[name] for name in ("1 process", "EP2")}  # the support matrix's (same global batch)


def run(family: str, layout: str, steps: int, folder: str) -> str:
    """One run's line: seconds per step, the last aux loss and imbalance."""
    processes, extra = LAYOUTS[layout].processes, LAYOUTS[layout].arguments
    out = os.path.join(folder, f"{family}_{layout.replace(' ', '_')}")
    arguments = [os.path.join(REPO, "config", family, "pretrain_demo_cpu.json"), "--num_hidden_layers", "2"]
    arguments += ["--max_seq_length", "64", "--max_steps", str(steps), "--warmup_steps", "2", "--logging_steps", "1"]
    arguments += ["--do_eval", "false", "--evaluation_strategy", "no", "--save_steps", "1000", "--output_dir", out]
    # unified checkpoints, as the matrix's runs: without them a data-parallel run has no expert-parallel group
    arguments += ["--unified_checkpoint", "true", "--data_cache", os.path.join(folder, "cache"), *extra]
    launcher = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", out + "_logs"]
    command = (launcher if processes > 1 else [sys.executable]) + [os.path.join(REPO, "run_pretrain.py"), *arguments]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    log = done.stdout + done.stderr
    if processes > 1 and os.path.exists(os.path.join(out + "_logs", "workerlog.0")):
        with open(os.path.join(out + "_logs", "workerlog.0")) as f:
            log = f.read()
    if done.returncode:
        return f"failed (exit {done.returncode}): {log.strip().splitlines()[-1] if log.strip() else ''}"
    with open(os.path.join(out, "time_history.json")) as f:
        phases = json.load(f)["phase_seconds"]
    seconds = sum(phases[name] for name in ("forward_backward", "communication", "optimizer")) / steps
    aux, imbalance = RECORD.findall(log)[-1]
    return f"{seconds:.3f} s/step, aux {aux}, imbalance {imbalance}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per run")
    steps = parser.parse_args().steps
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {steps} steps, global batch 4 x 64")
    with tempfile.TemporaryDirectory() as folder:
        for family in [name for name, family in FAMILIES.items() if family.implementation.routing is not None]:
            reason = FAMILIES[family].implementation.routing.no_expert_parallel
            for layout in LAYOUTS:
                line = f"cannot: {reason}" if reason and layout != "1 process" else run(family, layout, steps, folder)
                print(f"{family:12s} {layout:10s} {line}", flush=True)


if __name__ == "__main__":
    main()
