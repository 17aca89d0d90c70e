"""Tensor, sequence and pipeline parallelism on CPU processes (``pretrain.cpu_comm``) equal one process.

Each layout runs through run_pretrain.py from the same initial weights and batches as its 1-process
reference (``parallel_golden``); the per-step losses must agree within 1e-6 relative (float32: only
the summation order differs, measured at most 1.1e-7). The final weights, merged to the single-model
names, are compared tensor by tensor against each tensor's scale (see WEIGHT_TOLERANCE).
One launch per layout feeds every check of it.
"""

import json
import os
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from conftest import REPO
from parallel_golden import (
    communication_mismatches,
    final_weights,
    initial_weights,
    launch,
    losses,
    planned_communication,
    relative_differences,
    weight_differences,
)

from pretrain.metrics.comm_volume import read_volume
from pretrain.model import mark_shared_weights

LOSS_RTOL = 1e-6
# The final weights (4 AdamW steps, merged to the single-model names) are compared element by element
# against each tensor's scale (max |w|): 99% of the elements within 1e-5. Measured: pipeline layouts
# 4e-8 at 99% (1e-6 in 99.99%); tensor parallelism, whose row-parallel all-reduce splits each sum in
# two, 3e-7 to 2e-6 at 99%. The largest single-element differences are not bounded here: AdamW moves
# an element by about lr x gradient / (|gradient| + eps) a step, so an element whose gradient is within
# float32 rounding of zero can move the other way, by up to 2 x lr (measured up to 4.9e-2 of the scale
# in one embedding row of QWen TP2, 2.8e-3 for llama TP2; two 1-process runs that differ only in
# summation order differ by 4.6e-6 this way). The losses, which every weight feeds, stay within 1e-7.
# A wrong layout moves the bulk: training moves these weights by ~0.1 of their scale in 4 steps.
WEIGHT_BULK, WEIGHT_BULK_TOLERANCE = 0.99, 1e-5


@pytest.fixture(scope="module")
def llama_runs(tmp_path_factory, demo_dir):
    """{layout: output_dir} of llama (2 layers; 6 for the virtual pipeline) in every layout; "init" and
    "init6": the 2- and 6-layer initial weights."""
    root = str(tmp_path_factory.mktemp("layouts"))
    two, six = (initial_weights(f"{root}/init{n}", "llama", n) for n in (2, 6))
    runs = {"init": two, "init6": six}
    for layout in ("1 process", "TP2", "TP2+SP", "PP2", "TP2xPP2", "TP2xSH2 stage1", "TP2xSH2 stage2"):
        runs[layout] = launch(root, layout.replace("+", "_").replace(" ", "_"), two, "llama", 2, layout)
    for layout in ("1 process, 6 samples", "PP3xVPP2"):
        runs[layout] = launch(root, layout.replace(" ", "_").replace(",", ""), six, "llama", 6, layout)
    return runs


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout, reference",
    [
        *[(layout, "1 process") for layout in ("TP2", "TP2+SP", "PP2", "TP2xPP2", "TP2xSH2 stage1", "TP2xSH2 stage2")],
        ("PP3xVPP2", "1 process, 6 samples"),
    ],
)
def test_llama_layout_equals_one_process(llama_runs, layout, reference):
    single, parallel = losses(llama_runs[reference]), losses(llama_runs[layout])
    assert single[-1] < single[0] - 0.05  # the curve moves, so matching it means something
    assert max(relative_differences(single, parallel)) <= LOSS_RTOL, (single, parallel)
    differences = weight_differences(final_weights(llama_runs[reference]), final_weights(llama_runs[layout]))
    print(
        f"{layout}: loss {max(relative_differences(single, parallel)):.2e}, weights {differences.max():.2e} max, "
        f"{np.quantile(differences, WEIGHT_BULK):.2e} at {WEIGHT_BULK:.1%}"
    )
    assert np.quantile(differences, WEIGHT_BULK) <= WEIGHT_BULK_TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["TP2", "TP2+SP", "PP2", "TP2xPP2", "TP2xSH2 stage1", "TP2xSH2 stage2", "PP3xVPP2"])
def test_the_planner_communication_is_what_each_rank_counted(llama_runs, layout):
    """``pretrain.planner``'s payload bytes per step per group (TP all-reduces, SP all-gathers and reduce-scatters,
    pipeline sends and receives, sharding reduces and broadcasts) equal, to the byte, what every rank's gloo
    collectives moved in the last step (``pretrain.metrics.comm_volume``), up to scalars it does not model (at
    most 1% of a group's bytes); and each pipeline rank holds the parameters the planner puts on its stage."""
    output_dir, (layers, weights) = llama_runs[layout], (6, "init6") if layout == "PP3xVPP2" else (2, "init")
    folder, name = os.path.split(output_dir)
    planned, numel = planned_communication(folder, name, llama_runs[weights], "llama", layers, layout)
    assert not communication_mismatches(output_dir, planned, numel)


