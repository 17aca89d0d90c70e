"""The run's VisualDL board (``report_to visualdl``): the scalars worth a chart, the key settings on
the hyper-parameters tab, the non-default settings as text.

Scalars (tag <- log key), one throughput family (ours: over the training steps only, see
``pretrain.metrics.step_timer``; paddlenlp's ``interval_*`` rates, which count evaluation time, are not written):

    train/loss, train/learning_rate, train/tokens_per_card_per_sec, train/mfu (train/mfu_nominal),
    train/peak_memory_gib (GPU: also train/peak_memory_reserved_gib), validation/loss

A mixture of experts adds train/lm_loss, train/aux_loss, train/router_z_loss, train/expert_imbalance
(DeepSeek-V3: train/routing_bias_spread) and, per MoE layer, the family train/expert_share_layer<i> (i: its
model layer; one line per expert: its fraction of the tokens; see ``pretrain.routing``).

The time breakdown of each record (``time_<phase>``, seconds per step, see ``pretrain.metrics.time_breakdown``)
is one stacked family, ``train/time_per_step``: VisualDL draws the lines of one ``add_scalars`` tag in
one chart, and each line is its phase plus every phase listed before it (``1 data_wait``,
``2 +forward_backward``, ...), so the bands between the lines are the phases and the top line is the
wall time per step.

VisualDL sorts tag groups by name and opens only the first, so the training group (``train``) must
sort before the evaluation group: evaluation is ``validation/loss``, not paddlenlp's ``eval/loss``.
The final evaluation, which runs after training has ended, is written too (paddlenlp's callback
closes the writer at the end of training and drops it). Open the board with
``visualdl --logdir <output_dir>/runs``; ``tools/visualdl_screenshot.py`` checks and photographs it.
"""

from __future__ import annotations

from dataclasses import dataclass

from paddlenlp.trainer.integrations import VisualDLCallback

# log key -> VisualDL tag; every other key of a log record stays off the board
SCALAR_TAGS = {
    "loss": "train/loss",
    "learning_rate": "train/learning_rate",
    "tokens_per_card_per_sec": "train/tokens_per_card_per_sec",
    "mfu": "train/mfu",
    "mfu_nominal": "train/mfu_nominal",
    "peak_memory_gib": "train/peak_memory_gib",
    "peak_memory_reserved_gib": "train/peak_memory_reserved_gib",
    "eval_loss": "validation/loss",
    # mixture of experts (pretrain.routing): the loss's parts and the routing balance
    "lm_loss": "train/lm_loss",
    "aux_loss": "train/aux_loss",
    "z_loss": "train/router_z_loss",
    "expert_imbalance": "train/expert_imbalance",
    "routing_bias_spread": "train/routing_bias_spread",
}
SHARE_FAMILY = "train/expert_share_layer{}"  # per MoE layer (its model layer), one line per expert: its share
# scalars the hyper-parameters tab shows next to each run's settings (their last value)
HPARAM_METRICS = ["train/loss", "validation/loss", "train/tokens_per_card_per_sec", "train/mfu"]
TIME_FAMILY = "train/time_per_step"  # the stacked breakdown


def stacked_time_lines(logs: dict) -> dict:
    """``{"<n> [+]<phase>": cumulative seconds per step}`` of a record's ``time_<phase>`` keys, in their order."""
    lines, total = {}, 0.0
    phases = [key[len("time_") :] for key in logs if key.startswith("time_")]
    for number, phase in enumerate(phases, start=1):
        total += logs[f"time_{phase}"]
        lines[f"{number} {'+' if number > 1 else ''}{phase}"] = total
    return lines


@dataclass(frozen=True)
class BoardContent:
    """What a run writes to the board besides its scalars (``pretrain.report.board_content`` of a RunPlan)."""

    hparams: dict  # key settings (str, int or float values) for the hyper-parameters tab
    settings: dict  # section -> JSON text of its non-default settings


class VisualDLBoard(VisualDLCallback):
    """paddlenlp's VisualDL callback with this module's tags, hparams and settings (see the module docstring).

    Writes on global rank 0 only, as paddlenlp's does.
    """

    def __init__(self, content: BoardContent):
        super().__init__()
        self.content = content
        self._training_ended = False

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        if self.vdl_writer is None:
            self._init_summary_writer(args)
        for section, text in self.content.settings.items():
            self.vdl_writer.add_text(f"settings/{section}", text, step=state.global_step)
        self.vdl_writer.add_hparams(self.content.hparams, metrics_list=HPARAM_METRICS)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or self.vdl_writer is None or not logs:
            return
        for key, tag in SCALAR_TAGS.items():
            if isinstance(logs.get(key), (int, float)):
                self.vdl_writer.add_scalar(tag, logs[key], state.global_step)
        lines = stacked_time_lines(logs)
        if lines:
            self.vdl_writer.add_scalars(TIME_FAMILY, lines, state.global_step)
        for layer, shares in zip(logs.get("moe_layers", []), logs.get("expert_share", [])):
            experts = {f"expert {e}": share for e, share in enumerate(shares)}
            self.vdl_writer.add_scalars(SHARE_FAMILY.format(layer), experts, state.global_step)
        self.vdl_writer.flush()

    def on_train_end(self, args, state, control, **kwargs):
        """Keep the writer open for the final evaluation, which comes after training (closed in on_evaluate)."""
        self._training_ended = True

    def on_evaluate(self, args, state, control, **kwargs):
        if self._training_ended and self.vdl_writer is not None:
            self.vdl_writer.close()
            self.vdl_writer = None
