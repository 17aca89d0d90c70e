"""Golden runs of run_pretrain.py in parallel layouts on CPU processes (gloo, ``pretrain.cpu_comm``),
each compared with one process on the same initial weights and the same global batches.

The initial weights are built once per family and size (``initial_weights``: the run's own
``build_model``, saved with ``save_pretrained``); every run continues from them
(``continue_training``), so tensor-parallel ranks load slices of the same matrices. The global batch
(micro-batch x accumulation x data ranks) is the same in a layout and its reference, so the
in-order sampler feeds the same samples to each step. Runs save merged weights under the
single-model names (``unified_checkpoint``), which ``final_weights`` reads; ``assert_golden_weights``
compares them, every element within 1e-6 of its tensor's scale, with AdamW's epsilon at
``ADAM_EPSILON`` (why: beside it in ``pretrain.support_matrix``, which holds the layouts, ``LAYOUTS``).
"""

import json
import os
import shutil
import sys

import numpy as np
from conftest import REPO, resolve_plan
from tiny_run import launch_command, python_script, run

from pretrain.metrics.loss_curves import load_train_losses
from pretrain.support_matrix import ADAM_EPSILON, LAYOUTS, STEPS, family_config, model_args  # noqa: F401
from pretrain.support_matrix import run_arguments as matrix_run_arguments

WEIGHT_TOLERANCE = 1e-6  # of each tensor's scale (``weight_differences``), every element


def initial_weights(folder: str, family: str, layers: int, *extra: str) -> str:
    """``folder`` holding a freshly built model (config.json + weights) of ``model_args``, dropout off
    (GPT-3's 0.1), its biases drawn as its weights are (normal, std initializer_range) rather than
    zero: the starting point of every run of a comparison, drawn from the run's seed, so the same in
    every test session. Drawn from paddle's unseeded generator, they differed from one session to the
    next, and a mixture of experts' comparison failed in one full test run of many (Qwen3-MoE TP2 against
    one process: 4.5e-6 relative at step 3, after 1.1e-7 at step 2; 8 other seeds gave at most 1.2e-7),
    as a token whose two best experts' scores nearly tie goes to either, by the float32 rounding of the
    layout's sums.

    Why the biases: a zero-initialised bias ends as the sum of its updates alone, each a sum of one
    step's 256 token gradients of either sign, whose float32 rounding is about sqrt(256) x 6e-8 = 1e-6
    of the result: measured up to 2.9e-6 of its maximum (GPT-3's attention output bias) between two
    1-process runs that differ only in how the step's samples are split into micro-batches. A trained
    model's biases, which continued training starts from, are not zero; from such a start the same
    rounding is 1e-8 of the bias's scale, as for the weight matrices. GPT-3's key-projection bias, whose
    exact gradient is zero (a bias on the keys adds the same q.b to every score of a query's row, which
    softmax ignores), then keeps its initial values instead of holding rounding noise alone.
    """
    if not os.path.exists(os.path.join(folder, "config.json")):
        import paddle

        from pretrain.model import build_model

        plan = resolve_plan([*model_args(family, layers, *extra), "--output_dir", folder])
        paddle.seed(plan.training_args.seed)  # the same weights in every test session (a routing tie is one)
        model = build_model(plan)
        for key in [key for key in model.config.to_dict() if "dropout" in key]:
            setattr(model.config, key, 0.0)  # dropout draws from per-layout random streams
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.set_value(paddle.normal(std=model.config.initializer_range, shape=parameter.shape))
        model.save_pretrained(folder)
    return folder


def run_arguments(root: str, name: str, weights: str, family: str, layers: int, layout: str, *extra: str) -> list:
    """run_pretrain.py's arguments for ``layout`` (a ``LAYOUTS`` key) run from ``weights`` for STEPS steps into
    ``root/name`` (``pretrain.support_matrix.run_arguments``); ``extra`` overrides them."""
    out, cache = os.path.join(root, name), os.path.join(root, "cache")
    return matrix_run_arguments(out, cache, weights, family, layout, *extra, layers=layers)


