"""From scratch in one process, every family's weight matrices are drawn as its own code draws them: normal(0,
initializer_range), the residual output projections with initializer_range / sqrt(2 x num_hidden_layers).

paddlenlp's initialisers do so for most families; DeepSeek-V2/V3 and QWen v1 are drawn again
(``pretrain.compat.weight_init``). ``test_fresh_init_layouts`` and the support matrix compare each layout with one
process; this is what makes one process the right reference.
"""

import math
import os

import pytest
from conftest import REPO, resolve_plan

from pretrain.model import build_model
from pretrain.registry import FAMILIES

# the output projections paddlenlp (and QWen's released code) scale by depth; the MoE experts' down_proj too,
# except ERNIE-4.5-MoE's and DeepSeek's (``DeepseekV2MLP``, drawn as transformers draws it)
DEPTH_SCALED = ("o_proj.weight", "down_proj.weight", "out_proj.weight", "linear2.weight", "w2.weight", "c_proj.weight")
# QWen v1's w2 is half of its gated MLP's input projection (c_proj is the output)
NOT_SCALED = {"qwen": ("w2.weight",), "deepseek_v2": DEPTH_SCALED, "deepseek_v3": DEPTH_SCALED}


def _unscaled(family: str, name: str) -> bool:
    if name.endswith(NOT_SCALED.get(family, ())):
        return True
    moe_expert = ".experts." in name or ".shared_experts." in name
    return family == "ernie4_5_moe" and moe_expert


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_one_process_draws_each_matrix_from_the_familys_distribution(family, tmp_path):
    """With QWen v1's paddlenlp initialiser (only tensor-parallel slices drawn), c_attn's std is 0.0442, w1 and
    w2 0.0457, the embedding and head 0.0155 (paddle's Xavier default) where QWen draws 0.02; with DeepSeek's,
    Xavier too."""
    config = os.path.join(REPO, "config", family, "pretrain_demo_cpu.json")
    plan = resolve_plan([config, "--output_dir", str(tmp_path), "--continue_training", "false"])
    model_config = plan.model_config
    depth_std = model_config.initializer_range / math.sqrt(2 * model_config.num_hidden_layers)
    wrong = []
    for name, param in build_model(plan).named_parameters():
        if len(param.shape) != 2:
            continue
        values = param.numpy().astype("float64")
        scaled = name.endswith(DEPTH_SCALED) and not _unscaled(family, name)
        want = depth_std if scaled else model_config.initializer_range
        # the sample std of n normal draws is within 5 / sqrt(2n) of the drawn one (5 sigma)
        if abs(values.std() / want - 1) > 5 / math.sqrt(2 * values.size) or abs(values.mean()) > 5 * want / math.sqrt(
            values.size
        ):
            wrong.append(f"{name}: mean {values.mean():.2g} std {values.std():.4f}, want normal(0, {want:.4f})")
    assert wrong == []
