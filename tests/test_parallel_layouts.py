"""Tensor, sequence and pipeline parallelism on CPU processes (``pretrain.cpu_comm``) equal one process.

Each layout runs through run_pretrain.py from the same initial weights and batches as its 1-process
reference (``parallel_golden``); the per-step losses must agree within 1e-6 relative (float32: only
the summation order differs, measured at most 1.1e-7), and the final weights, merged to the
single-model names, element by element within 1e-6 of each tensor's scale (max |w| of the 1-process
tensor; ``parallel_golden.assert_golden_weights``, with AdamW's epsilon at 1e-3: ``ADAM_EPSILON``).
One launch per layout feeds every check of it.
"""

import json
import os
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from conftest import REPO, fixture_folder
from parallel_golden import (
    assert_golden_weights,
    assert_same_run,
    communication_mismatches,
    final_weights,
    initial_weights,
    launch,
    losses,
    planned_communication,
    relative_differences,
    resume,
)

from pretrain.metrics.comm_volume import read_volume
from pretrain.model import mark_shared_weights

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

LOSS_RTOL = 1e-6


@pytest.fixture(scope="module")
def llama_runs(request, tmp_path_factory, demo_dir):
    """{layout: output_dir} of llama (2 layers; 6 for the virtual pipeline) in every layout; "init" and
    "init6": the 2- and 6-layer initial weights."""
    root = fixture_folder(request, tmp_path_factory, "layouts")
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
    worst = assert_golden_weights(layout, final_weights(llama_runs[reference]), final_weights(llama_runs[layout]))
    print(f"{layout}: loss {max(relative_differences(single, parallel)):.2e}; weights, worst: {worst}")


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


# Every family in TP2 and PP2 (llama's separate projections are in llama_runs; fused QKV and FFN here).
# GPT-3 in TP2 needs pretrain.compat.gpt (paddlenlp 3.0.0b4's mapping lacks the tied lm_head.weight:
# without it the merged initial weights do not load).
FAMILIES = ("llama+fused", "qwen", "qwen2", "baichuan", "mistral", "gpt3")
FAMILY_LAYOUTS = ("TP2", "PP2")
RESUMED = "gpt3"  # its TP2 run also saves checkpoint-2 (test_a_gpt3_tp2_checkpoint_resumes_exactly)
SAVE_AT_2 = ("--save_steps", "2")
FUSED = ("--fuse_attention_qkv", "true", "--fuse_attention_ffn", "true")


@pytest.fixture(scope="module", params=FAMILIES)
def family_runs(request, tmp_path_factory, demo_dir):
    """(family, {layout: output_dir}) of a 2-layer model of the family in 1 process and FAMILY_LAYOUTS;
    "init": the initial weights, "root": the folder."""
    family, _, variant = request.param.partition("+")
    extra = FUSED if variant == "fused" else ()
    root = fixture_folder(request, tmp_path_factory, request.param.replace("+", "_"))
    weights = initial_weights(f"{root}/init", family, 2, *extra)
    runs = {"init": weights, "root": root}
    for layout in ("1 process", *FAMILY_LAYOUTS):
        save = SAVE_AT_2 if (request.param, layout) == (RESUMED, "TP2") else ()
        runs[layout] = launch(root, layout.replace(" ", "_"), weights, family, 2, layout, *extra, *save)
    return request.param, runs


@pytest.mark.slow
def test_every_family_in_tp2_and_pp2_equals_one_process(family_runs):
    family, runs = family_runs
    single = losses(runs["1 process"])
    assert single[-1] < single[0] - 0.05
    for layout in FAMILY_LAYOUTS:
        parallel = losses(runs[layout])
        assert max(relative_differences(single, parallel)) <= LOSS_RTOL, (family, layout, single, parallel)
        reference, other = final_weights(runs["1 process"]), final_weights(runs[layout])
        worst = assert_golden_weights(f"{family} {layout}", reference, other)
        print(f"{family} {layout}: loss {max(relative_differences(single, parallel)):.2e}; weights, worst: {worst}")


@pytest.mark.slow
def test_a_gpt3_tp2_checkpoint_resumes_exactly(family_runs):
    """GPT-3's LM head is its vocabulary-parallel embedding: TP2's unified checkpoint holds it merged, equal
    to the embedding, and TP2 resumed from it ends as the uninterrupted run, bit for bit. Without
    ``pretrain.compat.gpt`` (measured, from scratch): rank 0's [4032, 256] half saved as lm_head.weight, and
    the resumed run's step 3 loss 8.826 against 8.517."""
    family, runs = family_runs
    if family != RESUMED:
        pytest.skip("GPT-3's tied head (the other families' TP2 resume: test_layout_features.py)")
    checkpoint = final_weights(os.path.join(runs["TP2"], "checkpoint-2"))
    np.testing.assert_array_equal(checkpoint["lm_head.weight"], checkpoint["gpt.embeddings.word_embeddings.weight"])
    out = resume(runs["root"], "TP2_resumed", runs["TP2"], runs["init"], family, 2, "TP2", *SAVE_AT_2)
    assert_same_run(out, runs["TP2"])


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


@pytest.mark.slow
@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3", "qwen2_moe", "qwen3_moe", "mixtral", "ernie4_5_moe"])
def test_every_moe_family_in_tp2_equals_one_process(family, tmp_path, demo_dir):
    """The mixture-of-experts families under TP2 (attention and dense MLPs split; routed experts whole on every
    rank). Before ``pretrain.compat.deepseek_attention`` DeepSeek's shared rotary key's gradient was the sum over
    each rank's heads only: the ranks' replicated ``kv_a_proj_with_mqa`` drifted apart and the DeepSeek-V2 run
    left one process's (2.7e-5 relative at step 2)."""
    root = str(tmp_path)
    weights = initial_weights(f"{root}/init", family, 2)
    single = launch(root, "single", weights, family, 2, "1 process")
    tp2 = launch(root, "tp2", weights, family, 2, "TP2")
    assert max(relative_differences(losses(single), losses(tp2))) <= LOSS_RTOL, (losses(single), losses(tp2))
    print(f"{family} TP2: weights, worst: {assert_golden_weights(family, final_weights(single), final_weights(tp2))}")