def layout_command(
    root: str, name: str, weights: str, family: str, layers: int, layout: str, *extra: str, script: str = None
) -> tuple:
    """(command, output_dir, log folder) of ``layout`` (a ``LAYOUTS`` key) run from ``weights`` for STEPS
    steps; ``extra`` overrides the run's arguments. ``script`` replaces run_pretrain.py."""
    nproc = LAYOUTS[layout][0]
    out, logs = os.path.join(root, name), os.path.join(root, f"{name}_logs")
    os.makedirs(logs, exist_ok=True)
    args = run_arguments(root, name, weights, family, layers, layout, *extra)
    if nproc == 1:
        command = python_script(*args) if script is None else [sys.executable, script, *args]
    else:
        command = launch_command(nproc, logs)[:-1] + [script or os.path.join(REPO, "run_pretrain.py"), *args]
    return command, out, logs


def launch(
    root: str, name: str, weights: str, family: str, layers: int, layout: str, *extra: str, script: str = None
) -> str:
    """Run ``layout_command`` to its end; its output_dir.

    Raises:
        AssertionError: the run failed (its log is named).
    """
    command, out, logs = layout_command(root, name, weights, family, layers, layout, *extra, script=script)
    assert run(command, log_path=os.path.join(logs, "launch.log"), timeout=300) == 0, f"{name} failed; see {logs}"
    return out


def resume(root: str, name: str, saved: str, weights: str, family: str, layers: int, layout: str, *extra: str) -> str:
    """Run ``layout_command`` in an output_dir that holds the output_dir ``saved``'s checkpoint-2 and the
    losses it logged before (loss_history.json), so that it resumes there; its output_dir.

    Raises:
        AssertionError: the run failed or did not resume (its log is named).
    """
    command, out, logs = layout_command(root, name, weights, family, layers, layout, *extra)
    os.makedirs(out)
    shutil.copytree(os.path.join(saved, "checkpoint-2"), os.path.join(out, "checkpoint-2"))
    shutil.copy(os.path.join(saved, "loss_history.json"), out)  # the steps before the checkpoint
    log = os.path.join(logs, "launch.log")
    assert run(command, log_path=log, timeout=300) == 0, f"the resume failed; see {logs}"
    with open(log, encoding="utf-8", errors="replace") as f:
        assert "Continuing training from checkpoint" in f.read(), f"it did not resume; see {log}"
    return out


def assert_same_run(out: str, reference: str) -> None:
    """``out`` ended with ``reference``'s losses (every step logged, every digit) and final weights, bit for bit."""
    assert load_train_losses(out) == load_train_losses(reference) and load_train_losses(reference), f"see {out}"
    want, got = final_weights(reference), final_weights(out)
    assert want.keys() == got.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def losses(output_dir: str) -> list:
    """Every step's training loss, every digit (loss_history.json)."""
    history = load_train_losses(output_dir)
    assert [step for step, _ in history] == list(range(1, STEPS + 1)), f"see {output_dir}"
    return [loss for _, loss in history]


