"""The run's arithmetic, derived once from paddlenlp's ``TrainingArguments`` (``bf16``, ``fp16``,
``fp16_opt_level``, ``amp_master_grad``): the dtype the model is built in, the label the header,
summary and board print, and what the planner and the layout rules assume.

How paddlenlp's Trainer holds each tensor (``paddlenlp/trainer/trainer.py``, ``create_optimizer``
and ``_wrap_model``):

  fp32   parameters, gradients and activations in float32; Adam moments float32.
  O1     (fp16 or bf16) float32 parameters and gradients; matmuls autocast to 16 bit.
  O2     parameters built in 16 bit; the optimizer runs with ``multi_precision`` (float32 master
         weights and moments); gradients in 16 bit, or float32 ``main_grad`` with ``amp_master_grad``.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = {"bf16": "bfloat16", "fp16": "float16"}  # 16-bit AMP dtype -> paddle's dtype name


@dataclass(frozen=True)
class Precision:
    """AMP dtype and level of a run."""

    amp: str  # "fp32", "fp16" or "bf16" (bf16 wins when both flags are set, as in paddlenlp)
    level: str  # fp16_opt_level, "O1" or "O2" (read only under fp16/bf16)
    amp_master_grad: bool  # float32 main gradients asked for under 16-bit AMP

    @classmethod
    def from_arguments(cls, training_args) -> Precision:
        """The precision of parsed ``TrainingArguments``."""
        amp = "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32"
        return cls(amp, training_args.fp16_opt_level, bool(training_args.amp_master_grad) and amp != "fp32")

    @property
    def half(self) -> bool:
        """fp16 or bf16 AMP at any level: activations reach attention in 16 bits."""
        return self.amp != "fp32"

    @property
    def pure_low_precision(self) -> bool:
        """AMP O2: 16-bit parameters, float32 master weights in the optimizer."""
        return self.half and self.level == "O2"

    @property
    def param_dtype(self) -> str:
        """The dtype the model's parameters are built in: float16/bfloat16 under O2, else float32."""
        return DTYPES[self.amp] if self.pure_low_precision else "float32"

    @property
    def label(self) -> str:
        """``"bf16 O2"``, ``"fp16 O1"``, ... or ``"fp32"``."""
        return f"{self.amp} {self.level}" if self.half else "fp32"