@pytest.mark.slow
def test_deepseek_v3_under_sharding_stage2_equals_one_process_and_resumes_exactly(tmp_path, demo_dir):
    """DeepSeek-V3's routing bias gets no gradient (it selects experts, an index), so paddle's stage2 never reduced
    the gradient bucket holding it (``pretrain.compat.moe`` fix 7): before, its owner stepped on its own half-batch
    gradients of 47 of the 53 tensors, and a resume failed at its first step (``Optimizer set error,
    linear_0.w_0_moment1_0 should in state dict``)."""
    root = str(tmp_path)
    weights = initial_weights(f"{root}/init", "deepseek_v3", 2)
    single = launch(root, "single", weights, "deepseek_v3", 2, "1 process", "--moe_bias_update_rate", "0")
    sharded = launch(root, "sh2", weights, "deepseek_v3", 2, "SH2 stage2", "--moe_bias_update_rate", "0", *SAVE_AT_2)
    assert max(relative_differences(losses(single), losses(sharded))) <= LOSS_RTOL, (losses(single), losses(sharded))
    worst = assert_golden_weights("deepseek_v3 SH2 stage2", final_weights(single), final_weights(sharded))
    print(f"deepseek_v3 SH2 stage2: weights, worst: {worst}")
    resumed = resume(
        root, "sh2_resumed", sharded, weights, "deepseek_v3", 2, "SH2 stage2", "--moe_bias_update_rate", "0", *SAVE_AT_2
    )
    assert_same_run(resumed, sharded)


# Qwen3's layouts: separate projections in TP2, TP2 + sequence parallel and TP2 x sharding stage2 (the
# recipe's), then recompute at each granularity in one process; the fused QKV projection (its q and k norms
# applied to the fused output) and FFN in TP2.
QWEN3_LAYOUTS = {"": ("TP2", "TP2+SP", "TP2xSH2 stage2"), "fused": ("TP2",)}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(QWEN3_LAYOUTS))
def test_qwen3_layouts_equal_one_process(variant, tmp_path, demo_dir):
    """Qwen3's per-head q/k norms (pretrain.models.qwen3) are replicated on the tensor-parallel ranks but each
    rank normalizes its own heads, so each rank's gradient of them is partial until summed over the group
    (``Qwen3HeadRMSNorm``'s ``_c_identity``); under sequence parallelism the projections' output is the whole
    sequence. paddlenlp has no Qwen3 pipeline class: PP is refused (test_layout_rules.py). Without the sum
    (measured, 4 steps): the losses still agree within 1e-6, but TP2's saved (rank 0's) q_norm and k_norm
    weights left one process's by up to 9.0e-4 of their scale (layer 0; 5.5e-4 layer 1's k_norm)."""
    root, extra = str(tmp_path), FUSED if variant == "fused" else ()
    weights = initial_weights(f"{root}/init", "qwen3", 2, *extra)
    single = launch(root, "single", weights, "qwen3", 2, "1 process", *extra)
    assert losses(single)[-1] < losses(single)[0] - 0.05
    for layout in QWEN3_LAYOUTS[variant]:
        parallel = launch(root, layout.replace("+", "_").replace(" ", "_"), weights, "qwen3", 2, layout, *extra)
        assert max(relative_differences(losses(single), losses(parallel))) <= LOSS_RTOL, (
            layout,
            losses(single),
            losses(parallel),
        )
        worst = assert_golden_weights(layout, final_weights(single), final_weights(parallel))
        print(f"qwen3 {variant} {layout}: weights, worst: {worst}")
    if variant:
        return
    for granularity in ("full", "full_attn", "core_attn"):  # the forward hooks of the norms run again in backward
        args = ("--recompute", "true", "--recompute_granularity", granularity)
        recomputed = launch(root, granularity, weights, "qwen3", 2, "1 process", *args)
        assert max(relative_differences(losses(single), losses(recomputed))) <= LOSS_RTOL, granularity
        assert_golden_weights(granularity, final_weights(single), final_weights(recomputed))


@pytest.mark.slow
def test_ernie4_5_in_tp2_and_tp2_sp_equals_one_process(tmp_path, demo_dir):
    """ERNIE-4.5's q and k heads are reordered (evens, then odds: ``pretrain.models.ernie4_5.pairs_to_halves``)
    on each tensor-parallel rank's own heads, by a hook on the projection's output, which under sequence
    parallelism is the whole sequence; paddlenlp has no ERNIE pipeline class: PP is refused
    (test_layout_rules.py)."""
    root = str(tmp_path)
    weights = initial_weights(f"{root}/init", "ernie4_5", 2)
    single = launch(root, "single", weights, "ernie4_5", 2, "1 process")
    assert losses(single)[-1] < losses(single)[0] - 0.05
    for layout in ("TP2", "TP2+SP"):
        parallel = launch(root, layout.replace("+", "_"), weights, "ernie4_5", 2, layout)
        assert max(relative_differences(losses(single), losses(parallel))) <= LOSS_RTOL, (
            layout,
            losses(single),
            losses(parallel),
        )
        worst = assert_golden_weights(layout, final_weights(single), final_weights(parallel))
        print(
            f"ernie4_5 {layout}: loss {max(relative_differences(losses(single), losses(parallel))):.2e}; "
            f"weights, worst: {worst}"
        )
