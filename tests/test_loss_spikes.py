"""loss_spike_policy end to end on the tiny LLaMA of tests/tiny_run.py (one process, real faults):

- skip: a spike injected at step k (``debug_inject_spike_at_step``: that batch's loss x 1000) is not applied,
  and the final weights equal, bit for bit, those of a run whose data omitted that batch (paddlenlp's
  ``skip_data_intervals``);
- rollback: back to the last healthy checkpoint before k, the batches from there to k skipped; the final
  weights equal a run that skipped those batches from the start; the event is in the log, the summary and
  the next checkpoint; killed right after the rollback and restarted, the run repeats the decision;
- with gradient accumulation 2: a skipped window, a rollback and its restart after a kill run, and end as
  without accumulation (bit-equal to a run that skipped the window from the start);
- rollback on 2 ranks (sharding stage1 x2, the same global batch): both ranks go back together and end with
  the weights and moments of a 2-rank run that skipped those batches from the start, and with the losses of
  the 1-process rollback;
- learning rate 1e3: with rollback and rollback_lr_factor 0.1 the run recovers and ends below its first
  loss; with none it stops and says no checkpoint is healthy (every checkpoint after step 1 has blown-up
  weights).
"""

import json
import os
import re
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from paddle.distributed.fleet.meta_parallel.pipeline_parallel import PipelineParallel
from tiny_run import final_weights, kill_on, launch_command, python_script, run, spike_norm_figures, start, tiny_args

from pretrain.nan_guard import NanGuard
from pretrain.preemption import Preemption
from pretrain.recovery import DIVERGED_EXIT_STATUS, INJECTED_SPIKE_FACTOR, SpikeWatch, pipeline_spike
from pretrain.step_verdict import StepVerdict

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

STEPS, SAVE_STEPS, SPIKE = 10, 2, 7
TIMEOUT = 300  # seconds: a tiny run takes about 10
SPIKES = ("--spike_warmup_steps", "2", "--debug_inject_spike_at_step", str(SPIKE))


def _run(tmp_path, name, *extra, steps=STEPS, expect=0) -> str:
    out = str(tmp_path / name)
    args = tiny_args(out, str(tmp_path / "cache"), *extra, steps=steps, save_steps=SAVE_STEPS)
    assert run(python_script(*args), log_path=out + ".log", timeout=TIMEOUT) == expect
    return out


