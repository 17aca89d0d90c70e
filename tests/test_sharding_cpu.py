"""Sharding stage2 and stage3 on 2 CPU processes (gloo, ``pretrain.cpu_comm.sharding``) through run_pretrain.py:
the same losses and final weights as one process; under stage2 an exact resume after kill -9 and a resume by
sharding stage1, under stage3 an exact resume.

The reference is one process training the same global batch of 4 samples as 2 micro-batches of 2 (gradient
accumulation 2): its gradient is g1/2 + g2/2, the stage2 ranks' (g1 + g2) x 1/2 (each bucket reduced to its
owner, scaled in the optimizer) and the stage3 ranks' g1/2 + g2/2 (scaled, then all-reduced), the same float32
numbers since halving is exact. Gradient clipping is off (``max_grad_norm 0``): paddle's clip sums each rank's
squared gradient norms and all-reduces the sums, another float32 order than one process's sum, and Adam
magnifies that last bit where a gradient is near zero (measured with clipping on under stage2: losses equal to
every digit, weights within 6e-6 of a tensor's scale, as under stage1); stage3 cannot clip on CPU at all
(preflight). The model is 192 wide so that stage3 slices the embedding and the LM head (8064 x 192 elements,
above paddle's ``segment_size`` of 2**20) and keeps the smaller tensors whole, both of its paths.
Measured here: losses and weights bit-identical in every comparison. The planner's communication payload of
stage2 and stage3 equals what each rank counted (stage3: the sliced tensors gathered twice and their full
gradients all-reduced per micro-batch, the whole ones' gradients all-reduced once a step).
"""

import os
import shutil
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from parallel_golden import communication_mismatches, planned_volume
from tiny_run import final_weights, kill_when, launch_command, python_script, run, spike_norm_figures, start, tiny_args

from pretrain.arguments import PreTrainingArguments
from pretrain.checkpoint import MARKER
from pretrain.layout import ParallelLayout
from pretrain.metrics.loss_curves import load_train_losses
from pretrain.preflight import GPU_ONLY_FLAGS, DeviceSupport, check_device
from pretrain.trainer import PretrainingTrainer

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

STEPS, SAVE_AT = 6, 3
TIMEOUT = 300  # seconds per launch: two gloo processes on a loaded 2-core machine
RTOL = 1e-6  # relative, per step loss and per tensor (of its largest magnitude); measured: 0
STAGE2 = ("--sharding", "stage2", "--sharding_parallel_degree", "2")
STAGE1 = ("--sharding", "stage1", "--sharding_parallel_degree", "2")
STAGE3 = ("--sharding", "stage3", "--sharding_parallel_degree", "2")


def _arguments(tmp_path, name: str, *extra: str) -> list:
    """run_pretrain.py's arguments of the tiny run in ``tmp_path/name``: a global batch of 2 x 2 samples, no
    clipping, 192 wide, a checkpoint every SAVE_AT steps."""
    return tiny_args(
        str(tmp_path / name),
        str(tmp_path / "cache"),
        *("--per_device_train_batch_size", "2", "--max_grad_norm", "0", "--hidden_size", "192"),
        *extra,
        steps=STEPS,
        save_steps=SAVE_AT,
    )


def _command(tmp_path, name: str, attempt: str, nproc: int, *extra: str) -> tuple:
    """(command, log folder ``tmp_path/<name>_<attempt>_logs``) of ``_arguments``' run."""
    logs = str(tmp_path / f"{name}_{attempt}_logs")
    os.makedirs(logs)
    args = _arguments(tmp_path, name, *extra)
    return (python_script(*args) if nproc == 1 else launch_command(nproc, logs) + args), logs


def _assert_planned_communication(tmp_path, name: str, *extra: str) -> None:
    """The planner's payload per collective (``parallel_golden.planned_volume``) is what each of the run's 2
    ranks counted in its last step (``parallel_golden.communication_mismatches``)."""
    planned, numel = planned_volume(_arguments(tmp_path, name, *extra), 2)
    assert not communication_mismatches(str(tmp_path / name), planned, numel, step=STEPS)


