"""The app's features in the tensor- and pipeline-parallel layouts on CPU processes (issue 30, item 4).

One uninterrupted run per layout (llama, 2 layers, ``parallel_golden``'s STEPS steps from the same initial
weights, unified checkpoints as the recipes, a checkpoint at step 2) feeds every check of it:
- exact resume: the same layout killed (SIGKILL of every process) once checkpoint-2 is complete and
  restarted ends with the uninterrupted run's losses (every digit) and final weights, bit for bit;
- preemption: SIGTERM to paddle's launcher of a PP2 run once step 1 is logged saves a checkpoint at the next
  step boundary on both stages, ends the run, and the same command resumes it to the uninterrupted run's
  losses and final weights, bit for bit;
- resume on another layout: checkpoint-2 of one layout, resumed on another, ends with the uninterrupted
  run's losses within 1e-6 relative and its final weights within the golden tolerances
  (``test_parallel_layouts``): the layouts sum in other orders, which is all that differs.
Spike recovery with gradient accumulation 2 (the layouts' micro-batches) runs its own launches: a spike
injected at step 3, skipped or rolled back, in TP2 and PP2 ends as in one process (the golden tolerances):
a rank or stage that took another verdict than the others would apply, or not, its part of the update.
"""

import json
import os
import shutil
import signal
import time

import numpy as np
import pytest
from parallel_golden import (
    final_weights,
    initial_weights,
    launch,
    layout_command,
    losses,
    relative_differences,
    weight_differences,
)
from test_parallel_layouts import LOSS_RTOL, WEIGHT_BULK, WEIGHT_BULK_TOLERANCE, WEIGHT_MAX
from tiny_run import kill_group, kill_when, run, start, wait

from pretrain.checkpoint import MARKER, checkpoint_problem, list_checkpoints
from pretrain.metrics.loss_curves import load_train_losses

SAVE_AT_2 = ("--save_steps", "2")
LAYOUTS = ("1 process", "TP2", "PP2")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, demo_dir):
    """{layout: output_dir of its uninterrupted run} for LAYOUTS; "init": the initial weights; "root": the folder."""
    root = str(tmp_path_factory.mktemp("features"))
    weights = initial_weights(f"{root}/init", "llama", 2)
    found = {"init": weights, "root": root}
    for layout in LAYOUTS:
        found[layout] = launch(root, layout.replace(" ", "_"), weights, "llama", 2, layout, *SAVE_AT_2)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["TP2", "PP2"])
def test_a_killed_run_resumes_exactly(runs, layout):
    name = f"killed_{layout}"
    command, out, logs = layout_command(runs["root"], name, runs["init"], "llama", 2, layout, *SAVE_AT_2)
    process = start(command, log_path=os.path.join(logs, "launch.log"))
    assert kill_when(process, os.path.join(out, "checkpoint-2", MARKER), timeout=300), f"not killed; see {logs}"
    assert not os.path.exists(os.path.join(out, "checkpoint-4")), "killed too late: training had finished"
    command, out, logs = layout_command(runs["root"], name, runs["init"], "llama", 2, layout, *SAVE_AT_2)
    resumed_log = os.path.join(logs, "resumed.log")
    assert run(command, log_path=resumed_log, timeout=300) == 0, f"the restart failed; see {logs}"
    assert "Continuing training from checkpoint" in _text(resumed_log), "it did not resume"
    _assert_same_run(out, runs[layout])


def _text(path: str) -> str:
    """The text of ``path``; empty while it does not exist."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _assert_same_run(out: str, reference: str) -> None:
    """``out`` ended with ``reference``'s losses (every digit) and final weights, bit for bit."""
    assert losses(out) == losses(reference)
    want, got = final_weights(reference), final_weights(out)
    assert want.keys() == got.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.slow
