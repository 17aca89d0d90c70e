"""The support matrix as data: which feature runs in which parallel layout for which model family on CPU.

Three tables and one function, read by preflight's tests, by the executor of the cells
(``tests/support_matrix_cells.py``), by ``benchmarks/support_matrix.py`` (``make matrix``, which writes
docs/support-matrix.md) and by tests/test_support_matrix.py:

- ``LAYOUTS``: a layout's name -> ``Layout`` (processes and the run_pretrain.py arguments that make it; the
  golden runs of tests/parallel_golden.py read this table, there is no other);
- ``FEATURES``: a feature's name -> ``Feature`` (the run_pretrain.py arguments that switch it on, the families it
  applies to, what an executed cell checks);
- the families: every ``pretrain.registry.FAMILIES`` entry at its debug size (``debug_size``) (a family added to the
  registry, or a layout to ``LAYOUTS``, enters every cell by itself);
- ``verdict(feature, layout, family)``: ``Executable()``, ``Refused(reason, nearest)`` or ``NotApplicable(why)``.

A cell is either executed on CPU processes and equal to one process (or, for the resume cells, to its own
uninterrupted run), or refused by preflight before any process starts; a cell the family predicate excludes
(bias balancing of a model without routing biases) is not applicable. The verdict runs the real preflight
(``pretrain.preflight.check_run``) on the plan ``pretrain.resolve.resolve_run`` makes of the cell's
arguments, inside ``pretrain.layout.simulated_launch`` for the layout's processes: the refusal's reason is
preflight's own line (or the argument parser's ``UserError``), never a second copy of a rule. The nearest
layout is the executable layout of the same feature and family whose parallel degrees differ from the
refused one's in the fewest places (``distance``).

A verdict is computed from scratch (the family's debug size, ``continue_training false``), with no process and
no weights folder: what needs files a run writes (that saved weights fit the layout, that a checkpoint's
per-rank files load on the resuming layout) is checked by the executed run's own preflight, and a refusal there
fails the cell.
"""

from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Union

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 4  # optimizer steps of a matrix (and golden) run
SHRINK = ("--max_seq_length", "64")  # and the layers; each family keeps its debug width (hidden 256, 4 heads)
# AdamW's epsilon in every golden run: 1e-3, not the recipes' 1e-8. With 1e-8 AdamW moves an element by
# about lr x the sign of its gradient whatever the gradient's size, so an element whose gradient is, at
# some step, within float32 rounding of zero lands anywhere within ~lr. Measured (llama, 4 steps, lr 2e-3,
# final weights against one process, per tensor, max |difference| / max |w|): TP2 up to 2.2e-4, PP2 1.0e-5,
# and a second 1-process run that differs only in summation order (micro-batches 1 x 4 instead of 2 x 2)
# 1.5e-4; the elements beyond 1e-6 had, at some step, a gradient 10 to 3,000 times below their
# tensor's median (the median over those elements, per tensor; over all elements: 3 to 4 times). With
# 1e-3 such an element moves by about lr x gradient / 1e-3, so rounding stays rounding: all three within
# 1.6e-7, while training still moves the weights by 0.1% to 9% of their scale in 4 steps. A wrong
# gradient scale (a reduction missed or done twice, another clip) now moves the update in proportion
# instead of being normalised away by AdamW.
ADAM_EPSILON = ("--adam_epsilon", "1e-3")


class Layout(NamedTuple):
    """A parallel layout of a matrix run: ``processes`` CPU processes, ``arguments`` of run_pretrain.py,
    ``layers`` of the debug model, and ``reference``, the 1-process layout it must equal (same global batch)."""

    processes: int
    arguments: tuple
    layers: int = 2
    reference: str = "1 process"


