"""Resume on another layout: a run stopped at a checkpoint on one layout resumes on another at the same
global batch of 4 samples, and goes on with the losses (1e-6 relative) and the Adam moments of the
uninterrupted run: data parallel 2 <-> 1 and sharding stage1 x2 <-> data parallel 2 on CPU processes (gloo).
A tensor or pipeline degree change of per-rank files is refused in one line by the preflight.

What makes it work (paddlenlp 3.0.0b4): the weights are saved whole (data-parallel and sharding rank 0),
the data position is ``global_step x global batch`` samples in one global order whatever the degree, the
schedule is counted in optimizer steps; the optimizer state is saved whole by plain data parallelism and
one disjoint shard per sharding rank, which ``pretrain.resume_layout`` merges when the sharding degree changed.
"""

import json
import os
import shutil
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from conftest import resolve_plan
from tiny_run import kill_when, launch_command, logged_losses, python_script, run, start, tiny_args

from pretrain.checkpoint import MARKER, mark_complete
from pretrain.errors import UserError
from pretrain.layout import ParallelLayout
from pretrain.preflight import check_run
from pretrain.resume_layout import layout_change_problem, optimizer_state, saved_layout

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

STEPS, SAVE_STEPS, STOP_AT = 8, 4, 4
TIMEOUT = 600  # seconds: two gloo processes on a loaded 2-core machine


# layout name -> (processes, extra arguments); per_device_train_batch_size is 4 // processes
LAYOUTS = {
    "dp1": (1, ()),
    "dp2": (2, ()),
    "sharding2": (2, ("--sharding", "stage1", "--sharding_parallel_degree", "2")),
}


def _command(layout: str, out: str, cache: str, logs: str) -> tuple:
    """(command, rank 0's log) for the tiny run on ``layout`` (``LAYOUTS``) at a global batch of 4."""
    nproc, extra = LAYOUTS[layout]
    batch = str(4 // nproc)
    args = tiny_args(out, cache, "--per_device_train_batch_size", batch, *extra, steps=STEPS, save_steps=SAVE_STEPS)
    os.makedirs(logs, exist_ok=True)
    if nproc == 1:
        return python_script(*args), os.path.join(logs, "launch.log")
    return launch_command(nproc, logs) + args, os.path.join(logs, "workerlog.0")


def _train_losses(out: str) -> dict:
    with open(os.path.join(out, "loss_history.json"), encoding="utf-8") as f:
        return dict(json.load(f)["train"])


def _moments(folder: str) -> dict:
    """``{name: array}`` of the Adam moments in every optimizer file of ``folder`` (one, or one per shard)."""
    found = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".pdopt"):
            found.update({k: v.numpy() for k, v in paddle.load(os.path.join(folder, name)).items() if "moment" in k})
    return found


@pytest.mark.slow
@pytest.mark.parametrize("before, after", [("dp2", "dp1"), ("dp1", "dp2"), ("sharding2", "dp2"), ("dp2", "sharding2")])
def test_resume_on_another_layout(tmp_path, demo_dir, before, after):
    cache = str(tmp_path / "cache")
    full = str(tmp_path / "full")
    command, _ = _command(before, full, cache, str(tmp_path / "full_logs"))
    assert run(command, log_path=str(tmp_path / "full_logs" / "launch.log"), timeout=TIMEOUT) == 0

    out = str(tmp_path / "changed")
    command, _ = _command(before, out, cache, str(tmp_path / "first_logs"))
    process = start(command, log_path=str(tmp_path / "first_logs" / "launch.log"))
    assert kill_when(process, os.path.join(out, f"checkpoint-{STOP_AT}", MARKER), timeout=TIMEOUT)
    resharded = before.startswith("sharding") != after.startswith("sharding")
    saved = saved_layout(os.path.join(out, f"checkpoint-{STOP_AT}"))
    assert saved.sharding_parallel_degree == (2 if before.startswith("sharding") else 1)  # optimizer.shard0{0,1}
    command, resumed_log = _command(after, out, cache, str(tmp_path / "resumed_logs"))
    assert run(command, log_path=str(tmp_path / "resumed_logs" / "launch.log"), timeout=TIMEOUT) == 0

    with open(resumed_log, encoding="utf-8") as f:
        log = f.read()
    assert f"Continuing training from global step {STOP_AT}" in log
    assert ("loading its optimizer shards merged" in log) == resharded
    assert sorted(logged_losses(resumed_log)) == list(range(STOP_AT + 1, STEPS + 1))  # it trained steps 5-8
    expected, resumed = _train_losses(full), _train_losses(out)  # every digit
    assert sorted(resumed) == sorted(expected) == list(range(1, STEPS + 1))
    for step, loss in resumed.items():
        assert loss == pytest.approx(expected[step], rel=1e-6), step
    want, got = _moments(os.path.join(full, f"checkpoint-{STEPS}")), _moments(os.path.join(out, f"checkpoint-{STEPS}"))
    assert want.keys() == got.keys() and want
    for name in want:  # float32 rounding of a different reduction order, relative to the tensor's scale
        scale = float(np.abs(want[name]).max())  # (measured: 2e-6 of it; fresh or wrong moments are off by ~1)
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5 * scale, err_msg=name)


