"""NaN guard through the real PretrainingTrainer loop: stop with the step number and the last complete
checkpoint, or skip the update (weights and Adam state unchanged) up to max_skipped_nan_steps times;
one collective and one host sync per optimizer step.

Most cases use a 4 -> 1 linear regression on float features so that one chosen batch can carry a NaN
(a LLaMA's token ids cannot); everything else is the application's trainer and paddle's AdamW. The
real divergence is the tiny LLaMA of tests/tiny_run.py with a learning rate that diverges.
"""

import json
import os
import re
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from conftest import pretrain_log_records
from paddle.distributed import fleet
from paddlenlp.trainer import TrainerCallback
from tiny_run import python_script, run, tiny_args

from pretrain.arguments import PreTrainingArguments
from pretrain.checkpoint import checkpoint_problem, list_checkpoints
from pretrain.errors import RunStopped
from pretrain.nan_guard import NanGuard, NonFiniteLossError
from pretrain.preemption import Preemption, StopSignals
from pretrain.recovery import SpikeWatch
from pretrain.step_verdict import StepVerdict
from pretrain.trainer import PretrainingTrainer

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

BATCH = 2
BAD_STEP = 4  # 1-based optimizer step whose batch holds a NaN feature


class Regression(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.linear = paddle.nn.Linear(4, 1)

    def forward(self, x, y):
        return (((self.linear(x).squeeze(-1) - y) ** 2).mean(),)


class Recorder(TrainerCallback):
    """Copies of the weights and optimizer state after every optimizer step, by global step."""

    def __init__(self):
        self.weights, self.optimizer_state = {}, {}

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.weights[state.global_step] = model.linear.weight.numpy().copy()
        self.optimizer_state[state.global_step] = {
            name: value.numpy().copy() for name, value in optimizer.state_dict().items() if hasattr(value, "numpy")
        }


def _dataset(num_steps: int, with_nan: bool = True) -> list:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(num_steps * BATCH, 4)).astype("float32")
    if with_nan:
        x[(BAD_STEP - 1) * BATCH, 0] = np.nan
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], dtype="float32")).astype("float32")
    return [{"x": x[i], "y": y[i]} for i in range(len(x))]


def _trainer(tmp_path, **args) -> PretrainingTrainer:
    paddle.seed(0)
    training_args = PreTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=6,
        per_device_train_batch_size=BATCH,
        learning_rate=0.05,
        warmup_steps=0,
        min_learning_rate=0.05,
        save_steps=2,
        logging_steps=1,
        device="cpu",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        **args,
    )
    return PretrainingTrainer(model=Regression(), args=training_args, train_dataset=_dataset(6))


def test_stop_names_the_step_and_the_last_complete_checkpoint(tmp_path):
    trainer = _trainer(tmp_path)
    with pytest.raises(NonFiniteLossError, match=f"at step {BAD_STEP};.*checkpoint-2") as error:
        trainer.train()
    assert "\n" not in str(error.value)
    assert checkpoint_problem(os.path.join(tmp_path, "checkpoint-2")) is None
    assert not os.path.exists(os.path.join(tmp_path, f"checkpoint-{BAD_STEP}"))  # nothing saved after it


def test_skip_leaves_weights_and_adam_state_unchanged(tmp_path):
    trainer = _trainer(tmp_path, nan_policy="skip", max_skipped_nan_steps=1)
    recorder = Recorder()
    trainer.add_callback(recorder)
    trainer.train()
    weights, moments = recorder.weights, recorder.optimizer_state
    assert trainer.nan_guard.skipped_steps == [BAD_STEP]
    assert trainer.state.global_step == 6
    np.testing.assert_array_equal(weights[BAD_STEP], weights[BAD_STEP - 1])
    for name, value in moments[BAD_STEP].items():
        np.testing.assert_array_equal(value, moments[BAD_STEP - 1][name], err_msg=name)
    assert not np.array_equal(weights[BAD_STEP + 1], weights[BAD_STEP])  # training went on
    assert all(np.isfinite(w).all() for w in weights.values())