def final_weights(output_dir: str) -> dict:
    """``{single-model name: array}`` of the merged weights a run saved at its end (unified checkpoint's
    safetensors, one file or several with an index; a data-parallel run without it: model_state.pdparams)."""
    from safetensors.numpy import load_file

    state = os.path.join(output_dir, "model_state.pdparams")
    if os.path.exists(state):
        import paddle

        return {name: tensor.numpy() for name, tensor in paddle.load(state).items()}

    index = os.path.join(output_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    weights = {}
    for name in files:
        weights.update(load_file(os.path.join(output_dir, name)))
    return weights


def relative_differences(reference: list, other: list) -> list:
    """|other - reference| / |reference|, step by step."""
    return [abs(b - a) / abs(a) for a, b in zip(reference, other)]


def weight_differences(reference: dict, other: dict) -> dict:
    """``{name: |other - reference| / scale}`` (arrays, element by element) of every tensor ``other``
    holds; a tensor's scale is max |w| of the reference's tensor.
    ``other`` may lack names that ``reference`` holds twice (a tied output projection that unified
    checkpoint saves once, as ``pretrain.hf_export`` expects).

    Raises:
        AssertionError: ``other`` holds a name ``reference`` lacks, or lacks one it holds once.
    """
    missing = [name for name in reference if name not in other and not _tied_copy(reference, name)]
    assert not missing and set(other) <= set(reference), (
        f"names differ: {missing[:6]} {sorted(set(other) - set(reference))[:6]}"
    )
    return {name: np.abs(other[name] - reference[name]) / np.abs(reference[name]).max() for name in other}


def assert_golden_weights(what: str, reference: dict, other: dict) -> str:
    """Every element of ``other`` within ``WEIGHT_TOLERANCE`` of ``reference`` (``weight_differences``);
    returns the tensors that differ most, "name max, ..." (three), for the log.

    Raises:
        AssertionError: an element is not, or the names differ; ``what`` and the worst tensors named.
    """
    differences = weight_differences(reference, other)
    worst = sorted(differences, key=lambda name: -differences[name].max())[:3]
    report = ", ".join(f"{name} {differences[name].max():.1e}" for name in worst)
    assert differences[worst[0]].max() <= WEIGHT_TOLERANCE, f"{what}: weights differ: {report}"
    return report


# Key-projection biases: their exact gradient is zero (a bias on the keys adds the same q.b to every score
# of a query's row, which softmax ignores), so their computed gradient is float32 rounding alone.
NOISE_ONLY = ("k_proj.bias",)


def gradient_differences(reference: dict, other: dict) -> dict:
    """{name: max |other - reference| / max |reference|} of each tensor (0 where both are all zero: an
    expert that received no token) but ``NOISE_ONLY``: the key biases' gradients nearly cancel (softmax
    ignores a score shift common to a query's row; RoPE leaves a remainder 1e-3 of the other gradients'
    scale), so float32 rounding is a larger part of them (measured up to 6.9e-7 where the rest reach 5e-7)."""
    assert set(reference) == set(other), sorted(set(reference) ^ set(other))[:6]
    return {
        name: float(np.abs(other[name] - reference[name]).max() / max(np.abs(reference[name]).max(), 1e-30))
        for name in reference
        if not name.endswith(NOISE_ONLY)
    }


def _tied_copy(weights: dict, name: str) -> bool:
    """Whether ``weights[name]`` equals another tensor of ``weights`` element for element (a tied copy)."""
    return any(other != name and np.array_equal(weights[name], value) for other, value in weights.items())


def planned_communication(root: str, name: str, weights: str, family: str, layers: int, layout: str, *extra: str):
    """``planned_volume`` of ``layout`` run as ``run_arguments``."""
    arguments = run_arguments(root, name, weights, family, layers, layout, *extra)
    return planned_volume(arguments, LAYOUTS[layout][0])


def planned_volume(arguments: list, processes: int):
    """What the planner says of run_pretrain.py ``arguments`` launched on ``processes`` CPU processes: (payload
    bytes per optimizer step on one card of each pipeline stage, ``[{group kind: {collective: bytes}}]``, as
    ``pretrain.cpu_comm`` runs the layout (``pretrain.planner.estimate.communication_volume(on_cpu=True)``);
    parameter elements one card of each stage holds), stage 0 first."""
    from pretrain.planner.estimate import communication_volume, layer_and_stages

    workload = _workload(arguments, processes)
    return communication_volume(workload, on_cpu=True), [stage.numel for stage in layer_and_stages(workload)[1]]


def _workload(arguments: list, processes: int):
    """The planner's ``Workload`` of run_pretrain.py ``arguments`` launched on ``processes`` CPU processes (the
    card named is an A100: what is compared with a CPU run does not depend on it)."""
    from pretrain.layout import simulated_launch
    from pretrain.planner import Workload

    with simulated_launch(1, processes):
        plan = resolve_plan(arguments)
    args = (plan.model_config, plan.layout, plan.model_args, plan.data_args, plan.training_args, "A100-SXM4-80GB")
    return Workload.from_arguments(*args)


def planned_held(arguments: list, layout: str) -> list:
    """What the planner says the busiest card of each pipeline stage holds between optimizer steps of
    run_pretrain.py ``arguments`` launched as ``layout`` (a ``LAYOUTS`` key; sharding buffers aligned as on CPU):
    ``[{"parameters": elements, "optimizer": elements}]``, stage 0 first
    (``pretrain.planner.parameters.held_elements``)."""
    from pretrain.planner.estimate import layer_and_stages
    from pretrain.planner.parameters import SHARDING_ALIGNMENT, held_elements

    workload = _workload(arguments, LAYOUTS[layout][0])
    return [
        held_elements(
            stage.tensors,
            workload.layout.sharding_parallel_degree,
            workload.layout.sharding_stage,
            workload.param_bytes,
            SHARDING_ALIGNMENT["cpu"],
            workload.pure_low_precision,
        )
        for stage in layer_and_stages(workload)[1]
    ]


def held_mismatches(output_dir: str, planned: list) -> list:
    """One line per disagreement between the model states each rank of a finished run held between optimizer
    steps (``run_summary.json`` ``per_rank``: ``pretrain.optimizer_chain.held_elements``) and ``planned_held``: no rank
    holds more parameter or optimizer-state elements than the planner's busiest card of its pipeline stage,
    and the busiest rank of each stage holds exactly that."""
    with open(os.path.join(output_dir, "run_summary.json"), encoding="utf-8") as f:
        per_rank = json.load(f)["per_rank"]
    found, busiest = [], {}
    for rank, stage in enumerate(int(stage) for stage in per_rank["pipeline_stage"]):
        for what, figure in (("parameters", "parameter_elements"), ("optimizer", "optimizer_elements")):
            held = int(per_rank[figure][rank])
            busiest[stage, what] = max(busiest.get((stage, what), 0), held)
            if held > planned[stage][what]:
                found.append(f"rank {rank}: holds {held} {what} elements, planned at most {planned[stage][what]}")
    found += [
        f"stage {stage}: its busiest rank holds {held} {what} elements, planned {planned[stage][what]}"
        for (stage, what), held in busiest.items()
        if held < planned[stage][what]
    ]
    return found


PLANNED_KINDS = ("mp", "pp", "dp", "sharding", "sep")  # the groups the planner models
# small tensors the planner does not model that share a collective it does (64 float32 values at most):
# under sharding stage3 the NaN guard's gradient-norm partial sums join the gradients' all-reduces over the
# sharding group (measured 8 bytes), under expert parallelism the routing watch's expert loads and this app's
# agreement collectives join the data-parallel gradient all-reduce (20 to 124 bytes)
SCALAR_BYTES = 256


def communication_mismatches(output_dir: str, planned: list, numel: list, step: int = STEPS) -> list:
    """One line per disagreement between what every rank of a run counted in optimizer step ``step``
    (``pretrain.metrics.comm_volume``) and the planner (``planned_communication``): each collective the
    planner models must be counted to the byte, or with at most SCALAR_BYTES more; a group's count may exceed
    the planner's by scalars it does not model (norms, the pipeline's loss broadcast), at most 1%; each rank
    holds its stage's parameters."""
    import glob

    from pretrain.metrics.comm_volume import FILE_PATTERN, read_volume

    found = []
    ranks = len(glob.glob(os.path.join(output_dir, FILE_PATTERN.format(rank="*"))))
    assert ranks > 1, f"no comm_volume records in {output_dir}"
    for rank in range(ranks):
        record = read_volume(output_dir, rank)
        counted = next(entry["bytes"] for entry in record["steps"] if entry["step"] == step)
        stage = record["stage"]
        if record["parameter_numel"] != numel[stage]:
            found.append(f"rank {rank}: holds {record['parameter_numel']} parameters, planned {numel[stage]}")
        for kind in PLANNED_KINDS:
            plan, count = planned[stage].get(kind, {}), counted.get(kind, {})
            found += [
                f"rank {rank} {kind} {collective}: counted {count.get(collective, 0)}, planned {nbytes:.0f}"
                for collective, nbytes in plan.items()
                if not 0 <= count.get(collective, 0) - nbytes <= SCALAR_BYTES
            ]
            if sum(count.values()) > 1.01 * sum(plan.values()):
                found.append(f"rank {rank} {kind}: counted {count}, planned {plan}")
    return found
