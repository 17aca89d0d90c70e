"""The support matrix (``pretrain.support_matrix``): every cell has a verdict, refusals are preflight's own lines
with the nearest layout that runs, docs/support-matrix.md shows what ``verdict`` computes now, and the cells the
suite executes (here or in the tests ``COVERED`` names) are executable cells.

The verdicts of every cell take about a minute (20 ms a plan, no process); the launched cells here
(``CI_CELLS``) take about 3 minutes on 2 cores.
"""

import ast
import os
import re

import pytest
from conftest import REPO

from pretrain import support_matrix
from pretrain.support_matrix import (
    FEATURES,
    LAYOUTS,
    MATRIX_LAYOUTS,
    TOGETHER,
    Executable,
    NotApplicable,
    Refused,
    cell_arguments,
    cells,
    families,
    preflight_lines,
    verdict,
)

DOC = os.path.join(REPO, "docs", "support-matrix.md")

# Cells the suite executes in tests of their own: (feature, layout, family) -> "file::test". Each runs the cell's
# feature in that layout for that family and compares it with one process or its own uninterrupted run.
COVERED = {
    **{
        ("continued training", layout, "llama"): "test_parallel_layouts.py::test_llama_layout_equals_one_process"
        for layout in ("TP2", "TP2+SP", "PP2", "TP2xPP2", "TP2xSH2 stage1", "TP2xSH2 stage2", "PP3xVPP2")
    },
    **{
        ("continued training", layout, family): "test_parallel_layouts.py::"
        "test_every_family_in_tp2_and_pp2_equals_one_process"
        for layout in ("TP2", "PP2")
        for family in ("qwen", "qwen2", "baichuan", "mistral", "gpt3")
    },
    **{
        (
            "continued training",
            "TP2",
            family,
        ): "test_parallel_layouts.py::test_every_moe_family_in_tp2_equals_one_process"
        for family in ("deepseek_v2", "deepseek_v3", "qwen2_moe", "qwen3_moe", "mixtral", "ernie4_5_moe")
    },
    **{
        ("continued training", layout, "ernie4_5"): "test_parallel_layouts.py::"
        "test_ernie4_5_in_tp2_and_tp2_sp_equals_one_process"
        for layout in ("TP2", "TP2+SP")
    },
    ("continued training", "EP2", "qwen3_moe"): "test_expert_parallel.py::"
    "test_qwen3_moe_expert_parallel_equals_one_process",
    **{
        ("continued training", layout, "qwen3"): "test_parallel_layouts.py::test_qwen3_layouts_equal_one_process"
        for layout in ("TP2", "TP2+SP", "TP2xSH2 stage2")
    },
    ("continued training", "EP2", "deepseek_v3"): "test_expert_parallel.py::"
    "test_deepseek_v3_expert_parallel_with_bias_balancing_equals_one_process",  # balancing on by default
    ("continued training", "SH2 stage2", "deepseek_v3"): "test_parallel_layouts.py::"
    "test_deepseek_v3_under_sharding_stage2_equals_one_process_and_resumes_exactly",
    **{
        ("continued training", layout, "llama"): "test_parallel_cpu.py::"
        "test_data_parallel_and_sharding_stage1_match_one_process"
        for layout in ("DP2", "SH2 stage1")
    },
    **{
        ("continued training", layout, "llama"): "test_sharding_cpu.py::"
        "test_sharding_stage2_and_stage3_on_two_processes_equal_one"
        for layout in ("SH2 stage2", "SH2 stage3")
    },
    **{
        ("continued training", layout, "qwen2_moe"): "test_expert_parallel.py::"
        "test_expert_parallel_equals_data_parallel_and_one_process"
        for layout in ("DP2", "EP2", "EP2xSH2 stage1")
    },
    **{
        ("fresh initialisation", layout, family): "test_fresh_init_layouts.py::"
        "test_tensor_parallel_ranks_draw_distinct_slices_from_the_single_process_distribution"
        for layout in ("1 process", "TP2")
        for family in ("deepseek_v2", "llama", "qwen3")
    },
    **{
        ("exact resume after kill -9", layout, "llama"): "test_layout_features.py::test_a_killed_run_resumes_exactly"
        for layout in ("TP2", "PP2")
    },
    **{
        ("exact resume after kill -9", layout, family): "test_resume.py::test_killed_run_resumes_exactly"
        for layout, family in (("1 process", "llama"), ("DP2", "llama"), ("1 process", "mixtral"))
    },
    ("exact resume after kill -9", "1 process", "deepseek_v2"): "test_resume.py::test_killed_run_resumes_exactly",
    ("exact resume after kill -9", "SH2 stage2", "llama"): "test_sharding_cpu.py::"
    "test_sharding_stage2_and_stage3_on_two_processes_equal_one",
    ("exact resume after kill -9", "SH2 stage2", "deepseek_v3"): "test_parallel_layouts.py::"
    "test_deepseek_v3_under_sharding_stage2_equals_one_process_and_resumes_exactly",
    ("SIGTERM preemption", "PP2", "llama"): "test_layout_features.py::"
    "test_sigterm_under_pp2_saves_on_both_stages_and_resumes_exactly",
    ("SIGTERM preemption", "DP2", "llama"): "test_preemption.py::test_two_ranks_agree_to_stop_and_resume_exactly",
    **{
        ("resume on another layout", layout, "llama"): "test_layout_features.py::"
        "test_a_checkpoint_resumes_on_another_layout"
        for layout in ("1 process", "TP2", "PP2")
    },
    **{
        (f"spike {policy}", layout, "llama"): "test_layout_features.py::"
        "test_spike_recovery_with_accumulation_agrees_on_every_rank_and_stage"
        for policy in ("skip", "rollback")
        for layout in ("1 process", "TP2", "PP2")
    },
    ("spike rollback", "DP2", "llama"): "test_loss_spikes.py::test_two_ranks_roll_back_together",
    ("skip_data_intervals", "1 process", "llama"): "test_loss_spikes.py::"
    "test_a_skipped_spike_equals_a_run_whose_data_omitted_that_batch",
    **{
        (f"Hugging Face {way}", layout, "llama"): "test_layout_features.py::"
        "test_hf_import_into_and_export_from_a_parallel_run"
        for way in ("import", "export")
        for layout in ("TP2", "PP2")
    },
    **{
        ("document masking", layout, "llama"): "test_layout_features.py::"
        "test_document_masking_under_tp2_and_sequence_parallel_equals_one_process"
        for layout in ("1 process", "TP2", "TP2+SP")
    },
    (
        "evaluation",
        "DP2",
        "llama",
    ): "test_data_parallel_metrics.py::test_the_eval_loss_is_the_same_on_one_and_two_ranks",
    (
        "recompute (non-reentrant)",
        "1 process",
        "qwen3",
    ): "test_parallel_layouts.py::test_qwen3_layouts_equal_one_process",
    **{
        ("expert parallel", layout, "qwen2_moe"): "test_expert_parallel.py::"
        "test_expert_parallel_equals_data_parallel_and_one_process"
        for layout in ("EP2", "EP2xSH2 stage1")
    },
    **{
        (feature, "EP2", "deepseek_v3"): "test_expert_parallel.py::"
        "test_deepseek_v3_expert_parallel_with_bias_balancing_equals_one_process"
        for feature in ("expert parallel", "DeepSeek-V3 bias balancing")
    },
}
# Cells executed here, on features and layouts no other test runs together.
CI_CELLS = (
    ("spike skip", "SH2 stage2", "llama"),  # the detector's norm under stage2's 1/N scaled gradients
    # before optimizer_chain.restore_stage2_views: "spike rollback: weights differ:
    # llama.layers.1.self_attn.o_proj.weight 2.2e-02, llama.layers.0.self_attn.o_proj.weight 2.1e-02, ..."
    ("spike rollback", "SH2 stage2", "llama"),
    ("skip_data_intervals", "TP2xPP2", "llama"),
    # tied embeddings under pipeline parallelism: before hf_import.load_hf_weights synchronised the stages' shared
    # weights, the last stage kept a random head (first loss 9.0340 against one process's 9.0268)
    ("Hugging Face import", "PP2", "qwen2"),
    ("continued training", "EP2", "deepseek_v2"),  # no other test spreads DeepSeek-V2's experts
    ("continued training", "EP2", "ernie4_5_moe"),  # nor ERNIE-4.5-MoE's
    # the pipeline layer's recompute_interval (QWen's pipe alone sets it): before cpu_comm.recompute, paddle's
    # "AssertionError: Recompute with RNG is not support current device: cpu"
    ("recompute (reentrant)", "PP2", "qwen"),
)