def test_a_skipped_step_is_recorded_as_skipped_not_as_loss_zero(tmp_path):
    trainer = _trainer(tmp_path, nan_policy="skip", max_skipped_nan_steps=1)
    with pretrain_log_records() as messages:
        trainer.train()
    assert BAD_STEP not in [step for step, _ in trainer.loss_history.train]
    assert [step for step, _ in trainer.loss_history.train] == [1, 2, 3, 5, 6]
    assert trainer.loss_history.skipped == [BAD_STEP]
    with open(tmp_path / "loss_history.json", encoding="utf-8") as f:
        assert json.load(f)["skipped"] == [BAD_STEP]
    assert f"step {BAD_STEP}/6 | skipped: no update applied (1 step(s))" in messages
    assert not any(f"step {BAD_STEP}/6 | loss" in message for message in messages)


def test_a_checkpoint_due_at_a_skipped_step_waits_for_the_next_applied_step(tmp_path):
    """Step 4's update is skipped, so the weights of step 3 are not confirmed until step 5 applies an update on
    them: checkpoint-4 is saved as checkpoint-5. Step 4 is no trained step."""
    trainer = _trainer(tmp_path, nan_policy="skip", max_skipped_nan_steps=1)
    with pretrain_log_records() as messages:
        trainer.train()
    assert [step for step, _ in list_checkpoints(str(tmp_path))] == [2, BAD_STEP + 1, 6]
    assert (
        f"checkpoint-{BAD_STEP} not saved: the update of step {BAD_STEP} was skipped, so no applied step confirmed "
        f"the weights of step {BAD_STEP - 1}; it is saved after the next applied step"
    ) in messages
    assert trainer.applied_steps() == 5  # run_summary.json's train_tokens: 5 x the global batch tokens
    assert checkpoint_problem(os.path.join(tmp_path, f"checkpoint-{BAD_STEP + 1}")) is None


class StopRequestAt(TrainerCallback):
    """A stop request for the trainer's Preemption (as a SIGTERM makes), from the start of optimizer step ``step``."""

    def __init__(self, signals: StopSignals, step: int):
        self.signals, self.step = signals, step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            self.signals.received = "SIGTERM"


def test_a_stop_request_at_a_skipped_step_saves_nothing_and_says_so(tmp_path):
    trainer = _trainer(tmp_path, nan_policy="skip", max_skipped_nan_steps=1)
    trainer.preemption.signals = StopSignals()  # not installed: this process's handlers stay
    trainer.add_callback(StopRequestAt(trainer.preemption.signals, BAD_STEP))
    trainer.train()
    assert [step for step, _ in list_checkpoints(str(tmp_path))] == [2]
    with pytest.raises(RunStopped) as stop:
        trainer.preemption.raise_if_stopped(str(tmp_path))
    assert str(stop.value) == (
        f"SIGTERM: stopped at step {BAD_STEP} of 6 and saved nothing (its weights were not confirmed); the last "
        f"complete checkpoint is {tmp_path}/checkpoint-2: the same command resumes from it (exit status 75: requeue)"
    )


def test_skip_stops_after_max_skipped_steps(tmp_path):
    trainer = _trainer(tmp_path, nan_policy="skip", max_skipped_nan_steps=0)
    with pytest.raises(NonFiniteLossError, match=f"at step {BAD_STEP}"):
        trainer.train()


class SyncCounter(TrainerCallback):
    """Collectives (paddle.distributed.all_reduce) and host syncs (Tensor.item/numpy/tolist) from the start
    of each optimizer step to the optimizer: the micro-batches and the guard's verdict."""

    def __init__(self, monkeypatch):
        self.counts, self.per_step = {"all_reduce": 0, "host_sync": 0}, []
        for name in ("item", "numpy", "tolist"):
            monkeypatch.setattr(paddle.Tensor, name, self._counting(getattr(paddle.Tensor, name), "host_sync"))
        monkeypatch.setattr(
            paddle.distributed, "all_reduce", self._counting(lambda tensor, **kwargs: None, "all_reduce")
        )

    def _counting(self, function, key):
        def counted(*args, **kwargs):
            self.counts[key] += 1
            return function(*args, **kwargs)

        return counted

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = dict(self.counts)

    def on_optimizer_begin(self, args, state, control, **kwargs):
        self.per_step.append({key: self.counts[key] - self._start[key] for key in self.counts})


def test_guard_syncs_once_per_optimizer_step_not_per_micro_batch(tmp_path, monkeypatch):
    # What a GPU run would do: 2 ranks (the all-reduce counted, not run), 8 micro-batches per optimizer step.
    trainer = _trainer(tmp_path, gradient_accumulation_steps=8)
    trainer.train_dataset = _dataset(6 * 8, with_nan=False)  # 6 optimizer steps of 8 micro-batches
    trainer.nan_guard.world_size = 2
    counter = SyncCounter(monkeypatch)
    trainer.add_callback(counter)
    trainer.train()
    assert len(counter.per_step) == 6
    assert counter.per_step == [{"all_reduce": 1, "host_sync": 1}] * 6


