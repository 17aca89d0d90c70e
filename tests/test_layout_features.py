"""The app's features in the tensor- and pipeline-parallel layouts on CPU processes (issue 30, item 4).

One uninterrupted run per layout (llama, 2 layers, ``parallel_golden``'s STEPS steps from the same initial
weights, unified checkpoints as the recipes, a checkpoint at step 2) feeds every check of it:
- exact resume: the same layout killed (SIGKILL of every process) once checkpoint-2 is complete and
  restarted ends with the uninterrupted run's losses (every digit) and final weights, bit for bit;
- preemption: SIGTERM to paddle's launcher of a PP2 run once step 1 is logged saves a checkpoint at the next
  step boundary on both stages, ends the run, and the same command resumes it to the uninterrupted run's
  losses and final weights, bit for bit;
- resume on another layout: checkpoint-2 of one layout, resumed on another, ends with the uninterrupted
  run's losses within 1e-6 relative and its final weights within the golden tolerance
  (``test_parallel_layouts``): the layouts sum in other orders, which is all that differs;
- the summary: each rank's peak memory and tokens/card/s, the max and which rank.
Launches of their own:
- spike recovery with gradient accumulation 2 (the layouts' micro-batches): a spike injected at step 3,
  skipped or rolled back, in TP2 and PP2 ends as in one process (the golden tolerances): a rank or stage
  that took another verdict than the others would apply, or not, its part of the update;
- HF import and export: a transformers model continued in TP2 or PP2 starts at transformers' loss and
  exports from the run's checkpoint and final folder to the same tensors and logits;
- document masking under TP2 and TP2 + SP equals one process.
"""

import json
import os
import signal
import time

import numpy as np
import pytest
from conftest import REPO, fixture_folder, resolve_plan
from parallel_golden import LAYOUTS as GOLDEN_LAYOUTS
from parallel_golden import (
    assert_golden_weights,
    assert_same_run,
    final_weights,
    initial_weights,
    launch,
    layout_command,
    losses,
    model_args,
    relative_differences,
    resume,
)
from test_parallel_layouts import LOSS_RTOL
from tiny_run import kill_group, kill_when, launch_command, run, start, text_of, wait, with_overrides

from pretrain.checkpoint import MARKER, checkpoint_problem, list_checkpoints
from pretrain.data import build_datasets, collate_causal_lm
from pretrain.metrics.loss_curves import load_train_losses

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

SAVE_AT_2 = ("--save_steps", "2")
LAYOUTS = ("1 process", "TP2", "PP2")


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory, demo_dir):
    """{layout: output_dir of its uninterrupted run} for LAYOUTS; "init": the initial weights; "root": the folder."""
    root = fixture_folder(request, tmp_path_factory, "features")
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
    assert "Continuing training from checkpoint" in text_of(resumed_log), "it did not resume"
    assert_same_run(out, runs[layout])


@pytest.mark.slow
def test_sigterm_under_pp2_saves_on_both_stages_and_resumes_exactly(runs):
    command, out, logs = layout_command(runs["root"], "preempted_PP2", runs["init"], "llama", 2, "PP2")
    process = start(command, log_path=os.path.join(logs, "launch.log"))
    try:
        while "] step 1/" not in text_of(os.path.join(logs, "workerlog.0")):
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
        text = text_of(os.path.join(logs, f"workerlog.{rank}"))
        assert (
            "Traceback" not in text and f"stopped at step {stopped} of 4 and saved {out}/checkpoint-{stopped};" in text
        )
    assert run(command, log_path=os.path.join(logs, "resumed.log"), timeout=300) == 0, f"the resume failed; see {logs}"
    assert_same_run(out, runs["PP2"])


@pytest.mark.slow
@pytest.mark.parametrize("saved, resumed", [("TP2", "1 process"), ("PP2", "1 process"), ("1 process", "TP2")])
def test_a_checkpoint_resumes_on_another_layout(runs, saved, resumed):
    name = f"{saved}_to_{resumed}".replace(" ", "_")
    out = resume(runs["root"], name, runs[saved], runs["init"], "llama", 2, resumed, *SAVE_AT_2)
    uninterrupted, other = losses(runs[saved]), losses(out)
    assert other[:2] == uninterrupted[:2]
    assert max(relative_differences(uninterrupted, other)) <= LOSS_RTOL, (uninterrupted, other)
    _assert_golden_weights(f"{saved} -> {resumed}", runs[saved], out)