def _read(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _log(out) -> str:
    with open(out + ".log", encoding="utf-8") as f:
        return f.read()


def _assert_same_weights(out, reference) -> None:
    want, got = final_weights(reference), final_weights(out)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.slow
def test_a_skipped_spike_equals_a_run_whose_data_omitted_that_batch(tmp_path, demo_dir):
    skipped = _run(tmp_path, "skip", "--loss_spike_policy", "skip", *SPIKES)
    omitted = _run(tmp_path, "omitted", "--skip_data_intervals", str(SPIKE), str(SPIKE))
    _assert_same_weights(skipped, omitted)
    summary = _read(os.path.join(skipped, "run_summary.json"))
    assert summary["spike_skipped_steps"] == [SPIKE]
    (event,) = summary["loss_spike_events"]
    assert event["step"] == SPIKE and event["action"] == "skip" and event["samples"] == [24, 28]
    assert event["loss"] > 1000  # the injected spike, 1000 x a loss of about 9
    history = _read(os.path.join(skipped, "loss_history.json"))
    assert history["skipped"] == [SPIKE] and SPIKE not in [step for step, _ in history["train"]]
    # only applied steps are trained tokens (4 samples x 64 tokens a step): 9 of 10, as when the data omits one
    assert summary["train_tokens"] == _read(os.path.join(omitted, "run_summary.json"))["train_tokens"] == 9 * 256
    assert f"step {SPIKE}/{STEPS} | skipped" in _log(skipped)
    # Without a policy the spike is only reported, and the poisoned update is applied.
    left_alone = _run(tmp_path, "none", *SPIKES)
    assert "left alone (loss_spike_policy none)" in _log(left_alone)
    assert not np.array_equal(
        final_weights(left_alone)["llama.norm.weight"], final_weights(omitted)["llama.norm.weight"]
    )


ROLLBACK = ("--loss_spike_policy", "rollback", "--rollback_skip_batches", "2", *SPIKES)


@pytest.fixture(scope="module")
def rolled_back(tmp_path_factory, demo_dir) -> str:
    return _run(tmp_path_factory.mktemp("rollback"), "rollback", *ROLLBACK)


@pytest.mark.slow
def test_rollback_goes_back_to_the_last_healthy_checkpoint_and_skips_to_the_spike(tmp_path, rolled_back):
    # checkpoint-6 is not healthy (step 7, computed on its weights, spiked): back to checkpoint-4, steps 5-7 skipped.
    assert "rolling back to checkpoint-4 and skipping the batches of steps 5-7" in _log(rolled_back)
    reference = _run(tmp_path, "reference", "--skip_data_intervals", "5", "7")
    _assert_same_weights(rolled_back, reference)
    summary = _read(os.path.join(rolled_back, "run_summary.json"))
    assert summary["rollbacks"] == 1 and summary["rollback_skipped_batches"] == [[5, 7]]
    assert summary["train_tokens"] == 7 * 256  # steps 5-7 trained, then abandoned: 7 of the 10 steps count
    # goodput: the step time of steps 5-7, trained and then thrown away, is lost; one process, its time once
    assert summary["attempts"] == 1 and summary["lost_seconds"] > 0
    assert summary["productive_seconds"] == pytest.approx(
        sum(summary["time_breakdown"][phase] for phase in ("forward_backward", "communication", "optimizer"))
        - summary["lost_seconds"]
    )
    assert [event["step"] for event in summary["loss_spike_events"]] == [SPIKE]
    recovery = _read(os.path.join(rolled_back, "checkpoint-8", "recovery.json"))  # the next checkpoint
    assert recovery["skip_windows"] == [[5, 7]] and recovery["events"][0]["rolled_back_to"] == 4
    assert os.path.isdir(os.path.join(rolled_back, "rolled-back-1-at-step-7", "checkpoint-6"))
    assert not os.path.exists(os.path.join(rolled_back, "rollback.json"))  # checkpoint-8 holds the decision
    assert np.isfinite(summary["train_loss_last"]) and summary["train_loss_last"] < summary["train_loss_first"]


def _killed_after_the_rollback_and_restarted(tmp_path, *extra) -> str:
    """The output_dir of a ``ROLLBACK`` run killed (-9) right after it rolled back, then restarted."""
    out = str(tmp_path / "killed")
    args = tiny_args(out, str(tmp_path / "cache"), *ROLLBACK, *extra, steps=STEPS, save_steps=SAVE_STEPS)
    process = start(python_script(*args), log_path=out + ".first.log")
    moved = os.path.join(out, "rolled-back-1-at-step-7")
    assert kill_on(process, lambda: os.path.isdir(moved), timeout=TIMEOUT), "the run ended before the rollback"
    assert os.path.exists(os.path.join(out, "rollback.json"))
    assert run(python_script(*args), log_path=out + ".log", timeout=TIMEOUT) == 0
    assert "repeating the rollback recorded in" in _log(out)
    return out


@pytest.mark.slow
def test_a_kill_right_after_a_rollback_repeats_it_on_restart(tmp_path, rolled_back):
    out = _killed_after_the_rollback_and_restarted(tmp_path)
    _assert_same_weights(out, rolled_back)
    assert _read(os.path.join(out, "loss_history.json")) == _read(os.path.join(rolled_back, "loss_history.json"))


ACCUMULATION = ("--gradient_accumulation_steps", "2", "--per_device_train_batch_size", "2")  # the global batch of 4


@pytest.mark.slow
def test_skipped_windows_rollback_and_restart_with_gradient_accumulation(tmp_path, rolled_back):
    """paddlenlp 3.0.0b4 starts its read-data timer after every micro-batch a skipped window drops and stops it only
    with ignore_data_skip: with accumulation 2, a window of 3 steps (6 micro-batches), the rollback that skips
    them and the restart after a kill all stopped with ``AssertionError: read-data timer has already started``."""
    reference = _run(tmp_path, "reference", *ACCUMULATION, "--skip_data_intervals", "5", "7")
    history = _read(os.path.join(reference, "loss_history.json"))
    assert history["skipped"] == [5, 6, 7] and [step for step, _ in history["train"]] == [1, 2, 3, 4, 8, 9, 10]
    one_batch, rolled_back = rolled_back, _run(tmp_path, "rollback", *ACCUMULATION, *ROLLBACK)
    assert "rolling back to checkpoint-4 and skipping the batches of steps 5-7" in _log(rolled_back)
    _assert_same_weights(rolled_back, reference)
    restarted = _killed_after_the_rollback_and_restarted(tmp_path, *ACCUMULATION)
    _assert_same_weights(restarted, reference)
    assert _read(os.path.join(restarted, "loss_history.json")) == _read(os.path.join(rolled_back, "loss_history.json"))
    # The detector saw the steps' mean losses as without accumulation (it saw them divided by 2: paddlenlp
    # divides each micro-batch's loss by the accumulation steps), and the same gradient norms.
    (event,) = _read(os.path.join(rolled_back, "run_summary.json"))["loss_spike_events"]
    (unaccumulated,) = _read(os.path.join(one_batch, "run_summary.json"))["loss_spike_events"]
    for key in ("loss", "ema_loss", "grad_norm", "ema_grad_norm"):
        assert event[key] == pytest.approx(unaccumulated[key], rel=1e-4), key


TWO_RANKS_TIMEOUT = 600  # seconds: two gloo processes on a loaded 2-core machine (about 40 s idle)


def _two_ranks(tmp_path, name, *extra) -> tuple:
    """(output_dir, worker log folder) of the tiny run on 2 processes under sharding stage1 x2, 2 samples each."""
    out, logs = str(tmp_path / name), str(tmp_path / f"{name}_logs")
    os.makedirs(logs)
    sharding = ("--sharding", "stage1", "--sharding_parallel_degree", "2", "--per_device_train_batch_size", "2")
    args = tiny_args(out, str(tmp_path / "cache"), *sharding, *extra, steps=STEPS, save_steps=SAVE_STEPS)
    command = launch_command(2, logs) + args
    assert run(command, log_path=os.path.join(logs, "launch.log"), timeout=TWO_RANKS_TIMEOUT) == 0, f"see {logs}"
    return out, logs


@pytest.mark.slow
def test_two_ranks_roll_back_together(tmp_path, rolled_back):
    """Under sharding stage1 each rank updates its own half of the parameters (and saves its own moments), so the
    model rank 0 saves holds both ranks' updates: a rank that kept the abandoned weights would show in it."""
    out, logs = _two_ranks(tmp_path, "rollback", *ROLLBACK)
    for rank in (0, 1):
        with open(os.path.join(logs, f"workerlog.{rank}"), encoding="utf-8") as f:
            assert "rolling back to checkpoint-4 and skipping the batches of steps 5-7" in f.read(), rank
    reference, _ = _two_ranks(tmp_path, "reference", "--skip_data_intervals", "5", "7")
    _assert_same_weights(out, reference)
    for shard in ("optimizer.shard00.pdopt", "optimizer.shard01.pdopt"):  # written by rank 0 and rank 1
        want = paddle.load(os.path.join(reference, f"checkpoint-{STEPS}", shard))
        got = paddle.load(os.path.join(out, f"checkpoint-{STEPS}", shard))
        assert got.keys() == want.keys()
        for name in set(want) - {"LR_Scheduler"}:
            np.testing.assert_array_equal(got[name].numpy(), want[name].numpy(), err_msg=f"{shard}: {name}")
    # The 1-process rollback at the same global batch: equal up to the float32 rounding of another reduction
    # order (measured: losses 1.1e-7 relative, weights 8e-5 of each tensor's largest value; a replica left on
    # the abandoned weights is off by 5e-2).
    want, got = _read(os.path.join(rolled_back, "loss_history.json")), _read(os.path.join(out, "loss_history.json"))
    assert [step for step, _ in got["train"]] == [step for step, _ in want["train"]] == [1, 2, 3, 4, 8, 9, 10]
    assert [loss for _, loss in got["train"]] == pytest.approx([loss for _, loss in want["train"]], rel=1e-6)
    single, sharded = final_weights(rolled_back), final_weights(out)
    for name in single:
        scale = float(np.abs(single[name]).max())
        np.testing.assert_allclose(sharded[name], single[name], rtol=0, atol=1e-3 * scale, err_msg=name)


def _norm_figures(out) -> list:
    """The gradient-norm figures the detector kept over the healthy steps 1-4 (checkpoint-4's state)."""
    return spike_norm_figures(out, 4)


@pytest.mark.slow
def test_the_detector_judges_the_global_gradient_norm_on_every_layout(tmp_path, demo_dir):
    """The same global batch of 4 in one process, data parallel 2 and sharding stage1 and stage2 x2: the detector
    sees the norm of the whole gradient (the one the optimizer clips) on every layout, not a rank's own before the
    reduce (under sharding stage1 that was the norm of a half batch's gradient, and larger). Under stage2 it was
    2.0000 x one process's (max, min and moving average alike): paddle scales stage2's reduced sums by 1/N
    inside the optimizer's step, after the detector read them."""
    single = _norm_figures(_run(tmp_path, "single", steps=4))
    sharding = ("--sharding_parallel_degree", "2")
    layouts = {"dp2": (), "stage1": ("--sharding", "stage1", *sharding), "stage2": ("--sharding", "stage2", *sharding)}
    for name, layout in layouts.items():
        out, logs = str(tmp_path / name), str(tmp_path / f"{name}_logs")
        os.makedirs(logs)
        batch = ("--per_device_train_batch_size", "2")
        command = launch_command(2, logs) + tiny_args(
            out, str(tmp_path / "cache"), *layout, *batch, steps=4, save_steps=2
        )
        assert run(command, log_path=os.path.join(logs, "launch.log"), timeout=TWO_RANKS_TIMEOUT) == 0, f"see {logs}"
        assert _norm_figures(out) == pytest.approx(single, rel=1e-6), name


@pytest.mark.slow
def test_learning_rate_1e3_recovers_by_rolling_back_with_a_lower_learning_rate(tmp_path, demo_dir):
    out = _run(
        tmp_path,
        "diverging",
        *("--learning_rate", "1e3", "--loss_spike_policy", "rollback", "--rollback_lr_factor", "0.1"),
        *("--max_rollbacks", "8", "--rollback_skip_batches", "1"),
        steps=30,
    )
    summary = _read(os.path.join(out, "run_summary.json"))
    assert summary["rollbacks"] >= 4  # 1e3 x 0.1^4 = 0.1 is the first rate that might not diverge
    assert np.isfinite(summary["train_loss_last"]) and summary["train_loss_last"] < summary["train_loss_first"]
    assert all(np.isfinite(value).all() for value in final_weights(out).values())


@pytest.mark.slow
def test_learning_rate_1e3_without_a_policy_names_no_blown_up_checkpoint(tmp_path, demo_dir):
    out = _run(tmp_path, "diverging", "--learning_rate", "1e3", steps=10, expect=2)
    (error,) = [line for line in _log(out).splitlines() if line.startswith("error: ")]
    assert "no checkpoint is known to be healthy" in error and "overwrite_output_dir true" in error, error


@pytest.mark.slow
def test_a_run_whose_loss_never_recovers_ends_diverged_with_its_own_exit_status(tmp_path, demo_dir):
    """learning_rate 50 with nan_policy skip: the loss jumps from 9.0 to 64 (7 x the uniform guess) at step 2 and
    never comes back. Before: exit status 0, "done at step 12: train loss 9.0029 -> 64.0000", nothing said of
    the 11 spikes in 12 steps, so a scheduler took it for a success. Rerunning the finished run says it again."""
    diverging = ("--learning_rate", "50", "--nan_policy", "skip")
    out = _run(tmp_path, "diverged", *diverging, steps=12, expect=DIVERGED_EXIT_STATUS)
    (line,) = [line for line in _log(out).splitlines() if line.startswith("diverged: ")]
    spikes = int(re.search(r"the loss never recovered: (\d+) loss spike\(s\) in 12 steps", line).group(1))
    assert spikes >= 8 and "no checkpoint is known to be healthy" in line, line
    assert "] diverged (the loss never recovered from its spikes) at step 12: train loss" in _log(out)
    assert _read(os.path.join(out, "run_summary.json"))["diverged"] == line.removeprefix("diverged: ")
    again = tiny_args(out, str(tmp_path / "cache"), *diverging, steps=12, save_steps=SAVE_STEPS)
    assert run(python_script(*again), log_path=out + ".again.log", timeout=TIMEOUT) == DIVERGED_EXIT_STATUS


def test_a_spike_is_recovered_from_after_spike_warmup_steps_healthy_steps(tmp_path):
    args = SimpleNamespace(loss_spike_policy="none", spike_factor=10.0, spike_warmup_steps=2, output_dir=str(tmp_path))
    watch = SpikeWatch(args, 4)
    for step, loss in enumerate((9.0, 8.0, 7.0, 700.0), start=1):
        watch.judge(step, loss, 1.0, None)
    assert "1 loss spike(s) in 4 steps, the last at step 4 (loss 700 > 10 x" in watch.unrecovered(4)
    watch.judge(5, 7.0, 1.0, None)
    assert "then 1 healthy step(s) of the 2 in a row" in watch.summary(5)["diverged"]
    watch.judge(6, 7.0, 1.0, None)
    assert watch.unrecovered(6) is None and watch.summary(6)["diverged"] is None


def test_under_pipeline_parallelism_the_injected_spike_reaches_the_loss_the_pipeline_computes():
    """paddle 3.3.1's pipeline schedules compute each micro-batch's loss on the last stage in
    ``PipelineParallel._maybe_loss_compute`` from its layers' ``_loss_fn`` (paddlenlp's training_pipeline_step
    never calls ``compute_loss``, where the injection of the other layouts is). Pipeline parallelism does not
    run on CPU here: paddle's method runs on a stand-in holding what it reads."""
    pipeline = SimpleNamespace(
        _layers=SimpleNamespace(_loss_fn=[lambda output, labels: ((output - labels) ** 2).mean()]),
        is_pipeline_last_stage=lambda: True,
        _compute_loss=True,
        loss_fn_idx=0,
        accumulate_steps=2,
        _delay_scale_loss=False,
        total_loss=None,
        _check_micro_batch_data_valid=lambda labels: None,
    )

    def micro_batch_loss() -> float:  # the loss the backward starts from: mean squared error 1, / 2 micro-batches
        loss, _ = PipelineParallel._maybe_loss_compute(
            pipeline, paddle.ones([2, 3]), iter([(None, paddle.zeros([2, 3]))])
        )
        return float(loss)

    with pipeline_spike(pipeline):
        assert micro_batch_loss() == 0.5 * INJECTED_SPIKE_FACTOR
    assert micro_batch_loss() == 0.5
    assert [float(loss) for loss in pipeline.total_loss[0]] == [0.5 * INJECTED_SPIKE_FACTOR, 0.5]  # what it returns


def test_under_pipeline_parallelism_the_detector_sees_the_steps_mean_loss(tmp_path):
    """paddlenlp's training_pipeline_step returns 0 for the first gradient_accumulation_steps - 1 micro-batches and
    then the pipeline's mean loss (``PipelineParallel._broadcast_final_loss``: the sum of the micro-batch losses,
    each divided by the accumulation steps): the detector judged that mean divided by the accumulation steps again.
    The trainer's hooks are called as paddlenlp's loop calls them, the pipeline's returns given."""
    args = SimpleNamespace(
        loss_spike_policy="none",
        spike_factor=10.0,
        spike_warmup_steps=2,
        output_dir=str(tmp_path),
        pipeline_parallel_degree=2,
        gradient_accumulation_steps=4,
    )
    guard = NanGuard("stop", 0, world_size=1, spikes=SpikeWatch(args, 4))
    trainer = SimpleNamespace(
        nan_guard=guard,
        optimizer=SimpleNamespace(_parameter_list=[]),
        model_wrapped=None,  # not sharding stage2's wrapper
        args=args,
        state=SimpleNamespace(global_step=0),
        preemption=Preemption(None, world_size=1),
        _enable_delay_scale_loss=lambda: True,  # not applied under pipeline parallelism
    )
    tr_loss = paddle.zeros([])
    for returned in (0.0, 0.0, 0.0, 8.5):
        tr_loss += guard.add_loss(paddle.to_tensor(returned))
    verdict = StepVerdict(trainer)
    verdict.keep_loss(tr_loss)  # PretrainingTrainer._check_loss_valid
    verdict.judge()  # at on_optimizer_begin
    assert guard.spikes.state.ema_loss == 8.5 and float(tr_loss) == 8.5


def _routing_records(out) -> dict:
    """``{step: expert_share}`` of a run's routing records (run_summary.json)."""
    records = _read(os.path.join(out, "run_summary.json"))["routing"]["records"]
    return {record["step"]: record["expert_share"] for record in records}


@pytest.mark.slow
def test_a_mixture_of_experts_skips_and_rolls_back_with_gradient_accumulation(tmp_path, demo_dir):
    """The tiny run as Mixtral (4 experts, top-2, load-balancing loss on) with accumulation 2: the skipped spike
    ends bit-equal to a run whose data omitted that batch, the rollback bit-equal to a run that skipped steps 5-7
    from the start. Routing records: the rollback's equal that run's (the abandoned steps' records and the
    figures of the spiked forward are dropped with the checkpoint's restore); the skip keeps the spiked
    batch's record (its forward ran, and routing may be what spiked), else the same as the omitted run's."""
    moe = ("--model_name_or_path", "mixtral-debug", *ACCUMULATION)
    skipped = _run(tmp_path, "skip", *moe, "--loss_spike_policy", "skip", *SPIKES)
    omitted = _run(tmp_path, "omitted", *moe, "--skip_data_intervals", str(SPIKE), str(SPIKE))
    _assert_same_weights(skipped, omitted)
    assert _read(os.path.join(skipped, "run_summary.json"))["spike_skipped_steps"] == [SPIKE]
    skip_records, omitted_records = _routing_records(skipped), _routing_records(omitted)
    assert SPIKE in skip_records and SPIKE not in omitted_records
    assert {step: share for step, share in skip_records.items() if step != SPIKE} == omitted_records

    rolled_back = _run(tmp_path, "rollback", *moe, *ROLLBACK)
    assert "rolling back to checkpoint-4 and skipping the batches of steps 5-7" in _log(rolled_back)
    reference = _run(tmp_path, "reference", *moe, "--skip_data_intervals", "5", "7")
    _assert_same_weights(rolled_back, reference)
    assert any(".block_sparse_moe.experts." in name for name in final_weights(reference))
    records = _routing_records(reference)
    assert sorted(records) == [1, 2, 3, 4, 8, 9, 10]
    assert _routing_records(rolled_back) == records
