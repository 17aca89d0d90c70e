"""The planner: will this model, in this layout, fit on the card, and how fast will it train?

Answers from arithmetic, in milliseconds, for paddlenlp's LLaMA, Qwen, Qwen2, Baichuan, GPT,
Qwen2-MoE and Mixtral models as this package trains them. Modules, one job each:

  workload     -- ``Workload``: one configuration (model, layout, batch, knobs, GPU), from parsed arguments.
  parameters   -- the parameter tensors of each pipeline stage on one card; sharding's partition.
  activations  -- what one decoder layer saves for backward and moves through HBM, per token.
  memory       -- peak memory per stage as named terms (states, activations, buffers, overheads).
  communication -- what each card's collectives and pipeline transfers move per micro-batch and per step.
  throughput   -- seconds per step as named terms (matmuls, attention, elementwise, communication, bubble).
  experts      -- a mixture of experts: expert parallelism's all-to-all and the assumptions, in words.
  constants    -- the one table of efficiencies and overheads, with sources and calibration.
  validity     -- what paddlenlp refuses to run.
  estimate     -- ``estimate(workload) -> Estimate``.
  search       -- ``search(...)``: layouts and knobs for N x K cards, ranked by tokens/card/s.

docs/planner.md has the formulas and the accuracy against published runs.
"""

from pretrain.planner.estimate import Estimate, estimate
from pretrain.planner.workload import Workload

__all__ = ["Estimate", "Workload", "estimate"]
