"""Per-step losses as the Trainer logs them (paddlenlp clears ``state.log_history`` at every log)."""

from paddlenlp.trainer import TrainerCallback


class LossHistory(TrainerCallback):
    """Keeps ``[(global_step, loss)]`` for training (per logging interval) and evaluation."""

    def __init__(self):
        self.train = []
        self.eval = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        if "loss" in logs:
            self.train.append((state.global_step, float(logs["loss"])))
        if "eval_loss" in logs:
            self.eval.append((state.global_step, float(logs["eval_loss"])))