def _assert_golden_weights(what: str, reference: str, other: str) -> None:
    """The final weights of ``other`` within the golden tolerance of ``reference``'s (every element)."""
    print(f"{what}: weights, worst: {assert_golden_weights(what, final_weights(reference), final_weights(other))}")


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


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["TP2", "PP2"])
def test_hf_import_into_and_export_from_a_parallel_run(layout, tmp_path, demo_dir):
    """A random transformers LLaMA (GQA, rope_theta 500000) continued in TP2 or PP2 at learning rate 0: the
    first loss equals transformers' on the same global batch (the import, split over the ranks, is right),
    and the export of its checkpoint (one file per rank) and of its final folder loads in transformers with
    the original's tensors, bit for bit, and logits within 1e-4 (``test_hf_interop``'s tolerance)."""
    import torch
    from test_hf_interop import LOGIT_TOLERANCE, _continue_argv, _hf_tensors_of, demo_ids, hf_source, load_hf

    from pretrain.hf_export import export

    source, out, logs = str(tmp_path / "hf"), str(tmp_path / "run"), str(tmp_path / "logs")
    hf_model = hf_source("llama", source)
    nproc, layout_args = GOLDEN_LAYOUTS[layout][:2]
    argv = with_overrides(
        _continue_argv("llama", source, out, str(tmp_path / "cache"), "--learning_rate", "0"),
        *("--min_learning_rate", "0", "--max_steps", "2", "--save_steps", "1", "--hang_timeout", "60"),
        *("--unified_checkpoint", "true", "--tensor_parallel_output", "true", *layout_args),
    )
    os.makedirs(logs)
    command = launch_command(nproc, logs)[:-1] + [os.path.join(REPO, "run_pretrain.py"), *argv]
    assert run(command, log_path=os.path.join(logs, "launch.log"), timeout=300) == 0, f"the run failed; see {logs}"

    train, _, _ = build_datasets(resolve_plan(argv))
    batch = collate_causal_lm([train[i] for i in range(4)])  # the first global batch: 2 samples x 2 micro-batches
    with torch.no_grad():
        logits = hf_model(torch.tensor(batch["input_ids"])).logits.double()
    labels = torch.tensor(batch["labels"]).reshape(-1)
    loss = float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels))
    with open(os.path.join(out, "run_summary.json"), encoding="utf-8") as f:
        first = json.load(f)["train_loss_first"]
    print(f"HF import into {layout}: first loss {first:.7f}, transformers {loss:.7f}")
    assert first == pytest.approx(loss, rel=1e-5)

    original, ids = _hf_tensors_of(source), demo_ids()
    for saved in (os.path.join(out, "checkpoint-1"), out):
        exported = str(tmp_path / f"exported_{os.path.basename(saved)}")
        export(saved, exported, dtype="float32", tokenizer=False)
        back = _hf_tensors_of(exported)
        assert sorted(back) == sorted(original)
        for name in original:
            np.testing.assert_array_equal(back[name], original[name], err_msg=name)
        with torch.no_grad():
            diff = (load_hf(exported)(torch.tensor(ids)).logits - hf_model(torch.tensor(ids)).logits).abs().max()
        assert float(diff) <= LOGIT_TOLERANCE


@pytest.mark.slow
def test_document_masking_under_tp2_and_sequence_parallel_equals_one_process(runs):
    """reset_attention_mask and reset_position_ids (512-token samples: 6 documents end in the 16 trained):
    TP2 and TP2 + SP split the heads, and SP the sequence between the layers, with every document's mask
    and positions as in one process."""
    masking = ("--reset_attention_mask", "true", "--reset_position_ids", "true", "--max_seq_length", "512")
    folder = runs["root"]
    plan = resolve_plan(
        model_args("llama", 2, *masking, "--output_dir", f"{folder}/plan", "--data_cache", f"{folder}/cache")
    )
    train, _, _ = build_datasets(plan)
    trained = np.asarray(collate_causal_lm([train[i] for i in range(4 * 4)])["input_ids"])  # 4 steps of 4 samples
    assert (trained[:, :-1] == plan.tokenizer.eos_token_id).any()  # documents meet in the samples trained
    outs = {
        layout: launch(folder, f"masked_{number}", runs["init"], "llama", 2, layout, *masking)
        for number, layout in enumerate(("1 process", "TP2", "TP2+SP"))
    }
    single = losses(outs["1 process"])
    for layout in ("TP2", "TP2+SP"):
        parallel = losses(outs[layout])
        assert max(relative_differences(single, parallel)) <= LOSS_RTOL, (layout, single, parallel)
        _assert_golden_weights(f"masked {layout}", outs["1 process"], outs[layout])


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["TP2", "PP2"])
def test_every_rank_reports_its_figures_in_the_summary(runs, layout):
    """Peak memory and tokens/card/s of each rank, and the max and which rank, in run_summary.json."""
    with open(os.path.join(runs[layout], "run_summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    for figure, key_max, key_rank in (
        ("peak_memory_gib", "peak_memory_gib_max", "peak_memory_max_rank"),
        ("tokens_per_card_per_sec", "tokens_per_card_per_sec_max", "tokens_per_card_per_sec_max_rank"),
    ):
        values = summary["per_rank"][figure]
        assert len(values) == 2 and all(value > 0 for value in values), (figure, values)
        assert (summary[key_max], summary[key_rank]) == (max(values), values.index(max(values))), figure