def _touch(folder, *names: str) -> str:
    for name in names:
        (folder / name).write_bytes(b"")
    return str(folder)


def _layout(tp: int = 1, pp: int = 1, sharding: int = 1, dp: int = 1) -> ParallelLayout:
    return ParallelLayout(
        world_size=tp * pp * sharding * dp,
        nnodes=1,
        tensor_parallel_degree=tp,
        pipeline_parallel_degree=pp,
        sharding_stage=1 if sharding > 1 else 0,
        sharding_parallel_degree=sharding,
        data_parallel_degree=dp,
    )


@pytest.mark.parametrize(
    "files, degrees",
    [
        (["model_state.pdparams", "optimizer.pdopt"], (1, 1, 1)),  # data parallel
        (["model_state.pdparams", "optimizer.shard00.pdopt", "optimizer.shard01.pdopt"], (1, 1, 2)),  # stage1
        (["model_state.pdparams", "optimizer.shard00.pdopt"], (1, 1, 2)),  # a node that sees its own shard only
        ([f"model_state.tp0{t}.pdparams" for t in range(2)] + [f"optimizer.tp0{t}.pdopt" for t in range(2)], (2, 1, 1)),
        ([f"optimizer.tp0{t}_pp0{p}_shard0{s}.pdopt" for t in range(2) for p in range(2) for s in range(4)], (2, 2, 4)),
        (["model_state.pdparams", "model.safetensors", "optimizer-00001-of-00001.safetensors"], None),  # unified
        (["model_state.pdparams", "optimizer.moe00.pdopt"], None),  # a variant not known here: paddlenlp's
    ],
)
def test_saved_layout_is_read_from_paddlenlps_file_names(tmp_path, files, degrees):
    saved = saved_layout(_touch(tmp_path, *files))
    if degrees is None:
        assert saved is None
    else:
        got = (saved.tensor_parallel_degree, saved.pipeline_parallel_degree, saved.sharding_parallel_degree)
        assert got == degrees


@pytest.mark.parametrize(
    "files, layout, refused",
    [
        (["optimizer.pdopt"], _layout(sharding=2), None),
        (["optimizer.shard00.pdopt", "optimizer.shard01.pdopt"], _layout(dp=2), None),
        (["optimizer.shard00.pdopt", "optimizer.shard01.pdopt"], _layout(sharding=4), None),
        (["optimizer.tp00.pdopt", "optimizer.tp01.pdopt"], _layout(tp=2, sharding=2), None),
        (["optimizer.tp00.pdopt", "optimizer.tp01.pdopt"], _layout(dp=2), "TP2 PP1, optimizer not sharded"),
        (["optimizer.pdopt"], _layout(tp=2), "this run is TP2 PP1"),
        (["optimizer.pp00.pdopt", "optimizer.pp01.pdopt"], _layout(pp=4), "pipeline_parallel_degree 2"),
        (["model_state.shard00.pdparams", "optimizer.shard00.pdopt"], _layout(dp=2), "save_sharded_model"),
    ],
)
def test_layout_changes_of_tensor_or_pipeline_degree_are_refused(tmp_path, files, layout, refused):
    problem = layout_change_problem(_touch(tmp_path, *files), layout)
    if refused is None:
        assert problem is None
    else:
        assert refused in problem and "\n" not in problem and problem.startswith("resume: ")