def _diverge(tmp_path, *extra) -> tuple:
    """(error line, output_dir) of the tiny LLaMA run with learning rate 1e6 (a real divergence: its loss stays
    finite, paddle's CPU cross-entropy giving ln V for non-finite logits), a checkpoint every step."""
    out, log = str(tmp_path / "out"), str(tmp_path / "run.log")
    args = tiny_args(out, str(tmp_path / "cache"), "--learning_rate", "1e6", *extra, steps=10, save_steps=1)
    assert run(python_script(*args), log_path=log, timeout=300) == 2
    with open(log, encoding="utf-8") as f:
        (error,) = [line.strip() for line in f if line.startswith("error: ")]
    return error, out


def _assert_complete_checkpoints_are_finite_and_before(out: str, step: int) -> None:
    for saved, path in list_checkpoints(out):
        if checkpoint_problem(path) is None:
            assert saved < step, path
            weights = paddle.load(os.path.join(path, "model_state.pdparams"))
            assert all(np.isfinite(value.numpy()).all() for value in weights.values()), path


@pytest.mark.slow
def test_real_divergence_stops_and_leaves_no_non_finite_checkpoint(tmp_path, demo_dir):
    error, out = _diverge(tmp_path)
    match = re.match(r"error: non-finite gradients \(the loss stayed finite: .*\) at step (\d+); stopped", error)
    assert match, error
    step = int(match.group(1))
    # Every checkpoint after the first update holds blown-up weights: none is named as one to restart from.
    assert "no checkpoint is known to be healthy" in error and "overwrite_output_dir true" in error, error
    _assert_complete_checkpoints_are_finite_and_before(out, step)


@pytest.mark.slow
def test_real_divergence_with_skip_stops_after_max_skipped_steps(tmp_path, demo_dir):
    error, out = _diverge(tmp_path, "--nan_policy", "skip", "--max_skipped_nan_steps", "2")
    match = re.match(r"error: non-finite gradients .* at step (\d+) after skipping steps \[(\d+), (\d+)\]", error)
    assert match, error
    step, first, second = (int(group) for group in match.groups())
    assert (first, second) == (step - 2, step - 1)  # the weights stay diverged: every step after is bad too
    _assert_complete_checkpoints_are_finite_and_before(out, step)


@pytest.mark.slow
def test_real_divergence_with_skip_never_ends_on_the_blown_up_weights(tmp_path, demo_dir):
    """lr 1e6 blows the weights up at step 2 (max |w| 5e10); every later step's gradients are non-finite and
    skipped. Within max_skipped_nan_steps (10) to the last step, it used to end with status 0, "done", eval loss
    ln V, checkpoints 8 and 12 and the final model holding the weights of step 2, and train_tokens counting all
    12 steps. Now no checkpoint is saved while no update confirms the weights, and the skipped last step stops
    the run: status 2, one line, nothing written after step 2."""
    out, log = str(tmp_path / "out"), str(tmp_path / "run.log")
    args = tiny_args(
        out, str(tmp_path / "cache"), "--learning_rate", "1e6", "--nan_policy", "skip", steps=12, save_steps=4
    )
    assert run(python_script(*args), log_path=log, timeout=300) == 2
    with open(log, encoding="utf-8") as f:
        text = f.read()
    (error,) = [line for line in text.splitlines() if line.startswith("error: ")]
    assert error.startswith(
        "error: non-finite gradients (the loss stayed finite: the weights are diverging) at step 12, the last: the "
        "updates of steps 3-12 were skipped, so no applied step confirmed the weights of step 2, and a run does not "
        "end on unconfirmed weights; stopped without saving, no checkpoint is known to be healthy"
    ), error
    assert "checkpoint-4 not saved: the updates of steps 3-4 were skipped" in text
    assert "checkpoint-8 not saved: the updates of steps 3-8 were skipped" in text
    assert list_checkpoints(out) == []
    for name in ("model_state.pdparams", "run_summary.json"):
        assert not os.path.exists(os.path.join(out, name)), name


