"""The run's precision, derived once: dtype, label, and what the planner and the layout rules read."""

from types import SimpleNamespace

import pytest

from pretrain.precision import Precision


def _args(bf16=False, fp16=False, level="O1", master=False):
    return SimpleNamespace(bf16=bf16, fp16=fp16, fp16_opt_level=level, amp_master_grad=master)


@pytest.mark.parametrize(
    "args, label, dtype, half, master",
    [
        (_args(), "fp32", "float32", False, False),
        (_args(level="O2", master=True), "fp32", "float32", False, False),  # O2 and master grads need AMP
        (_args(fp16=True), "fp16 O1", "float32", True, False),
        (_args(bf16=True, level="O2"), "bf16 O2", "bfloat16", True, False),
        (_args(fp16=True, level="O2", master=True), "fp16 O2", "float16", True, True),
        (_args(bf16=True, fp16=True, level="O2"), "bf16 O2", "bfloat16", True, False),
    ],
)
def test_precision_of_the_arguments(args, label, dtype, half, master):
    precision = Precision.from_arguments(args)
    assert (precision.label, precision.param_dtype, precision.half, precision.amp_master_grad) == (
        label,
        dtype,
        half,
        master,
    )
    assert precision.pure_low_precision == (dtype != "float32")