def test_every_cell_has_one_verdict_and_a_refusal_is_preflights_line_with_the_nearest_runnable_layout():
    counts = {Executable: 0, Refused: 0, NotApplicable: 0}
    for feature, layout, family in cells():
        found = verdict(feature, layout, family)
        counts[type(found)] += 1
        if isinstance(found, Refused):
            assert found.nearest is None or isinstance(verdict(feature, found.nearest, family), Executable)
            runs = [name for name in MATRIX_LAYOUTS if isinstance(verdict(feature, name, family), Executable)]
            closest = min((support_matrix.distance(layout, name) for name in runs), default=None)
            assert found.nearest is None or support_matrix.distance(layout, found.nearest) == closest
    assert sum(counts.values()) == len(FEATURES) * len(MATRIX_LAYOUTS) * len(families())
    assert all(counts.values()), counts  # each kind occurs: the matrix says something
    print(f"{sum(counts.values())} cells: " + ", ".join(f"{kind.__name__} {n}" for kind, n in counts.items()))


@pytest.mark.parametrize(
    "cell, message, nearest",
    [
        # check_spike_rollback_layout
        (("spike rollback", "SH2 stage3", "llama"), "loss_spike_policy: rollback cannot reload weights", "SH2 stage2"),
        # layout_rules: no pipeline class for qwen3
        (("evaluation", "PP2", "qwen3"), "pipeline_parallel_degree: 2, but paddlenlp has no pipeline", "DP2"),
        # check_reentrant_recompute_of_router_loss: in every layout, so no nearest
        (("recompute (reentrant)", "1 process", "qwen2_moe"), "recompute_use_reentrant: true drops", None),
        # check_device: float16 on CPU, in every layout
        (("fp16", "TP2", "llama"), "fp16: float16 training is not supported on cpu", None),
        # check_device: bfloat16 on CPU; before the matmul probe, executable on a CPU with AVX512-BF16 (paddle says
        # supported) and the run failed: "The kernel with key (CPU, Undefined(AnyLayout), bfloat16) of kernel
        # `matmul` is not registered"
        (("bf16", "TP2", "llama"), "bf16: bfloat16 training is not supported on cpu (paddle's CPU matmul", None),
        # the experts-with-sequence-parallel refusal
        (("evaluation", "TP2+SP", "mixtral"), "sequence_parallel: mixtral's MoE layers take", "TP2"),
    ],
)
def test_known_refusals_are_preflights_own(tmp_path, cell, message, nearest):
    feature, layout, family = cell
    found = verdict(*cell)
    assert isinstance(found, Refused) and found.reason.startswith(message) and found.nearest == nearest, found
    lines = preflight_lines(cell_arguments(feature, layout, family, str(tmp_path)), LAYOUTS[layout].processes)
    assert lines[0] == found.reason


