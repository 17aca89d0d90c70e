"""NaN guard through the real PretrainingTrainer loop: stop with the step number and the last complete
checkpoint, or skip the update (weights and Adam state unchanged) up to max_skipped_nan_steps times.

The model is a 4 -> 1 linear regression on float features so that one chosen batch can carry a NaN
(a LLaMA's token ids cannot); everything else is the application's trainer and paddle's AdamW.
"""

import os

import numpy as np
import paddle
import pytest
from paddlenlp.trainer import TrainerCallback

from pretrain.arguments import PreTrainingArguments
from pretrain.checkpoint import checkpoint_problem
from pretrain.nan_guard import NonFiniteLossError
from pretrain.trainer import PretrainingTrainer

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


def _dataset(num_steps: int) -> list:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(num_steps * BATCH, 4)).astype("float32")
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


def test_skip_stops_after_max_skipped_steps(tmp_path):
    trainer = _trainer(tmp_path, nan_policy="skip", max_skipped_nan_steps=0)
    with pytest.raises(NonFiniteLossError, match=f"at step {BAD_STEP}"):
        trainer.train()