def _train(tmp_path, name: str, nproc: int, *extra: str, attempt: str = "first") -> tuple:
    """Run the tiny run to the end in ``tmp_path/name`` (resuming what is there); return (that folder, its logs)."""
    command, logs = _command(tmp_path, name, attempt, nproc, *extra)
    assert run(command, log_path=os.path.join(logs, "launch.log"), timeout=TIMEOUT) == 0, f"{name} failed: see {logs}"
    return str(tmp_path / name), logs


def _assert_same_run(got: str, want: str) -> None:
    """Per-step losses (every digit, loss_history.json) and final weights of run ``got`` equal ``want``'s (RTOL)."""
    want_losses, got_losses = load_train_losses(want), load_train_losses(got)
    assert [step for step, _ in got_losses] == list(range(1, STEPS + 1))
    assert [loss for _, loss in got_losses] == pytest.approx([loss for _, loss in want_losses], rel=RTOL)
    want_weights, got_weights = final_weights(want), final_weights(got)
    assert sorted(got_weights) == sorted(want_weights)
    for name, value in want_weights.items():
        scale = float(np.abs(value).max())
        np.testing.assert_allclose(got_weights[name], value, rtol=0, atol=RTOL * scale, err_msg=name)


def _copy_checkpoint(run: str, into) -> None:
    """Copy checkpoint-SAVE_AT of ``run`` into the new output folder ``into``, where the next run resumes it."""
    shutil.copytree(os.path.join(run, f"checkpoint-{SAVE_AT}"), os.path.join(into, f"checkpoint-{SAVE_AT}"))


def _moment_owners(checkpoint: str) -> list:
    """The parameter names whose Adam moments each optimizer file of ``checkpoint`` holds, in file order."""
    files = sorted(name for name in os.listdir(checkpoint) if name.endswith(".pdopt"))
    return [
        {key.rsplit("_moment1_0", 1)[0] for key in paddle.load(os.path.join(checkpoint, name)) if "moment1" in key}
        for name in files
    ]


@pytest.mark.slow
def test_sharding_stage2_and_stage3_on_two_processes_equal_one(tmp_path, demo_dir):
    single, _ = _train(tmp_path, "single", 1, "--gradient_accumulation_steps", "2")
    losses = [loss for _, loss in load_train_losses(single)]
    assert losses[-1] < losses[0] - 0.05  # the curve moves, so matching it means something
    stage2, _ = _train(tmp_path, "stage2", 2, *STAGE2)
    _assert_same_run(stage2, single)
    _assert_planned_communication(tmp_path, "stage2", *STAGE2)
    # the optimizer state really is split: two disjoint shards that together cover every parameter
    owners = _moment_owners(os.path.join(stage2, f"checkpoint-{SAVE_AT}"))
    assert len(owners) == 2 and all(owners) and not owners[0] & owners[1]
    assert len(owners[0] | owners[1]) == len(final_weights(single))

    # kill -9 once checkpoint-3 is complete; the same command resumes from it
    command, logs = _command(tmp_path, "killed", "first", 2, *STAGE2)
    process = start(command, log_path=os.path.join(logs, "launch.log"))
    assert kill_when(process, str(tmp_path / "killed" / f"checkpoint-{SAVE_AT}" / MARKER), timeout=TIMEOUT)
    resumed, _ = _train(tmp_path, "killed", 2, *STAGE2, attempt="resumed")
    _assert_same_run(resumed, stage2)

    # stage1 x2 resumes stage2's checkpoint-3: its ranks own other parameters, so the shards are merged
    _copy_checkpoint(stage2, tmp_path / "stage1")
    resharded, logs = _train(tmp_path, "stage1", 2, *STAGE1)
    with open(os.path.join(logs, "workerlog.0"), encoding="utf-8") as f:
        assert "loading its optimizer shards merged" in f.read()
    _assert_same_run(resharded, single)

    # stage3: parameters sliced too; its checkpoint-3 saved (the NaN guard checks the slices each rank holds)
    stage3, _ = _train(tmp_path, "stage3", 2, *STAGE3)
    _assert_same_run(stage3, single)
    # the spike detector judged the norm of the gradient the optimizer applies, as in one process; it was 2.0000 x
    # under stage2 (paddle scales by 1/N in the step) and 1.78-1.97 x under stage3 (the whole tensors' gradients,
    # reduced in the step, summed unscaled over the ranks)
    for sharded in (stage2, stage3):
        assert spike_norm_figures(sharded, SAVE_AT) == pytest.approx(spike_norm_figures(single, SAVE_AT), rel=1e-6)
    _assert_planned_communication(tmp_path, "stage3", *STAGE3)
    assert os.path.isfile(os.path.join(stage3, f"checkpoint-{SAVE_AT}", MARKER))
    sliced = [key for key in paddle.load(os.path.join(stage3, f"checkpoint-{SAVE_AT}", "optimizer.shard00.pdopt"))]
    assert any(key.startswith("slice@") for key in sliced)  # paddle's name of a sliced parameter's state
    # ... and resumed from it on the same layout
    _copy_checkpoint(stage3, tmp_path / "stage3_resumed")
    resumed, _ = _train(tmp_path, "stage3_resumed", 2, *STAGE3)
    _assert_same_run(resumed, stage3)


