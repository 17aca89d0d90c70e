"""The parallel layout paddlenlp resolves on a simulated 8-card launch matches each published case's name."""

import glob
import os
import re

import pytest
from conftest import REPO

from pretrain.arguments import parse_arguments
from pretrain.layout import ParallelLayout, sharding_stage, simulated_launch

BENCHMARKS = sorted(glob.glob(os.path.join(REPO, "config", "benchmarks", "*SP*.json")))  # FlagPerf's Paddle cases
CASE_NAME = re.compile(r"_TP(\d+)PP(\d+)SH(\d+)SP(\d+)_A100-\d+Gx(\d+)x(\d+)")


@pytest.mark.parametrize("config", BENCHMARKS, ids=os.path.basename)
def test_published_case_resolves_to_its_named_layout(config):
    tp, pp, stage, degree, nnodes, nproc = map(int, CASE_NAME.search(config).groups())
    with simulated_launch(nnodes, nproc):
        _, _, training_args = parse_arguments([config])
        layout = ParallelLayout.from_arguments(training_args, nnodes)
    assert (layout.tensor_parallel_degree, layout.pipeline_parallel_degree) == (tp, pp)
    assert (layout.sharding_stage, layout.sharding_parallel_degree) == (stage, degree)
    assert layout.world_size == nnodes * nproc == tp * pp * degree * layout.data_parallel_degree
    assert layout.name.startswith(f"TP{tp}PP{pp}SH{stage}SP{degree}")


def test_one_process_without_a_launcher_has_world_size_one():
    _, _, training_args = parse_arguments([os.path.join(REPO, "config", "llama", "pretrain_argument.json")])
    layout = ParallelLayout.from_arguments(training_args, nnodes=1)
    assert layout.world_size == 1 and layout.tensor_parallel_degree == 1 and layout.dataset_world_size == 1


def test_sharding_stage_reads_options_and_strings():
    assert sharding_stage("stage2 offload") == 2
    assert sharding_stage("") == 0
    assert sharding_stage([]) == 0


def test_simulated_launch_refuses_zero_cards():
    with pytest.raises(ValueError, match="nproc_per_node"):
        with simulated_launch(1, 0):
            pass