def test_optimizer_shards_are_merged_only_when_the_sharding_degree_changed(tmp_path):
    """The union of the shards of this rank's tensor position, every entry once, master weights merged; shards
    that overlap, or that leave a parameter without state (a shard file missing), are refused in one line."""
    for t in range(2):
        for s in range(3):
            state = {
                f"w{t}{s}_moment1_0": paddle.full([2], float(10 * t + s)),
                "master_weights": {f"w{t}{s}": paddle.full([2], float(t))},
                "LR_Scheduler": {"last_epoch": 4},
            }
            paddle.save(state, str(tmp_path / f"optimizer.tp0{t}_shard0{s}.pdopt"))
    folder, trained = str(tmp_path), ["w10", "w11", "w12"]  # tensor rank 1's parameters
    assert optimizer_state(folder, _layout(tp=2, sharding=3), 1, 0, trained) is None  # paddlenlp reads its shard
    merged = optimizer_state(folder, _layout(tp=2, dp=2), 1, 0, trained)
    assert sorted(merged) == ["LR_Scheduler", "master_weights", "w10_moment1_0", "w11_moment1_0", "w12_moment1_0"]
    assert sorted(merged["master_weights"]) == trained and merged["LR_Scheduler"] == {"last_epoch": 4}
    assert merged["w11_moment1_0"].numpy().tolist() == [11.0, 11.0]

    os.remove(tmp_path / "optimizer.tp01_shard02.pdopt")  # the last shard lost: its parameter has no state
    with pytest.raises(UserError, match=r"hold no state for 1 of this run's 3 parameters \(e.g. w12\): a shard"):
        optimizer_state(folder, _layout(tp=2, dp=2), 1, 0, trained)
    paddle.save({"w10_moment1_0": paddle.zeros([2])}, str(tmp_path / "optimizer.tp01_shard02.pdopt"))  # a stale copy
    with pytest.raises(UserError, match=r"shards of .* overlap \(w10_moment1_0 is in two of them\)"):
        optimizer_state(folder, _layout(tp=2, dp=2), 1, 0, trained)


@pytest.mark.parametrize("saved_stage, merged", [("stage2", True), ("stage1", False), (None, False)])
def test_shards_of_another_sharding_stage_are_merged(tmp_path, saved_stage, merged):
    """Stage1 and stage2 assign parameters to sharding ranks differently: a stage1 run of the same degree merges
    a stage2 checkpoint's shards (its stage read from training_args.bin; without that file: read as saved)."""
    for s in range(2):
        paddle.save({f"w{s}_moment1_0": paddle.full([2], float(s))}, str(tmp_path / f"optimizer.shard0{s}.pdopt"))
    if saved_stage is not None:
        paddle.save(SimpleNamespace(sharding=saved_stage), str(tmp_path / "training_args.bin"))
    state = optimizer_state(str(tmp_path), _layout(sharding=2), 0, 0, ["w0", "w1"])
    assert (state is not None) == merged
    if merged:
        assert sorted(state) == ["w0_moment1_0", "w1_moment1_0"]


def test_preflight_refuses_a_checkpoint_of_another_tensor_degree(tmp_path, demo_dir):
    """A checkpoint written per tensor-parallel rank, resumed in one process: one line naming both layouts."""
    out = tmp_path / "out"
    folder = out / "checkpoint-4"
    folder.mkdir(parents=True)
    _touch(
        folder, "model_state.tp00.pdparams", "model_state.tp01.pdparams", "optimizer.tp00.pdopt", "optimizer.tp01.pdopt"
    )
    mark_complete(str(folder), 4)
    plan = resolve_plan(tiny_args(str(out), str(tmp_path / "cache"), steps=8))
    assert plan.resume_checkpoint == str(folder)
    problems = [p for p in check_run(plan) if p.startswith("resume: ")]
    assert problems == [
        f"resume: {folder} was saved by TP2 PP1, optimizer not sharded (per-rank files), this run is TP1 PP1; "
        "paddlenlp loads per-rank tensor/pipeline files only into the degrees that wrote them: resume with "
        "tensor_parallel_degree 2 and pipeline_parallel_degree 1 (sharding and data-parallel degrees may change), "
        "or save with unified_checkpoint true, whose merged files paddlenlp splits for any layout"
    ]


