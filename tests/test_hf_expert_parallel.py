"""A transformers mixture of experts continued under expert parallelism: each rank imports its own experts.

paddlenlp's ``MoELayer`` (Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3) builds on each data-parallel rank only its
share of the experts (``transformers/moe_layer.py:185``), so a rank's model has no place for the others'
tensors, which the import reads past (``pretrain.hf_import.other_ranks_experts``). Qwen2-MoE continued from a
transformers folder on 2 ranks with ``use_expert_parallel`` (the EP2 layout of tests/parallel_golden.py)
equals one process continued from it; Qwen3-MoE (a dense layer among its MoE layers), DeepSeek-V2 and V3
give each rank exactly its experts' tensors, equal to what one process imports under the same names.
Mixtral's block is no ``MoELayer``: preflight refuses expert parallelism for it in one line that names why
and the layout that works.

Today's main: the EP2 run stops on both ranks, rank 0 with "continue_training: tensor model.layers.0.mlp.
experts.2.down_proj.weight of .../hf/model.safetensors has no place in Qwen2MoeForCausalLM" (rank 1's
expert), rank 1 with the same line of experts.0; the import on a stand-in rank 0 raises the same line
(Qwen3-MoE: the same, DeepSeek-V2: experts.2 of layer 1, V3: experts.4). The Mixtral refusal is today's too."""

import json
import os
from contextlib import contextmanager
from types import SimpleNamespace
from unittest import mock

import numpy as np
import paddle
import pytest
from conftest import REPO, resolve_plan
from parallel_golden import assert_golden_weights, final_weights, launch, losses, relative_differences
from test_hf_interop import hf_source
from test_parallel_layouts import LOSS_RTOL

from pretrain.hf_import import hf_implementation, load_hf_config, load_hf_weights
from pretrain.layout import simulated_launch
from pretrain.preflight import check_expert_parallel

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

MIXTRAL = os.path.join(REPO, "config", "mixtral", "pretrain_demo_cpu.json")


@contextmanager
def expert_parallel_rank(rank: int, ranks: int):
    """paddlenlp's ``MoELayer`` built in this process as on data-parallel rank ``rank`` of ``ranks`` with fleet's
    groups (``moe_layer.py:157-170`` asks fleet's data-parallel group for its rank and size): it builds that
    rank's experts only. Nothing communicates."""
    group = SimpleNamespace(rank=rank, world_size=ranks, nranks=ranks)
    hcg = SimpleNamespace(get_data_parallel_group=lambda: group)
    with (
        mock.patch.object(paddle.distributed.fleet, "get_hybrid_communicate_group", return_value=hcg),
        mock.patch.object(paddle.distributed, "get_world_size", lambda group=None: ranks),
        mock.patch.object(paddle.distributed, "get_rank", lambda group=None: rank),
    ):
        yield


def imported_weights(folder: str) -> dict:
    """``{paddlenlp name: array}`` of the model this process builds for the transformers folder ``folder`` and
    imports into (``load_hf_weights``)."""
    impl = hf_implementation(folder)
    config = load_hf_config(folder, impl)
    model = impl.model_class.from_config(config, dtype="float32")
    load_hf_weights(model, folder, config, impl)
    return {name: value.numpy() for name, value in model.state_dict().items()}


@pytest.mark.parametrize(
    "family, experts",
    [("qwen2_moe", 4), ("qwen3_moe", 4), ("deepseek_v2", 4), ("deepseek_v3", 8), ("ernie4_5_moe", 4)],
)
def test_each_expert_parallel_rank_imports_its_own_experts(family, experts, tmp_path):
    """On each of 2 stand-in ranks the import fills exactly the tensors the rank's model holds: its half of each
    MoE layer's experts (rank 1: the second half), every tensor equal to one process's import of it."""
    folder = str(tmp_path / "hf")
    hf_source(family, folder)
    whole = imported_weights(folder)
    for rank in range(2):
        with expert_parallel_rank(rank, 2):
            part = imported_weights(folder)
        indices = {int(name.split(".experts.")[1].split(".")[0]) for name in part if ".experts." in name}
        assert indices == set(range(rank * experts // 2, (rank + 1) * experts // 2)), (rank, indices)
        assert set(part) < set(whole)
        for name, array in part.items():
            np.testing.assert_array_equal(array, whole[name], err_msg=name)


def test_mixtral_expert_parallel_is_refused_before_the_import(tmp_path):
    """paddlenlp's MixtralSparseMoeBlock builds every expert on every rank and has no all-to-all: one line names
    it and the layout that works (use_expert_parallel false: its experts replicated over data parallelism)."""
    folder = str(tmp_path / "hf")
    hf_source("mixtral", folder)

    def problems(expert_parallel: str) -> list:
        arguments = ("--model_name_or_path", folder, "--continue_training", "true", "--unified_checkpoint", "true")
        with simulated_launch(1, 2):
            plan = resolve_plan([MIXTRAL, *arguments, "--use_expert_parallel", expert_parallel])
        return check_expert_parallel(plan)

    assert problems("true") == [
        "use_expert_parallel: paddlenlp 3.0.0b4's MixtralSparseMoeBlock (transformers/mixtral/modeling.py:490) is "
        "not its MoELayer: it builds every expert on every rank (line 498) and has no all-to-all; set it false"
    ]
    assert problems("false") == []


@pytest.mark.slow
def test_a_transformers_qwen2_moe_continues_expert_parallel_as_one_process(tmp_path, demo_dir):
    """EP2 from a transformers Qwen2-MoE (4 experts, top-2, a gated shared expert) against one process from the
    same folder, 4 steps: losses within LOSS_RTOL, every final weight within the golden tolerance, the experts
    merged from both ranks. The load-balancing coefficient is 0 (as in tests/test_expert_parallel.py): with
    it each rank computes that loss on its own tokens by design (docs/models.md, "Expert parallelism")."""
    folder = tmp_path / "hf"
    hf_source("qwen2_moe", str(folder))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "router_aux_loss_coef": 0.0}))
    single, spread = (launch(str(tmp_path), name, str(folder), "qwen2_moe", 2, name) for name in ("1 process", "EP2"))
    expected, got = losses(single), losses(spread)
    assert expected[-1] < expected[0]  # it trains
    assert max(relative_differences(expected, got)) <= LOSS_RTOL, (expected, got)
    reference, weights = final_weights(single), final_weights(spread)
    assert len([name for name in weights if ".mlp.experts." in name]) == 2 * 4 * 3  # merged from both ranks
    worst = assert_golden_weights("EP2", reference, weights)
    print(f"transformers Qwen2-MoE EP2: losses {got}, {max(relative_differences(expected, got)):.1e}; {worst}")