def test_sigterm_under_pp2_saves_on_both_stages_and_resumes_exactly(runs):
    command, out, logs = layout_command(runs["root"], "preempted_PP2", runs["init"], "llama", 2, "PP2")
    process = start(command, log_path=os.path.join(logs, "launch.log"))
    try:
        while "] step 1/" not in _text(os.path.join(logs, "workerlog.0")):
            assert process.poll() is None, f"the run ended before step 1 was logged; see {logs}"
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        assert wait(process, timeout=300) == signal.SIGTERM  # paddle's launcher exits with the signal's number
    finally:
        kill_group(process)
    (stopped,) = [step for step, _ in list_checkpoints(out)]
    assert 1 <= stopped < 4 and checkpoint_problem(os.path.join(out, f"checkpoint-{stopped}")) is None
    assert not os.path.exists(os.path.join(out, "model.safetensors.index.json")), "the final model was saved"
    for rank in (0, 1):
        text = _text(os.path.join(logs, f"workerlog.{rank}"))
        assert (
            "Traceback" not in text and f"stopped at step {stopped} of 4 and saved {out}/checkpoint-{stopped};" in text
        )
    assert run(command, log_path=os.path.join(logs, "resumed.log"), timeout=300) == 0, f"the resume failed; see {logs}"
    _assert_same_run(out, runs["PP2"])


@pytest.mark.slow
@pytest.mark.parametrize("saved, resumed", [("TP2", "1 process"), ("PP2", "1 process"), ("1 process", "TP2")])
def test_a_checkpoint_resumes_on_another_layout(runs, saved, resumed):
    name = f"{saved}_to_{resumed}".replace(" ", "_")
    command, out, logs = layout_command(runs["root"], name, runs["init"], "llama", 2, resumed, *SAVE_AT_2)
    os.makedirs(out)
    shutil.copytree(os.path.join(runs[saved], "checkpoint-2"), os.path.join(out, "checkpoint-2"))
    shutil.copy(os.path.join(runs[saved], "loss_history.json"), out)  # the steps before the checkpoint
    log = os.path.join(logs, "launch.log")
    assert run(command, log_path=log, timeout=300) == 0, f"the resume failed; see {logs}"
    assert "Continuing training from checkpoint" in _text(log), "it did not resume"
    uninterrupted, other = losses(runs[saved]), losses(out)
    assert other[:2] == uninterrupted[:2]
    assert max(relative_differences(uninterrupted, other)) <= LOSS_RTOL, (uninterrupted, other)
    _assert_golden_weights(f"{saved} -> {resumed}", runs[saved], out)


def _assert_golden_weights(what: str, reference: str, other: str) -> None:
    """The final weights of ``other`` within the golden tolerances of ``reference``'s."""
    differences = weight_differences(final_weights(reference), final_weights(other))
    print(
        f"{what}: weights {differences.max():.2e} max, {np.quantile(differences, WEIGHT_BULK):.2e} at {WEIGHT_BULK:.1%}"
    )
    assert np.quantile(differences, WEIGHT_BULK) <= WEIGHT_BULK_TOLERANCE
    assert differences.max() <= WEIGHT_MAX


SPIKE = 3
SPIKE_POLICIES = {  # policy -> (its arguments, what the summary records)
    "skip": (("--loss_spike_policy", "skip"), {"spike_skipped_steps": [SPIKE], "rollbacks": 0}),
    "rollback": (("--loss_spike_policy", "rollback", "--rollback_skip_batches", "1"), {"rollbacks": 1}),
}


@pytest.mark.slow
@pytest.mark.parametrize("policy", SPIKE_POLICIES)
def test_spike_recovery_with_accumulation_agrees_on_every_rank_and_stage(runs, policy):
    arguments, recorded = SPIKE_POLICIES[policy]
    spiked = (*arguments, "--spike_warmup_steps", "2", "--debug_inject_spike_at_step", str(SPIKE), *SAVE_AT_2)
    outs = {
        layout: launch(runs["root"], f"{policy}_{layout}".replace(" ", "_"), runs["init"], "llama", 2, layout, *spiked)
        for layout in LAYOUTS
    }
    single = dict(load_train_losses(outs["1 process"]))
    assert single != dict(load_train_losses(runs["1 process"]))  # the spike changed the run
    for layout in ("TP2", "PP2"):
        with open(os.path.join(outs[layout], "run_summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
        assert {key: summary[key] for key in recorded} == recorded, layout
        parallel = dict(load_train_losses(outs[layout]))
        assert parallel.keys() == single.keys(), layout
        assert max(abs(parallel[s] - single[s]) / abs(single[s]) for s in single) <= LOSS_RTOL, (single, parallel)
        _assert_golden_weights(f"{policy} {layout}", outs["1 process"], outs[layout])