def test_preflight_refuses_a_checkpoint_of_another_sample_length(tmp_path, demo_dir):
    """A checkpoint trained on 64-token samples, resumed with max_seq_length 128: refused in one line. Before, the
    run resumed silently at the checkpoint's sample count in the 128-token index, and train_tokens counted its
    steps at 128 tokens (+33% in a 64 -> 128 resume at half the steps)."""
    out = tmp_path / "out"
    folder = out / "checkpoint-4"
    folder.mkdir(parents=True)
    with open(folder / "config.json", "w", encoding="utf-8") as f:
        json.dump({"model_type": "llama", "seq_length": 64}, f)
    mark_complete(str(folder), 4)
    args = tiny_args(str(out), str(tmp_path / "cache"), steps=8)
    assert [p for p in check_run(resolve_plan(args)) if p.startswith("resume: ")] == []  # tiny runs: 64 tokens
    problems = [p for p in check_run(resolve_plan([*args, "--max_seq_length", "128"])) if p.startswith("resume: ")]
    assert problems == [
        f"resume: {folder} was trained on samples of 64 tokens (max_seq_length 64, its config.json seq_length), "
        "this run's are 128; paddlenlp would resume the data at its sample count in another sample index, and "
        "train_tokens would count its steps at 128 tokens: keep max_seq_length 64 to resume, or train on at 128 "
        f"from its weights in a new output_dir (model_name_or_path {folder}, continue_training true)"
    ]


@pytest.mark.slow
def test_a_resume_with_another_global_batch_is_refused_in_one_line(tmp_path, one_and_two_ranks):
    """The 1-process run (global batch 4, checkpoint-6) resumed with per_device_train_batch_size 2: paddlenlp would
    move the data to 6 x 2 samples and train again 12 of the 24 the checkpoint was trained on. Refused in one line
    naming both batches and the fix, which then resumes."""
    out = str(tmp_path / "out")
    shutil.copytree(one_and_two_ranks[0], out)
    folder = os.path.join(out, "checkpoint-6")
    args = tiny_args(out, str(tmp_path / "cache"), "--per_device_train_batch_size", "2", steps=8, save_steps=6)
    assert run(python_script(*args), log_path=out + ".log", timeout=TIMEOUT) == 2
    with open(out + ".log", encoding="utf-8") as f:
        errors = [line.rstrip("\n") for line in f if line.startswith("error: ")]
    assert errors == [
        f"error: resume: {folder} was trained with a global batch of 4 samples (24 samples in 6 steps, its "
        "trainer_state.json), this run's is 2 (per_device_train_batch_size 2 x gradient_accumulation_steps 1 x 1 "
        "data-parallel rank(s)); paddlenlp would resume the data at 6 x 2 samples, not at the 24 trained on: keep "
        "the global batch at 4 (e.g. global_batch_size 4), or start afresh with overwrite_output_dir true (the old "
        "run is moved aside)"
    ]
    assert run(python_script(*args, "--global_batch_size", "4"), log_path=out + ".log", timeout=TIMEOUT) == 0
    with open(out + ".log", encoding="utf-8") as f:
        assert "Continuing training from global step 6" in f.read()
    assert sorted(_train_losses(out)) == list(range(1, 9))