def test_bias_balancing_is_not_applicable_without_routing_biases():
    assert verdict("DeepSeek-V3 bias balancing", "1 process", "deepseek_v3") == Executable()
    assert isinstance(verdict("DeepSeek-V3 bias balancing", "1 process", "qwen2_moe"), NotApplicable)
    assert isinstance(verdict("expert parallel", "EP2", "llama"), NotApplicable)


def _doc_cells(text: str) -> dict:
    """``{(feature, layout, family): the cell as written, a refusal as "R: nearest X: line"}`` of the doc."""
    found, feature, header, notes = {}, None, None, {}
    rows = []
    for line in text.splitlines() + ["## end"]:
        if line.startswith("## "):
            for family, entries in rows:
                for layout, entry in zip(header, entries):
                    label = re.fullmatch(r"(?:✗ )?([RF]\d+)", entry)
                    found[(feature, layout, family)] = notes[label.group(1)] if label else entry
            feature, header, notes, rows = line[3:], None, {}, []
        elif line.startswith("| family |"):
            header = [name.strip() for name in line.strip("|").split("|")][1:]
        elif line.startswith("| ") and header:
            entries = [entry.strip() for entry in line.strip("|").split("|")]
            rows.append((entries[0], entries[1:]))
        elif line.startswith("- **"):
            label, body = re.fullmatch(r"- \*\*([RF]\d+)\*\* (.*)", line).groups()
            notes[label] = f"{label[0]}: {body}"
    return found