@pytest.mark.parametrize("delayed", [False, True])
def test_a_skipped_step_takes_back_what_paddlenlp_added_to_the_logged_loss(tmp_path, delayed):
    """paddlenlp's loop (trainer.py, _inner_training_loop) adds each micro-batch's loss to ``tr_loss``, and
    with ``enable_delay_scale_loss`` (tensor_parallel_config, TP > 1, no pipeline) divides ``tr_loss`` by
    gradient_accumulation_steps just before ``_check_loss_valid``: a skipped step (judged at on_optimizer_begin,
    once the gradients are reduced) must take back its sum as it stands then (GPU-only path, so the hooks are
    called directly as the loop calls them)."""
    earlier, step_sum, accumulation = 1.5, 3.0, 4
    guard = SimpleNamespace(
        verdict=lambda *args, **kwargs: True, step_loss_sum=paddle.to_tensor(step_sum), agreed_requests=0
    )
    args = SimpleNamespace(
        output_dir=str(tmp_path), pipeline_parallel_degree=1, gradient_accumulation_steps=accumulation
    )
    trainer = SimpleNamespace(
        nan_guard=guard,
        optimizer=SimpleNamespace(_parameter_list=[]),
        model_wrapped=None,  # not sharding stage2's wrapper
        state=SimpleNamespace(global_step=6),
        args=args,
        _enable_delay_scale_loss=lambda: delayed,
        _skip_steps_since_last_logged=0,
        preemption=Preemption(None, world_size=1),
    )
    tr_loss = paddle.to_tensor((earlier + step_sum) / accumulation if delayed else earlier + step_sum)
    verdict = StepVerdict(trainer)
    verdict.keep_loss(tr_loss)  # PretrainingTrainer._check_loss_valid
    verdict.judge()  # at on_optimizer_begin
    assert tr_loss.item() == pytest.approx(earlier / accumulation if delayed else earlier)
    assert trainer._skip_steps_since_last_logged == 1


def test_the_guard_waits_for_sharding_stage2s_overlapped_reduce():
    """Under sharding stage2 with enable_stage2_overlap, paddle's GroupShardedStage2 reduces the last
    gradient bucket asynchronously and waits for it (``_comm_task.wait()``) only inside the optimizer's
    step, after on_optimizer_begin (GPU-only path: the optimizer attributes paddlenlp's ``_wrap_model`` sets
    are built here, and the hooks are called as the loop calls them). A nan or inf that arrives with that
    reduce must still be judged."""
    model = paddle.nn.Linear(2, 2)
    model(paddle.ones([1, 2])).sum().backward()

    class Task:  # the in-flight reduce: its result lands in the gradient when waited for
        def wait(self):
            model.weight.grad.set_value(paddle.full_like(model.weight.grad, float("inf")))

    trainer = SimpleNamespace(
        nan_guard=NanGuard("stop", 0, world_size=1),
        preemption=Preemption(None, world_size=1),
        model=model,
        model_wrapped=model,
        optimizer=SimpleNamespace(_reduce_overlap=True, _comm_task=Task(), _parameter_list=model.parameters()),
        state=SimpleNamespace(global_step=0),
        args=SimpleNamespace(output_dir="unused", pipeline_parallel_degree=1),
        _enable_delay_scale_loss=lambda: False,
    )
    verdict = StepVerdict(trainer)
    verdict.keep_loss(paddle.to_tensor(1.0))
    with pytest.raises(NonFiniteLossError, match="non-finite gradients"):
        verdict.judge()


def test_under_sharding_stage3_the_guard_checks_the_slices_each_rank_holds(tmp_path):
    """paddle's GroupShardedStage3 frees a sliced parameter outside forward and backward (its weights: this
    rank's slice in ``fw_storage``) and clears its ``grad`` (the reduced gradient's slice: ``bw_storage``)."""
    released = paddle.create_parameter([4], "float32")
    released._clear_data()  # as GroupShardedStage3 leaves it: reading it raises "Tensor holds no memory"
    released.fw_storage = paddle.to_tensor([1.0, 2.0])
    released.bw_storage = paddle.to_tensor([0.5, float("nan")])
    guard = NanGuard("stop", 0, world_size=1)
    guard.on_step_begin(None, None, None)
    guard.add_loss(paddle.to_tensor(1.0))
    with pytest.raises(NonFiniteLossError, match="non-finite gradients"):
        guard.verdict([released], 1, str(tmp_path))
    guard.check_weights([released], 1, str(tmp_path))  # finite slice: saved
    released.fw_storage = paddle.to_tensor([float("inf"), 2.0])
    with pytest.raises(NonFiniteLossError, match="non-finite weights"):
        guard.check_weights([released], 1, str(tmp_path))