@pytest.mark.parametrize(
    "saved_stage, layout, refused",
    [
        ("stage3", replace(_layout(sharding=2), sharding_stage=3), None),
        ("stage3", _layout(sharding=2), "was saved by sharding stage3 over 2 and this run is not sharding stage3"),
        ("stage3", _layout(dp=2), "this run is not sharding stage3"),
        ("stage3", replace(_layout(sharding=4), sharding_stage=3), "this run is sharding stage3 over 4"),
        ("stage1", replace(_layout(sharding=2), sharding_stage=3), "optimizer sharded over 2 and this run is sharding"),
    ],
)
def test_a_change_to_or_from_sharding_stage3_is_refused(tmp_path, saved_stage, layout, refused):
    """Stage3 keys a sliced parameter's optimizer state as ``slice@<name>``, sliced for its own degree."""
    _touch(tmp_path, "model_state.pdparams", "optimizer.shard00.pdopt", "optimizer.shard01.pdopt")
    paddle.save(SimpleNamespace(sharding=saved_stage), str(tmp_path / "training_args.bin"))
    problem = layout_change_problem(str(tmp_path), layout)
    if refused is None:
        assert problem is None
    else:
        assert refused in problem and "\n" not in problem and problem.startswith("resume: ")


def _routing_records(out: str) -> list:
    with open(os.path.join(out, "run_summary.json"), encoding="utf-8") as f:
        return json.load(f)["routing"]["records"]


@pytest.mark.slow
def test_a_mixture_of_experts_resumes_on_another_layout(tmp_path, demo_dir):
    """The tiny run as Mixtral (4 experts, top-2) under sharding stage1 x2, 2 samples per rank, stopped at
    checkpoint-4 and resumed on plain data parallel 2 (the optimizer shards merged) and on 1 process with
    accumulation 2: each goes on with the losses, Adam moments and routing records of the uninterrupted run.
    The load-balancing loss is computed per forward, on 2 samples in all three layouts (a rank's micro-batch,
    or one of the 2 accumulated), so the layouts are one computation; routing_history.json carries the
    records of steps 1-4 over."""
    cache, moe = str(tmp_path / "cache"), ("--model_name_or_path", "mixtral-debug")
    full = str(tmp_path / "full")
    command, _ = _command("sharding2", full, cache, str(tmp_path / "full_logs"))
    assert run(command + list(moe), log_path=str(tmp_path / "full_logs" / "launch.log"), timeout=TIMEOUT) == 0
    records = _routing_records(full)
    assert [record["step"] for record in records] == list(range(1, STEPS + 1))
    expected = _train_losses(full)
    want = _moments(os.path.join(full, f"checkpoint-{STEPS}"))
    one = ("--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2")
    for name, after, extra in (("dp2", "dp2", ()), ("one", "dp1", one)):
        out = str(tmp_path / name)
        os.makedirs(out)
        shutil.copytree(os.path.join(full, f"checkpoint-{STOP_AT}"), os.path.join(out, f"checkpoint-{STOP_AT}"))
        command, resumed_log = _command(after, out, cache, str(tmp_path / f"{name}_logs"))
        command += [*moe, *extra]
        assert run(command, log_path=str(tmp_path / f"{name}_logs" / "launch.log"), timeout=TIMEOUT) == 0, name
        with open(resumed_log, encoding="utf-8") as f:
            log = f.read()
        assert f"Continuing training from global step {STOP_AT}" in log and "optimizer shards merged" in log, name
        resumed = _train_losses(out)
        assert sorted(resumed) == list(range(1, STEPS + 1)), name
        for step, loss in resumed.items():
            assert loss == pytest.approx(expected[step], rel=1e-6), (name, step)
        got = _moments(os.path.join(out, f"checkpoint-{STEPS}"))
        assert want.keys() == got.keys() and want
        for key in want:
            scale = float(np.abs(want[key]).max())
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5 * scale, err_msg=f"{name}: {key}")
        got_records = _routing_records(out)
        assert got_records[:STOP_AT] == records[:STOP_AT], name  # restored from routing_history.json
        assert [record["step"] for record in got_records] == list(range(1, STEPS + 1)), name
        for mine, theirs in zip(got_records[STOP_AT:], records[STOP_AT:]):
            np.testing.assert_allclose(mine["expert_share"], theirs["expert_share"], atol=1e-4, err_msg=name)