BATCH_4 = ("--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2")  # 4 samples a step
# 2 ranks reading 1 sample each per micro-batch, 2 micro-batches: 4 samples a step
BATCH_2X2 = ("--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "2")
# paddle asserts virtual stages need more than 2 stages (6 layers = 3 stages x 2 chunks), and an
# accumulation that the stages divide: 6 micro-batches of 1 sample
BATCH_6 = ("--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "6")
TP2, PP2 = ("--tensor_parallel_degree", "2"), ("--pipeline_parallel_degree", "2")
UNCLIPPED = ("--max_grad_norm", "0")  # sharding stage3 on CPU cannot clip (preflight's check_device)


def _sharded(stage: str, *extra: str) -> tuple:
    return ("--sharding", stage, "--sharding_parallel_degree", "2", *extra)


LAYOUTS = {
    "1 process": Layout(1, BATCH_4),
    "DP2": Layout(2, (*BATCH_2X2, "--unified_checkpoint", "false")),  # without fleet's groups: experts replicated
    "SH2 stage1": Layout(2, _sharded("stage1", *BATCH_2X2)),
    "SH2 stage2": Layout(2, _sharded("stage2", *BATCH_2X2)),
    "SH2 stage3": Layout(2, _sharded("stage3", *BATCH_2X2, *UNCLIPPED), reference="1 process, unclipped"),
    "TP2": Layout(2, (*TP2, *BATCH_4)),
    "TP2+SP": Layout(2, (*TP2, "--sequence_parallel", "true", *BATCH_4)),
    "PP2": Layout(2, (*PP2, *BATCH_4)),
    "PP3xVPP2": Layout(
        3, ("--pipeline_parallel_degree", "3", "--virtual_pp_degree", "2", *BATCH_6), 6, "1 process, 6 samples"
    ),
    "TP2xPP2": Layout(4, (*TP2, *PP2, *BATCH_4)),
    # 2 sharding ranks read 1 sample each per micro-batch: 1 x 2 x 2 = 4 samples a step
    "TP2xSH2 stage1": Layout(4, (*TP2, *_sharded("stage1", *BATCH_2X2))),
    # the default recipe's layout (config/llama/pretrain_argument.json): TP2 x sharding stage2
    "TP2xSH2 stage2": Layout(4, (*TP2, *_sharded("stage2", *BATCH_2X2))),
    "EP2": Layout(2, (*BATCH_2X2, "--use_expert_parallel", "true")),
    # expert parallel over the 2 data-parallel ranks, each a pair of sharding stage1 ranks (which hold the
    # same experts): 4 ranks of 1 sample, 4 samples a step
    "EP2xSH2 stage1": Layout(
        4,
        ("--use_expert_parallel", "true", *_sharded("stage1"))
        + ("--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "1"),
    ),
    # the references of the layouts above that take another batch or no clipping
    "1 process, 6 samples": Layout(1, BATCH_6, 6),
    "1 process, unclipped": Layout(1, (*BATCH_4, *UNCLIPPED)),
}
REFERENCES = ("1 process, 6 samples", "1 process, unclipped")  # in LAYOUTS, not columns of the matrix
MATRIX_LAYOUTS = tuple(name for name in LAYOUTS if name not in REFERENCES)


def _moe(family) -> bool:
    return family.implementation.routing is not None


def _routing_biases(family) -> bool:
    routing = family.implementation.routing
    return routing is not None and "noaux_tc" in routing.topk_methods


def _any(family) -> bool:
    return True


def _imports_its_export(family) -> bool:
    """The family's transformers export is an architecture it imports as itself (QWen v1 exports as
    ``Qwen2ForCausalLM``, whose folder a run continues as qwen2: the qwen2 row)."""
    hf = family.implementation.hf
    return hf is not None and hf.architecture in hf.imports


@dataclass(frozen=True)
class Feature:
    """A feature of a run: ``arguments`` of run_pretrain.py that switch it on, the families it ``applies`` to
    (a predicate of a ``pretrain.families.records.Family``; ``applies_to`` says which in words), and what an
    executed cell ``checks`` (the executor: ``tests/support_matrix_cells.py``)."""

    arguments: tuple
    checks: str
    applies: Callable = _any
    applies_to: str = "every family"
    resumes_elsewhere: bool = False  # its checkpoint-2 is resumed on ``resume_partner(layout)``
    exports: bool = False  # it needs the model exported to transformers (``hf_export.export_problem``)
    # its arguments in a run shared with other features (``TOGETHER``), where they differ from ``arguments``
    together: Optional[tuple] = None


SPIKE_AT = 3  # the step whose loss the spike cells multiply (``debug_inject_spike_at_step``)
SPIKE = ("--spike_warmup_steps", "2", "--debug_inject_spike_at_step", str(SPIKE_AT))
SAVE_AT_2 = ("--save_steps", "2")
RECOMPUTE = ("--recompute", "true", "--recompute_granularity", "full")
FEATURES = {
    "continued training": Feature(
        (),
        "continued from the same saved weights (paddle's format) as one process: losses within 1e-6 relative, "
        "final weights every element within 1e-6 of its tensor's scale, train_tokens equal",
    ),
    "fresh initialisation": Feature(
        ("--continue_training", "false", "--max_steps", "1"),
        "from scratch, 1 step: each tensor's mean and std within sampling error of one process's; no split matrix "
        "has two equal halves (each tensor-parallel rank draws its own slice)",
    ),
    "Hugging Face import": Feature(
        (),
        "continued from the transformers export of the initial weights: equal to one process continued from the "
        "paddle weights",
        applies=_imports_its_export,
        applies_to="families whose export a run imports as the same family (QWen v1's, a Qwen2ForCausalLM, "
        "continues as qwen2)",
        exports=True,
    ),
    "exact resume after kill -9": Feature(
        SAVE_AT_2, "SIGKILL of every process once checkpoint-2 is complete, restarted: bit-exact to its own run"
    ),
    "resume on another layout": Feature(
        SAVE_AT_2,
        "checkpoint-2 resumed on the layout's reference (1 process; the 1-process column: on TP2): the "
        "uninterrupted run's losses and weights within the golden tolerances",
        resumes_elsewhere=True,
    ),
    "spike skip": Feature(
        ("--loss_spike_policy", "skip", *SPIKE, *SAVE_AT_2),
        f"a spike injected at step {SPIKE_AT} is skipped on every rank: equal to one process, the summary records "
        "it, the detector's kept gradient norms (checkpoint-2) within 1e-6 of one process's",
    ),
    "spike rollback": Feature(
        ("--loss_spike_policy", "rollback", "--rollback_skip_batches", "1", *SPIKE, *SAVE_AT_2),
        f"a spike injected at step {SPIKE_AT} rolls back to checkpoint-2 on every rank: equal to one process",
    ),
    "skip_data_intervals": Feature(
        ("--skip_data_intervals", "3", "3"),
        "step 3's batch skipped (step 5's in a shared run): equal to one process",
        together=("--skip_data_intervals", "5", "5"),  # step 3 is the spike's there
    ),
    "SIGTERM preemption": Feature(
        (), "SIGTERM to the launcher after step 1 saves a checkpoint, the same command resumes: bit-exact"
    ),
    "document masking": Feature(
        ("--reset_attention_mask", "true", "--reset_position_ids", "true"), "equal to one process"
    ),
    "evaluation": Feature(
        ("--do_eval", "true", "--evaluation_strategy", "steps", "--eval_steps", "2", "--eval_iters", "2"),
        "the evaluation losses equal one process's (1e-6 relative)",
    ),
    "Hugging Face export": Feature(
        (), "the final folder's transformers export within the golden tolerance", exports=True
    ),
    "recompute (reentrant)": Feature((*RECOMPUTE, "--recompute_use_reentrant", "true"), "equal to one process"),
    "recompute (non-reentrant)": Feature((*RECOMPUTE, "--recompute_use_reentrant", "false"), "equal to one process"),
    "expert parallel": Feature(
        ("--use_expert_parallel", "true"), "equal to one process", _moe, "mixtures of experts (a routing)"
    ),
    "DeepSeek-V3 bias balancing": Feature(
        ("--moe_bias_update_rate", "0.001"),
        "equal to one process",
        _routing_biases,
        "gates with routing biases (topk_method noaux_tc)",
    ),
    "fp16": Feature(("--fp16", "true", "--fp16_opt_level", "O2"), "equal to one process in fp16 (1e-2 relative)"),
    "bf16": Feature(("--bf16", "true", "--fp16_opt_level", "O2"), "equal to one process in bf16 (1e-2 relative)"),
}


# Features executed in one run per family and layout (``tests/support_matrix_cells.py`` ``Cells.together``), those
# of each group that are executable there: the fp32 features one run carries at once, for TOGETHER_STEPS steps,
# with the checks that reuse that run (its kill -9 and SIGTERM resumes, its checkpoint-2 resumed elsewhere, its
# export; continued from the transformers export of the initial weights, so that it is the import too); then the
# rollback, whose spike the first group's skip policy would catch, with the other recompute mode. A group that
# fails is executed again one feature at a time, so that each cell's verdict is its own. Every other feature runs
# on its own (``make matrix``: benchmarks/support_matrix.py).
TOGETHER = (
    (
        "continued training",
        "Hugging Face import",
        "spike skip",
        "skip_data_intervals",
        "document masking",
        "evaluation",
        "recompute (non-reentrant)",
        "DeepSeek-V3 bias balancing",
        "Hugging Face export",
        "exact resume after kill -9",
        "SIGTERM preemption",
        "resume on another layout",
    ),
    ("spike rollback", "recompute (reentrant)"),
)
TOGETHER_STEPS = 6  # a shared run's steps: the spike at 3, skip_data_intervals' window at 5, steps 4 and 6 trained


def groups(features: list) -> list:
    """``features`` (of one cell row: executable in a layout for a family) as the runs that execute them: each
    ``TOGETHER`` group's members among them, then each other feature alone; in ``FEATURES`` order within each."""
    shared = [tuple(f for f in FEATURES if f in group and f in features) for group in TOGETHER]
    alone = [(f,) for f in FEATURES if f in features and not any(f in group for group in TOGETHER)]
    return [group for group in shared + alone if group]


def together_arguments(features: tuple) -> tuple:
    """run_pretrain.py's arguments of a run shared by ``features`` (``TOGETHER``): each one's ``together`` or
    ``arguments``, for ``TOGETHER_STEPS`` steps."""
    arguments: tuple = ("--max_steps", str(TOGETHER_STEPS), "--save_total_limit", "3")  # checkpoint-2 kept
    for feature in features:
        spec = FEATURES[feature]
        arguments += spec.arguments if spec.together is None else spec.together
    return arguments


@dataclass(frozen=True)
class Executable:
    """Preflight passes the cell: it runs."""


@dataclass(frozen=True)
class Refused:
    """Preflight refuses the cell: ``reason`` is its first line; ``nearest`` the nearest layout that runs the
    feature for the family (None: none does on CPU)."""

    reason: str
    nearest: Optional[str]


@dataclass(frozen=True)
class NotApplicable:
    """The feature is not one of the family's (``Feature.applies``)."""

    why: str


Verdict = Union[Executable, Refused, NotApplicable]


def families() -> tuple:
    """Every registry family's name (``pretrain.registry.FAMILIES``), in the registry's order."""
    from pretrain.registry import FAMILIES

    return tuple(FAMILIES)


def debug_size(family: str) -> str:
    """The family's debug size, its CPU tests' and demos' model: the ``model_name_or_path`` of its CPU demo config
    (``llama-debug``, ``ernie-4.5-debug``, ...); the family's name with ``-debug`` when it has no demo config (every
    cell of it is then refused, naming the missing config)."""
    import json

    if not os.path.isfile(family_config(family)):
        return f"{family}-debug"
    with open(family_config(family), encoding="utf-8") as f:
        return json.load(f)["model_name_or_path"]


def family_config(family: str) -> str:
    """The family's CPU demo config."""
    return os.path.join(REPO, "config", family, "pretrain_demo_cpu.json")


def model_args(family: str, layers: int, *extra: str) -> list:
    """The demo config of ``family`` (its debug size) with ``layers`` layers, 64-token samples, and ``extra``."""
    return [family_config(family), *SHRINK, "--num_hidden_layers", str(layers), *extra]


def with_overrides(argv: list, *extra: str) -> list:
    """``argv`` with ``extra`` (``--key value ...``) applied: a key already in ``argv`` gets the new values in
    place, a new one is appended (run_pretrain.py would take the last of a key given twice, and log it)."""
    argv = list(argv)
    options: list = []  # (--key, [values]) of extra
    for token in extra:
        if token.startswith("--"):
            options.append((token, []))
        else:
            options[-1][1].append(token)
    for key, values in options:
        if key not in argv:
            argv += [key, *values]
            continue
        start = stop = argv.index(key) + 1
        while stop < len(argv) and not argv[stop].startswith("--"):
            stop += 1
        argv[start:stop] = values
    return argv


def run_arguments(
    output_dir: str, data_cache: str, weights: str, family: str, layout: str, *extra: str, layers: int = None
) -> list:
    """run_pretrain.py's arguments of a matrix (and golden) run: ``family``'s demo config at ``layers`` layers
    (default ``layout``'s), continued from ``weights`` (a folder, or the debug size's name with
    ``--continue_training false`` in ``extra``) for STEPS steps, unified checkpoints, no evaluation, in
    ``layout``; ``extra`` overrides them."""
    return with_overrides(
        model_args(family, layers or LAYOUTS[layout].layers),
        *("--model_name_or_path", weights, "--continue_training", "true", "--output_dir", output_dir),
        *("--data_cache", data_cache, "--max_steps", str(STEPS), "--warmup_steps", "2"),
        *("--logging_steps", "1", "--save_steps", "1000", "--do_eval", "false", "--evaluation_strategy", "no"),
        *("--unified_checkpoint", "true", "--tensor_parallel_output", "true", "--hang_timeout", "60"),
        *("--measure_peak_flops", "false"),  # the llama demo's 4 s matmul probe: no figure a cell reads
        *ADAM_EPSILON,
        *LAYOUTS[layout].arguments,
        *extra,
    )


def preflight_lines(argv: list, processes: int) -> list:
    """What preflight says of ``run_pretrain.py argv`` launched on ``processes`` CPU processes, without launching:
    the argument parser's ``UserError`` (one entry), or ``check_run``'s lines ([] when the run may start)."""
    return _checked(argv, processes)[1]


def _checked(argv: list, processes: int) -> tuple:
    """(the ``RunPlan``, or None where parsing refused it; ``preflight_lines``)."""
    from pretrain.arguments import parse_arguments
    from pretrain.errors import UserError
    from pretrain.layout import simulated_launch
    from pretrain.preflight import check_run
    from pretrain.resolve import resolve_run

    try:
        with simulated_launch(1, processes):
            plan = resolve_run(*parse_arguments(argv))
            return plan, check_run(plan)
    except UserError as e:
        return None, [str(e)]


def resume_partner(layout: str) -> str:
    """The layout a ``resumes_elsewhere`` cell resumes ``layout``'s checkpoint on: its reference (the same global
    batch in 1 process), and TP2 for the 1-process column."""
    return "TP2" if layout == "1 process" else LAYOUTS[layout].reference


def _resume_problems(saved, resuming, layout: str) -> list:
    """What preflight will say (``pretrain.resume_layout.saved_layout_change_problem``) when the ``RunPlan``
    ``resuming`` resumes the checkpoint the plan ``saved`` (of ``layout``) writes: for merged files
    (``unified_checkpoint``, which paddlenlp turns off under sharding stage3) the tied-embedding rules
    (``unified_resume_problems``), else its per-rank files' rule."""
    from pretrain.resume_layout import SavedLayout, saved_layout_change_problem, unified_resume_problems

    args, written = saved.training_args, saved.layout
    if args.unified_checkpoint:
        name = f"checkpoint-2 of {layout}"
        tp, pp = written.tensor_parallel_degree, written.pipeline_parallel_degree
        return unified_resume_problems(name, tp, pp, saved.model_config, resuming.layout)
    sharded = written.sharding_parallel_degree if written.sharding_stage else 1
    files = SavedLayout(
        written.tensor_parallel_degree, written.pipeline_parallel_degree, sharded, {}, bool(args.save_sharded_model)
    )
    problem = saved_layout_change_problem(
        f"checkpoint-2 of {layout}",
        files,
        written.sharding_stage,
        resuming.layout,
        bool(resuming.training_args.load_sharded_model),
    )
    return [problem] if problem else []


def cell_arguments(feature: str, layout: str, family: str, folder: str) -> list:
    """The arguments of the cell's verdict: from scratch at the debug size, output and index cache in
    ``folder``, the layout's and the feature's arguments."""
    return run_arguments(
        os.path.join(folder, "out"),
        os.path.join(folder, "cache"),
        debug_size(family),
        family,
        layout,
        "--continue_training",
        "false",
        *FEATURES[feature].arguments,
    )


def _degrees(layout: str) -> tuple:
    """(processes, tensor, pipeline, virtual pipeline, sharding stage, expert parallel, sequence parallel) of a
    layout as numbers, read from its arguments (1, or 0 for the stage and the flags, where not given)."""
    args = LAYOUTS[layout].arguments

    def value(key: str, default: str = "1") -> str:
        return args[args.index(key) + 1] if key in args else default

    return (
        LAYOUTS[layout].processes,
        int(value("--tensor_parallel_degree")),
        int(value("--pipeline_parallel_degree")),
        int(value("--virtual_pp_degree")),
        int(value("--sharding", "stage0").removeprefix("stage")),
        int(value("--use_expert_parallel", "false") == "true"),
        int(value("--sequence_parallel", "false") == "true"),
    )


def distance(one: str, other: str) -> float:
    """How far apart two layouts are: the sum of their parallel degrees' differences (``_degrees``; sharding
    stage3 is 1 from stage2 and 3 from none), the processes' counting half (so that EP2 x stage1 is nearer
    stage1 x2 than TP2 x stage1, PP2 nearer DP2 than 1 process)."""
    (processes, *degrees), (other_processes, *other_degrees) = _degrees(one), _degrees(other)
    return abs(processes - other_processes) / 2 + sum(abs(a - b) for a, b in zip(degrees, other_degrees))


@functools.lru_cache(maxsize=None)
def _row(feature: str, family: str) -> dict:
    """``{layout: first preflight line, or None}`` of the feature and family in every matrix layout (a
    ``resumes_elsewhere`` feature: also the resuming layout's, and the resume's own, ``_resume_problems``)."""
    with tempfile.TemporaryDirectory(prefix="support-matrix-") as folder:
        row = {}
        for layout in MATRIX_LAYOUTS:
            plan, lines = _checked(cell_arguments(feature, layout, family, folder), LAYOUTS[layout].processes)
            if not lines and FEATURES[feature].exports:
                lines = [why for why in [_export_problem(family, plan)] if why]
            if not lines and FEATURES[feature].resumes_elsewhere:
                partner = resume_partner(layout)
                resuming, lines = _checked(cell_arguments(feature, partner, family, folder), LAYOUTS[partner].processes)
                lines = lines or _resume_problems(plan, resuming, layout)
            row[layout] = lines[0].replace(folder, "<output>").replace("\n", " ") if lines else None
    return row


def _export_problem(family: str, plan) -> Optional[str]:
    """``hf_export.export_problem`` of the plan's model: the line of the export (and so the import) cells."""
    from pretrain.hf_export import export_problem
    from pretrain.registry import FAMILIES

    return export_problem(plan.model_config, FAMILIES[family].implementation)


def verdict(feature: str, layout: str, family: str) -> Verdict:
    """The cell's verdict (see the module docstring); ``feature`` a ``FEATURES`` key, ``layout`` one of
    ``MATRIX_LAYOUTS``, ``family`` a registry family. Resolves and checks the cell's plan and those of its row
    (about 20 ms each, cached per feature and family); starts no process.

    Raises:
        KeyError: an unknown feature, layout or family.
    """
    from pretrain.registry import FAMILIES

    wanted = FEATURES[feature]
    if layout not in MATRIX_LAYOUTS:
        raise KeyError(layout)
    if not wanted.applies(FAMILIES[family]):
        return NotApplicable(f"{feature} applies to {wanted.applies_to}")
    row = _row(feature, family)
    if row[layout] is None:
        return Executable()
    runs = [name for name in MATRIX_LAYOUTS if row[name] is None]
    nearest = min(runs, key=lambda name: (distance(layout, name), LAYOUTS[name].processes), default=None)
    return Refused(row[layout], nearest)


def cells():
    """Every (feature, layout, family) of the matrix: features, then families, then layouts, in table order."""
    for feature in FEATURES:
        for family in families():
            for layout in MATRIX_LAYOUTS:
                yield feature, layout, family
