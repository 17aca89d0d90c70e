"""Whether paddlenlp can run a Workload at all, and whether the planner models it.

The rules are paddle's and paddlenlp's own checks (``pretrain.layout_rules``, shared with
preflight); the planner also refuses what paddlenlp runs but it does not model: key/value heads or
a vocabulary replicated on every tensor-parallel rank.
"""

from __future__ import annotations

from pretrain import layout_rules
from pretrain.precision import Precision


def problems(workload) -> list:
    """Sentences naming each reason the workload cannot run or be estimated; empty when it can."""
    precision = Precision(workload.precision, workload.amp_level, workload.amp_master_grad)
    flags = layout_rules.RunFlags.of(
        workload.seq_length, precision, workload.use_flash_attention, workload.fuse_attention_qkv
    )
    found = layout_rules.problems(workload.model_config, workload.layout, flags)
    if workload.expert_parallel:
        found += layout_rules.expert_parallel_problems(workload.model_config, workload.layout)
    found += [
        f"{line} (not modeled by the planner)"
        for line in layout_rules.replications(workload.model_config, workload.layout)
    ]
    return found