def test_the_doc_shows_the_verdicts_of_today():
    """docs/support-matrix.md (``make matrix``) holds every cell, and each refused, not applicable or executable
    cell is what ``verdict`` says now: a refusal with preflight's line and the nearest layout."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    assert text.startswith("<!-- generated by benchmarks/support_matrix.py")
    written = _doc_cells(text)
    stale = []
    for cell in cells():
        found, entry = verdict(*cell), written.get(cell)
        if isinstance(found, Refused):
            want = f"R: nearest {found.nearest or 'none on CPU'}: {found.reason}"
            ok = entry == want
        elif isinstance(found, NotApplicable):
            ok = entry == "–"
        else:
            ok = entry in ("✓", "·") or (entry or "").startswith("F: ")
        if not ok:
            stale.append(f"{cell}: doc {entry!r}, verdict {found}")
    assert not stale, f"{len(stale)} cells differ (run make matrix): " + "; ".join(stale[:5])


def _test_names(file: str) -> set:
    with open(os.path.join(REPO, "tests", file), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_the_cells_the_suite_executes_are_executable_and_named_by_a_test():
    """Each cell ``COVERED`` names is executable today and its test exists; the pairs of feature and layout that no
    test of the suite executes are printed (``make matrix`` executes them)."""
    for cell, test in COVERED.items():
        file, name = test.split("::")
        assert name in _test_names(file), test
        assert verdict(*cell) == Executable(), (cell, verdict(*cell))
    for cell in CI_CELLS:
        assert verdict(*cell) == Executable(), cell
    together = [
        (feature, layout, family)
        for features, layout, family in CI_TOGETHER
        for feature in features
        if verdict(feature, layout, family) == Executable()
    ]
    executed = {(feature, layout) for feature, layout, _ in [*COVERED, *CI_CELLS, *together]}
    runnable = {
        (feature, layout)
        for feature, layout, family in cells()
        if isinstance(verdict(feature, layout, family), Executable)
    }
    print(f"the suite executes {len(executed)} of the {len(runnable)} executable feature x layout pairs")


@pytest.mark.parametrize("layout", ["TP2", "PP2", "EP2"])
def test_every_family_continues_training_in_tp2_pp2_and_ep2_in_the_suite_or_is_refused(layout):
    """Each registry family, continued in TP2, PP2 and EP2, is executed by a test of the suite (``COVERED``) or
    refused by preflight: a family added to the registry fails here until a test runs it there."""
    missing = [
        family
        for family in families()
        if isinstance(verdict("continued training", layout, family), Executable)
        and ("continued training", layout, family) not in {*COVERED, *CI_CELLS}
    ]
    assert not missing, f"no test of the suite continues {missing} in {layout}"


@pytest.fixture
def matrix_cells(tmp_path, demo_dir):
    """Each test's own ``Cells``, its runs deleted when it passes (a module's would hold 5 GiB of checkpoints at its
    end; the tests share no runs but the reference of ``TOGETHER[0]``, about 20 s)."""
    from support_matrix_cells import Cells

    return Cells(str(tmp_path))


@pytest.mark.slow
@pytest.mark.launch  # each cell launches its runs (tests/support_matrix_cells.py)
@pytest.mark.parametrize("cell", CI_CELLS, ids=["|".join(cell) for cell in CI_CELLS])
def test_a_covering_cell_executes_equal_to_one_process(matrix_cells, cell):
    print(f"{cell}: {matrix_cells.run(*cell)}")


# cells executed together in one run (``Cells.together``): the features of each entry executable in its layout
CI_TOGETHER = (
    # before compute_loss injected in training only: "eval losses [(2, 8.6438...), ...] vs [(2, 8643.8066...), ...]"
    # (the evaluation after step 2 went through the injection of the spike at step 3 under pipeline parallelism)
    (("spike skip", "evaluation"), "PP2", "llama"),
    # the default recipe's layout with every fp32 feature at once, killed, preempted and resumed elsewhere
    (TOGETHER[0], "TP2xSH2 stage2", "llama"),
    (TOGETHER[1], "TP2xSH2 stage2", "llama"),
    (TOGETHER[0], "SH2 stage1", "llama"),
    # DeepSeek-V3 (MTP, routing biases balanced) over two expert-parallel ranks
    (TOGETHER[0], "EP2", "deepseek_v3"),
)


@pytest.mark.slow
@pytest.mark.launch
@pytest.mark.parametrize(
    "features, layout, family",
    CI_TOGETHER,
    ids=[
        f"{f'TOGETHER[{TOGETHER.index(f)}]' if f in TOGETHER else '+'.join(f)}|{layout}|{family}"
        for f, layout, family in CI_TOGETHER
    ],
)
def test_cells_executed_together_are_each_equal_to_one_process(matrix_cells, features, layout, family):
    features = tuple(feature for feature in features if verdict(feature, layout, family) == Executable())
    for feature, line in matrix_cells.together(features, layout, family).items():
        print(f"{feature} | {layout} | {family}: {line}")


def test_a_resume_refusal_is_what_preflight_says_of_the_checkpoint_written(tmp_path):
    """A resume cell is refused before any run when the checkpoint its layout writes cannot be resumed on the
    resuming layout: sharding stage3's per-rank files on one process (measured before this verdict: the cell was
    executable, and its run's preflight refused the resume, naming the folder). The line is
    ``pretrain.resume_layout``'s on a folder holding what stage3 x2 writes, the folder's name aside."""
    from types import SimpleNamespace

    import paddle

    from pretrain.layout import ParallelLayout
    from pretrain.resume_layout import layout_change_problem

    found = verdict("resume on another layout", "SH2 stage3", "llama")
    assert isinstance(found, Refused) and found.nearest == "SH2 stage2", found
    for name in ("model_state.pdparams", "optimizer.shard00.pdopt", "optimizer.shard01.pdopt"):
        (tmp_path / name).write_bytes(b"")
    paddle.save(SimpleNamespace(sharding="stage3"), str(tmp_path / "training_args.bin"))
    one_process = ParallelLayout(world_size=1, nnodes=1)
    said = layout_change_problem(str(tmp_path), one_process)
    assert said.replace(str(tmp_path), "checkpoint-2 of SH2 stage3") == found.reason


def test_a_tied_embedding_checkpoint_of_one_process_is_refused_on_tensor_parallel_ranks():
    """``resume_layout.tied_embedding_resume_problem``: before it, Qwen3 debug (tied embeddings) resumed from one
    process's checkpoint-2 on TP2 passed preflight and failed at start, "KeyError:
    'qwen2.embed_tokens.weight/beta2_pow_acc_0'" (paddlenlp's unified optimizer load); the same preflight line
    refuses a real run of it (measured). An untied model resumes there."""
    found = verdict("resume on another layout", "1 process", "qwen3")
    assert isinstance(found, Refused) and found.nearest == "DP2", found
    assert found.reason.startswith("resume: checkpoint-2 of 1 process was saved without tensor parallelism by a model")
    assert verdict("resume on another layout", "1 process", "llama") == Executable()
    assert verdict("resume on another layout", "DP2", "qwen3") == Executable()  # resumed on one process


def test_a_cell_that_raises_what_no_check_foresaw_fails_alone(tmp_path, monkeypatch):
    """``Cells.each``: a group whose shared run raises anything (the GPT-3 PP2 export's SafetensorError ended a
    whole pass of the matrix) runs one by one, and a cell that raises is a failed cell with the error's type and
    message while the others of its row still execute."""
    from support_matrix_cells import Cells

    from pretrain.support_matrix import groups

    cells = Cells(str(tmp_path))
    features = [f for f in FEATURES if verdict(f, "TP2", "llama") == Executable()]
    shared = next(group for group in groups(features) if len(group) > 1)

    def together(self, group, layout, family):
        raise OSError("disk gone")

    def run(self, feature, layout, family):
        if feature == shared[0]:
            raise OSError("disk gone")
        return "equal"

    monkeypatch.setattr(Cells, "together", together)
    monkeypatch.setattr(Cells, "run", run)
    outcomes = dict(cells.each(features, "TP2", "llama"))
    assert sorted(outcomes) == sorted(features)
    assert isinstance(outcomes[shared[0]], AssertionError) and str(outcomes[shared[0]]) == "OSError: disk gone"
    assert all(outcomes[f] == "equal" for f in features if f != shared[0])


def test_a_gpt_pipeline_checkpoint_is_resumed_with_pipelines_only(tmp_path):
    """``resume_layout.pipeline_head_resume_problem``: GPT-3's pipeline stages name the tied head as the
    embedding, so its PP2 checkpoint-2 holds no lm_head.weight; before this rule the matrix's resume of it on one
    process passed preflight and failed at start ("ValueError: Missing keys: {'lm_head.weight'}", paddlenlp's
    single-card loader). The cell's refusal is preflight's line on a folder of what PP2 writes, the folder's name
    aside; Qwen2 (tied, its last stage saving lm_head.weight) resumes there."""
    from types import SimpleNamespace

    import paddle

    from pretrain.layout import ParallelLayout
    from pretrain.registry import MODEL_SIZES
    from pretrain.resume_layout import UNIFIED_OPTIMIZER_INDEX, resume_layout_problems

    found = verdict("resume on another layout", "PP2", "gpt3")
    assert isinstance(found, Refused) and found.nearest == "DP2", found
    assert verdict("resume on another layout", "PP2", "qwen2") == Executable()
    (tmp_path / UNIFIED_OPTIMIZER_INDEX).write_text("{}")
    paddle.save(SimpleNamespace(pipeline_parallel_degree=2), str(tmp_path / "training_args.bin"))
    plan = SimpleNamespace(
        resume_checkpoint=str(tmp_path),
        training_args=SimpleNamespace(
            per_device_train_batch_size=2, gradient_accumulation_steps=2, load_sharded_model=False
        ),
        layout=ParallelLayout(world_size=1, nnodes=1),
        model_config=MODEL_SIZES["gpt3-debug"].model_config(),
        global_batch_samples=4,
        seq_length=64,
    )
    said = [line for line in resume_layout_problems(plan) if "lm_head.weight" in line]
    assert [line.replace(str(tmp_path), "checkpoint-2 of PP2") for line in said] == [found.reason]