@pytest.mark.slow
def test_the_time_breakdown_counts_tensor_parallel_collectives_as_communication(llama_runs):
    """Under TP2 the collectives inside forward and backward are timed (pretrain.metrics.comm_volume) and
    moved into the communication phase: at least half of the seconds rank 0 spent in them during the steps
    (the rest: the log records' collectives, outside the step phases). One process has no collectives."""
    with open(os.path.join(llama_runs["TP2"], "run_summary.json")) as f:
        communication = json.load(f)["time_breakdown"]["communication"]
    in_collectives = sum(step["seconds"] for step in read_volume(llama_runs["TP2"], 0)["steps"])
    assert 0.5 * in_collectives <= communication, (communication, in_collectives)
    with open(os.path.join(llama_runs["1 process"], "run_summary.json")) as f:
        assert json.load(f)["time_breakdown"]["communication"] < 0.1 * communication


@pytest.mark.slow
def test_a_wrong_reduce_scatter_fails_the_comparison(llama_runs, tmp_path):
    """The comparison has teeth: sequence parallelism with each rank given the next rank's chunk of the
    reduce-scatter (tests/wrong_reduce_scatter_run.py) no longer equals one process."""
    script = os.path.join(REPO, "tests", "wrong_reduce_scatter_run.py")
    wrong = launch(str(tmp_path), "wrong", llama_runs["init"], "llama", 2, "TP2+SP", script=script)
    assert max(relative_differences(losses(llama_runs["1 process"]), losses(wrong))) > 1e-3


# Every family in TP2 and PP2 (llama's separate projections are in llama_runs; fused QKV and FFN here),
# except GPT-3 in TP2: paddlenlp 3.0.0b4's GPT tensor-parallel mapping has no action for ``lm_head.weight``
# (tied to the vocabulary-parallel embedding), so merged weights, the comparison's start, do not load
# ("receives a shape [8064, 256], but the expected shape is [4032, 256]").
FAMILY_LAYOUTS = {
    **{family: ("TP2", "PP2") for family in ("llama+fused", "qwen", "qwen2", "baichuan", "mistral")},
    "gpt3": ("PP2",),
}
FAMILIES = tuple(FAMILY_LAYOUTS)
FUSED = ("--fuse_attention_qkv", "true", "--fuse_attention_ffn", "true")


@pytest.fixture(scope="module", params=FAMILIES)
def family_runs(request, tmp_path_factory, demo_dir):
    """(family, {layout: output_dir}) of a 2-layer model of the family in 1 process and its FAMILY_LAYOUTS."""
    family, _, variant = request.param.partition("+")
    extra = FUSED if variant == "fused" else ()
    root = str(tmp_path_factory.mktemp(request.param.replace("+", "_")))
    weights = initial_weights(f"{root}/init", family, 2, *extra)
    return request.param, {
        layout: launch(root, layout.replace(" ", "_"), weights, family, 2, layout, *extra)
        for layout in ("1 process", *FAMILY_LAYOUTS[request.param])
    }


@pytest.mark.slow
def test_every_family_in_tp2_and_pp2_equals_one_process(family_runs):
    family, runs = family_runs
    single = losses(runs["1 process"])
    assert single[-1] < single[0] - 0.05
    for layout in FAMILY_LAYOUTS[family]:
        parallel = losses(runs[layout])
        assert max(relative_differences(single, parallel)) <= LOSS_RTOL, (family, layout, single, parallel)
        differences = weight_differences(final_weights(runs["1 process"]), final_weights(runs[layout]))
        print(
            f"{family} {layout}: loss {max(relative_differences(single, parallel)):.2e}, weights "
            f"{differences.max():.2e} max, {np.quantile(differences, WEIGHT_BULK):.2e} at {WEIGHT_BULK:.1%}"
        )
        assert np.quantile(differences, WEIGHT_BULK) <= WEIGHT_BULK_TOLERANCE, (family, layout)


def test_the_first_stage_copy_of_a_shared_weight_alone_counts_in_the_gradient_norm():
    """paddle's PipelineLayer leaves both copies of a tied embedding unmarked (counted twice in the clipped
    norm: a Qwen2 PP2 run left the 1-process curve); ``mark_shared_weights`` marks them by attribute."""
    first, other = paddle.create_parameter([2], "float32"), paddle.create_parameter([2], "float32")
    rank = paddle.distributed.get_rank()  # 0 in this process

    def shared(ranks, weight):
        return {"ranks": ranks, "weight_attr": ["embedding_weight"], "layer": SimpleNamespace(embedding_weight=weight)}

    comms = {"first here": shared([rank, rank + 1], first), "first elsewhere": shared([rank - 1, rank], other)}
    model = SimpleNamespace(shared_comm=comms)
    mark_shared_weights(model)
    assert first.is_firstly_shared and not other.is_firstly_shared
