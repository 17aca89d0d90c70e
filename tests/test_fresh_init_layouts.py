"""From scratch under tensor parallelism: every split matrix is drawn per tensor-parallel rank, from the
distribution one process draws it from, and every replicated one is the same on each rank.

The golden layout tests (``parallel_golden``) start every layout from the same imported weights, so they
cannot see how a layout initialises. Here each family's debug model is built from scratch by run_pretrain.py
in one process and in TP2 (one optimizer step, per-rank files), and the TP2 ranks' matrices are compared with
each other and with the 1-process run's.
"""

import json
import os

import numpy as np
import paddle
import pytest
from conftest import fixture_folder
from parallel_golden import family_config, launch

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

# each TP rank's weights (unified_checkpoint false): a matrix of another shape than in one process is split
TP_FILES = ("model_state.tp00.pdparams", "model_state.tp01.pdparams")
# a split matrix of the debug models holds 8k elements or more: its sample std is within about 1% of the
# drawn one, and one optimizer step at the demo's learning rate moves it by less than that
STD_RTOL = 0.05


def _matrices(path: str) -> dict:
    """``{name: float32 array}`` of the 2-D tensors in a paddle state file."""
    return {name: tensor.numpy() for name, tensor in paddle.load(path).items() if len(tensor.shape) == 2}


def _debug_model(family: str) -> str:
    with open(family_config(family), encoding="utf-8") as f:
        return json.load(f)["model_name_or_path"]


FRESH_FAMILIES = ("deepseek_v2", "llama", "qwen3", "qwen3_moe", "ernie4_5", "qwen")


@pytest.fixture(scope="module")
def fresh_run(request, tmp_path_factory, demo_dir):
    """family -> (1-process matrices, [rank 0's, rank 1's] matrices) of a from-scratch step in 1 process and TP2,
    run once per family."""
    root = fixture_folder(request, tmp_path_factory, "fresh")
    fresh = ("--continue_training", "false", "--max_steps", "1", "--unified_checkpoint", "false")
    runs = {}

    def run(family: str) -> tuple:
        if family not in runs:
            name = _debug_model(family)
            single = launch(root, f"{family}_1", name, family, 2, "1 process", *fresh)
            tp2 = launch(root, f"{family}_tp2", name, family, 2, "TP2", *fresh)
            runs[family] = (
                _matrices(os.path.join(single, "model_state.pdparams")),
                [_matrices(os.path.join(tp2, file)) for file in TP_FILES],
            )
        return runs[family]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("family", FRESH_FAMILIES)
def test_tensor_parallel_ranks_draw_distinct_slices_from_the_single_process_distribution(fresh_run, family):
    """Before the fix (DeepSeek-V2's redraw, ``pretrain.compat.weight_init``, drew every matrix from the global
    generator, which paddlenlp seeds alike on every tensor-parallel rank): 12 of the 14 split matrices of this
    2-layer model were identical on tp00 and tp01 (all but the embedding and LM head: q_proj, kv_b_proj, o_proj
    and the MLPs of both layers; 67 of 69 at the demo's 4 layers), and the model trained at half its width.
    LLaMA, drawn by paddlenlp's own initialiser, is the control; Qwen3's layers (pretrain.models.qwen3) are drawn
    by paddlenlp's Qwen2 initialiser, its q/k head norms replicated; Qwen3-MoE's (pretrain.models.qwen3_moe) by
    paddlenlp's Qwen2-MoE initialiser, its experts split like a dense MLP and its routers replicated. ERNIE-4.5's
    (pretrain.models.ernie4_5) by paddlenlp's Qwen2 initialiser too. QWen v1's paddlenlp initialiser drew only
    the split matrices from normal(0, 0.02) (one process kept paddle's Xavier default: c_attn std 0.044), and its
    c_proj slices alike on both ranks (``pretrain.compat.weight_init``)."""
    single, (rank0, rank1) = fresh_run(family)
    assert rank0.keys() == rank1.keys() == single.keys()
    split = [name for name in single if rank0[name].shape != single[name].shape]
    replicated = [name for name in single if rank0[name].shape == single[name].shape]
    assert len(split) >= 4 * 2, split  # q, k/v, o and MLP projections of 2 layers at least
    identical = [name for name in split if np.array_equal(rank0[name], rank1[name])]
    assert identical == [], f"{len(identical)} of {len(split)} split matrices identical on both ranks: {identical}"
    for name in split:
        want = single[name].std()
        for rank in (rank0, rank1):
            assert rank[name].std() == pytest.approx(want, rel=STD_RTOL), name
    for name in replicated:
        np.testing.assert_array_equal(rank0[name], rank1[name], err_msg=name)