def test_preflight_refuses_on_cpu_only_stage3_with_clipping_stage2_overlap_and_offload():
    """Stage2 runs on CPU now (it was refused: "stage2 needs GPUs"), but not with enable_stage2_overlap or offload;
    stage3 too, without gradient clipping."""
    cpu, gpu = DeviceSupport("cpu", False, False, False), DeviceSupport("gpu", True, True, True)
    args = SimpleNamespace(
        max_grad_norm=1.0,
        sharding="stage2",
        sharding_parallel_config="",
        fp16=False,
        bf16=False,
        **{flag: False for flag, _ in GPU_ONLY_FLAGS},
    )
    for stage in (2, 3):
        plan = SimpleNamespace(
            training_args=args, layout=ParallelLayout(2, 1, sharding_stage=stage, sharding_parallel_degree=2)
        )
        assert check_device(plan, gpu) == []
        refused = check_device(plan, cpu)
        if stage == 2:
            assert refused == []
        else:
            assert len(refused) == 1 and refused[0].startswith("max_grad_norm: 1.0 cannot be applied under sharding")
    args.max_grad_norm = 0.0
    assert check_device(plan, cpu) == []
    # paddlenlp waits for stage2's overlapped broadcasts with paddle.device.synchronize, GPUs only
    args.sharding_parallel_config = "enable_stage2_overlap"
    plan.layout = ParallelLayout(2, 1, sharding_stage=2, sharding_parallel_degree=2)
    refused = check_device(plan, cpu)
    assert len(refused) == 1 and refused[0].startswith("sharding_parallel_config: enable_stage2_overlap is not")
    assert check_device(plan, gpu) == []
    args.sharding, args.sharding_parallel_config = "stage2 offload", ""  # the states are on the host already
    assert check_device(plan, cpu) == [
        "sharding: stage2 offload moves optimizer states from the GPUs to the host; "
        "on CPU they are there already: remove offload"
    ]


class _Projection(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.proj = paddle.nn.Linear(2, 2)
        self.norm = paddle.nn.LayerNorm(2)


def test_weight_decay_reaches_the_parameters_stage3_slices(tmp_path):
    """GroupShardedStage3 hands the optimizer a sliced parameter as ``slice@<name>``: paddlenlp's decay rule missed it
    (measured: stage3 x2 off one process by 3e-5 in the loss after 6 steps, 3% in the embedding)."""
    model = _Projection()
    args = PreTrainingArguments(output_dir=str(tmp_path), device="cpu", report_to="none", max_steps=1)
    decays = PretrainingTrainer(model=model, args=args).create_optimizer(0.1)._apply_decay_param_fun
    for parameter, decayed in ((model.proj.weight, True), (model.norm.weight, False), (model.proj.bias, False)):
        assert decays(parameter.name) == decays(f"slice@{parameter.name}") == decayed