def _gpu_grad_scaler(master_grad: bool):
    """paddle's GradScaler as paddlenlp builds it for fp16 (``init_loss_scaling`` = scale_loss 1024), enabled as
    on a GPU: paddle disables it on CPU (it checks the tracer's place only in its constructor), so the
    constructor sees a GPU place; with ``master_grad``, wrapped as paddlenlp does under amp_master_grad
    (``MixPrecisionScaler``: its own ``_unscale`` over ``main_grad``, an int ``_found_inf``)."""
    from unittest import mock

    from paddle.amp import grad_scaler
    from paddle.distributed.fleet.utils import mix_precision_utils

    gpu = SimpleNamespace(_expected_place=SimpleNamespace(is_gpu_place=lambda: True))
    with mock.patch.object(grad_scaler, "_dygraph_tracer", lambda: gpu):
        scaler = paddle.amp.GradScaler(init_loss_scaling=1024)
    if master_grad:
        mix_precision_utils.MixPrecisionScaler(scaler)  # patches scaler in place, as paddlenlp calls it
    return scaler


@pytest.mark.parametrize("master_grad", [False, True], ids=["GradScaler", "MixPrecisionScaler"])
def test_under_fp16_a_step_the_guard_skips_stays_skipped(tmp_path, monkeypatch, master_grad):
    """paddlenlp 3.0.0b4's fp16 step (trainer.py, _inner_training_loop, do_grad_scaling): on_optimizer_begin,
    ``scaler.step(optimizer)``, ``scaler.update()``, the schedule stepped only if the optimizer ran
    (``not scaler._cache_found_inf``), clear_grad, on_optimizer_end. The scaler's step set the optimizer's
    found_inf to its own overflow check, so a spike the guard skipped (finite gradients) was applied. fp16
    cannot run on CPU: the loop's calls are made here, in its order, on paddle's real scaler and AdamW."""
    args = SimpleNamespace(
        loss_spike_policy="skip", spike_factor=10.0, spike_warmup_steps=2, max_skipped_steps=5, output_dir=str(tmp_path)
    )
    guard = NanGuard("stop", 0, world_size=1, check_gradients=False, spikes=SpikeWatch(args, BATCH))
    model = paddle.nn.Linear(4, 1)
    schedule = paddle.optimizer.lr.LinearWarmup(1e-2, warmup_steps=4, start_lr=1e-3, end_lr=1e-2)
    optimizer = paddle.optimizer.AdamW(learning_rate=schedule, parameters=model.parameters())
    scaler = _gpu_grad_scaler(master_grad)
    monkeypatch.setattr(fleet, "get_hybrid_communicate_group", lambda: None)  # one process: MixPrecisionScaler's case
    no_state = (None, None, None)

    def step(loss_seen_by_the_guard: float) -> bool:
        guard.on_step_begin(*no_state)
        with paddle.amp.auto_cast(dtype="float16"):  # fp16's amp state (no effect on CPU): else scale() disables it
            scaled = scaler.scale(model(paddle.ones([BATCH, 4])).mean())
        scaled.backward()
        if master_grad:
            for p in model.parameters():
                p.main_grad = p.grad.astype("float32")
        guard.add_loss(paddle.to_tensor(loss_seen_by_the_guard))
        guard.verdict(model.parameters(), 1, str(tmp_path))
        guard.on_optimizer_begin(*no_state, optimizer=optimizer, scaler=scaler)
        scaler.step(optimizer)
        scaler.update()
        ran = not scaler._cache_found_inf
        if ran:
            schedule.step()
        optimizer.clear_grad()
        guard.on_optimizer_end(*no_state, lr_scheduler=schedule, scaler=scaler)
        return ran

    weights, lr = model.weight.numpy().copy(), schedule.last_epoch
    assert not step(float("nan"))  # a non-finite loss: skipped by loss_spike_policy skip
    np.testing.assert_array_equal(model.weight.numpy(), weights)
    assert schedule.last_epoch == lr and guard.spikes.state.skipped_steps == [1]
    assert float(scaler._scale) == 1024 and (scaler._incr_count, scaler._decr_count) == (0, 0)  # not an overflow
    assert step(1.0)  # the next, healthy step is applied: the scaler is its own again
    assert not np.array_equal(model.weight.numpy(), weights) and schedule.last_epoch == lr + 1
    assert "_unscale" not in vars(scaler) or master_grad  # MixPrecisionScaler's own replacement stays
