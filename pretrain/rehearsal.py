"""A CPU rehearsal of a GPU recipe: its layout run for a few steps on CPU processes, saved, resumed, exported.

    python run_pretrain.py config/llama/pretrain_argument.json --rehearse true [--key value ...]

The command launches ``python -m paddle.distributed.launch`` itself, twice, on this machine's CPUs (gloo,
``pretrain.cpu_comm``), with the recipe's own degrees, sharding stage, checkpoint format, data and
tokenizer, and the model shrunk; then exports the result with ``pretrain.hf_export`` (what
``tools/export_hf.py`` runs). What changes, and why, is printed one line per key before anything runs:

- GPU-only keys go: bf16/fp16 -> float32 (and ``amp_master_grad`` with them), flash
  attention and the fused CUDA ops off (``pretrain.preflight.GPU_ONLY_FLAGS``; ``use_fused_rms_norm`` only
  when the ``fused_ln`` op cannot run on this CPU);
- the model shrinks: ``hidden_size`` 64, 2 heads per tensor-parallel rank, layers = pipeline x virtual
  stages (at least 2; DeepSeek: its ``first_k_dense_replace`` dense layers and one with experts, rounded up
  to the stages), an MLP twice the width, and so each expert (``moe_intermediate_size``, Qwen2-MoE's
  ``shared_expert_intermediate_size``; as many experts as the recipe's), key/value heads one per
  tensor-parallel rank when the architecture groups them; a ``vocab_size`` the recipe pins above the
  tokenizer's vocabulary becomes that vocabulary padded to 128 rows; ``max_seq_length`` 128;
- the cards: tensor x pipeline (x sep x context) x 2 processes when the recipe shards or replicates over
  more cards (``sharding_parallel_degree: -1`` keeps its meaning, "every card the model degrees leave";
  a pinned degree above 2 becomes 2), x 1 when it pins those degrees to 1;
- the accumulation: 2 micro-batches per step (the pipeline degree under PP), through ``global_batch_size``
  when the recipe pins one;
- the schedule: STEPS steps, a checkpoint every SAVE_EVERY (a user's ``--max_steps`` and ``--save_steps``
  instead, at least one step after the first checkpoint), 1 warm-up step, one evaluation batch at the end,
  a record every step; ``output_dir`` becomes ``<output_dir>_rehearsal`` (its ``run``, ``resumed`` and
  ``hf`` folders are replaced at each rehearsal, which holds the folder's lock, ``pretrain.run_lock``,
  meanwhile: a second rehearsal of the recipe is refused in one line naming the first's pid).

A key given on the command line is never changed. Then the launch's preflight runs in this process
(``pretrain.preflight.check_run`` as on the launch's cards): its problems, one ``[FAIL] preflight:``
line each, end the rehearsal within seconds, before anything is launched. SIGINT (Ctrl-C) and SIGTERM
end the launch under way with every process it started (the launcher, its ranks in sessions of their
own, their DataLoader workers), then the rehearsal with one ``stopped:`` line (status 130 or 143). The
checks, printed as a checklist at the end (exit status 0 when all pass, 1 otherwise, each failure
naming the log to read):

1. the layout ran its steps to the end with finite losses (launch 1, ``run``);
2. every checkpoint was saved and marked complete (``checkpoint_complete.json``);
3. a second launch resumed from the first checkpoint (``resumed``) and its later losses and final weights
   equal the uninterrupted run's bit for bit;
4. the final model exports to a Hugging Face folder (``hf``).

Not rehearsed, and said so: bf16/fp16 numerics, flash attention and fused kernels, NCCL, GPU memory
and speed (``tools/plan.py`` predicts those two).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from pretrain.arguments import config_values, parse_arguments
from pretrain.checkpoint import checkpoint_problem, list_checkpoints
from pretrain.cluster.process_end import kill_process_tree
from pretrain.errors import RunStopped, UserError
from pretrain.fused_ops import fused_ln_problem
from pretrain.hf_export import export, model_folder, saved_tensors
from pretrain.layout import ParallelLayout, simulated_launch
from pretrain.metrics.loss_curves import load_train_losses
from pretrain.model_config import load_local_config, padded_vocab_size
from pretrain.preflight import GPU_ONLY_FLAGS, check_run, first_moe_layer
from pretrain.registry import find_model_size, implementation_for
from pretrain.resolve import resolve_run
from pretrain.run_lock import output_dir_lock
from pretrain.tokenizers import load_tokenizer_from

STEPS, SAVE_EVERY = 4, 2
HIDDEN_SIZE, HEADS_PER_TP_RANK, SEQ_LENGTH = 64, 2, 128
EXPERTS_PER_CHOICE = 2  # a rehearsal's routed experts per expert a token takes (DeepSeek): a real choice each time
DATA_RANKS = 2  # data-parallel x sharding processes of the rehearsal: the smallest that exercises their path
LAUNCH_TIMEOUT = 900  # seconds per launch: a few tiny steps on loaded CPUs, with paddle's start
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # end the launch under way, then the rehearsal
MODEL_DEGREES = ("tensor_parallel_degree", "pipeline_parallel_degree", "sep_parallel_degree", "context_parallel_degree")


@dataclass
class Rehearsal:
    """The rehearsal of one recipe: the launches' arguments and what was changed from the recipe."""

    recipe: str  # the recipe's JSON file
    folder: str  # <output_dir>_rehearsal: run/, resumed/, hf/, logs
    nproc: int  # CPU processes of each launch
    overrides: list  # ["--key", "value", ...]: the changes, then the user's own command-line keys
    changes: list = field(default_factory=list)  # one line per changed key: "key: old -> new (why)"
    steps: int = STEPS  # optimizer steps of launch "run" (a user's --max_steps)
    save_every: int = SAVE_EVERY  # steps between checkpoints (a user's --save_steps); "resumed" starts at the first

    def arguments(self, name: str) -> list:
        """``run_pretrain.py``'s arguments for the launch writing ``<folder>/<name>``."""
        return [self.recipe, *self.overrides, "--output_dir", os.path.join(self.folder, name)]

    def command(self, name: str) -> list:
        """The launch of ``run_pretrain.py`` writing ``<folder>/<name>``, logs in ``<folder>/logs_<name>``."""
        script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "run_pretrain.py")
        return [
            *(sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(self.nproc)),
            *("--log_dir", os.path.join(self.folder, f"logs_{name}"), script, *self.arguments(name)),
        ]


def requested(argv: list) -> bool:
    """Whether ``run_pretrain.py ARGV`` asks for a rehearsal (``--rehearse true``, the last one given)."""
    values = [argv[i + 1] for i, token in enumerate(argv[:-1]) if token == "--rehearse"]
    values += [token.split("=", 1)[1] for token in argv if token.startswith("--rehearse=")]
    return bool(values) and values[-1].lower() in ("true", "1", "yes")


def plan_rehearsal(argv: list) -> Rehearsal:
    """The rehearsal of ``CONFIG.json [--key value ...] --rehearse true``: see the module docstring.

    Raises:
        UserError: the config or a key is invalid (``pretrain.arguments.config_values``), or a ``--max_steps``
            / ``--save_steps`` given on the command line leaves no step after the first checkpoint to resume.
    """
    user = [token for i, token in enumerate(argv[1:]) if not _is_rehearse_token(argv[1:], i)]
    given = {token[2:] for token in user if token.startswith("--")}
    values = config_values([argv[0], *user])
    steps = int(values["max_steps"]) if "max_steps" in given else STEPS
    save_every = int(values["save_steps"]) if "save_steps" in given else SAVE_EVERY
    if not 1 <= save_every < steps:
        raise UserError(
            f"max_steps {steps}, save_steps {save_every}: a rehearsal saves a checkpoint, then resumes from it "
            f"and compares the later steps; give --max_steps above --save_steps (or leave both out: {STEPS} "
            f"steps, a checkpoint every {SAVE_EVERY})"
        )
    architecture = find_model_size(str(values.get("model_name_or_path", "")))
    arch = architecture.config if architecture else {}
    changes: list = []
    overrides: list = []

    def change(key: str, new, why: str) -> None:
        if key in given or values.get(key) == new:
            return
        old = values.get(key) if values.get(key) is not None else arch.get(key)  # model keys: the architecture's
        changes.append(f"{key}: {old} -> {new} ({why})")
        overrides.extend([f"--{key}", str(new).lower() if isinstance(new, bool) else str(new)])

    for key in ("bf16", "fp16"):
        change(key, False, "float32 on CPU: no bf16/fp16 training kernels here; the numerics are not rehearsed")
    if values.get("amp_master_grad") and not any(key in given for key in ("bf16", "fp16")):
        change("amp_master_grad", False, "float32 master gradients need AMP, which is off")
    for key, what in GPU_ONLY_FLAGS:
        change(key, False, f"{what} has GPU kernels only")
    if values.get("use_fused_rms_norm"):
        import paddle

        problem = fused_ln_problem(paddle.CPUPlace())
        if problem:
            change("use_fused_rms_norm", False, f"the fused_ln op cannot run on this CPU: {problem}")

    degree = {key: max(int(values.get(key) or 1), 1) for key in (*MODEL_DEGREES, "virtual_pp_degree")}
    tp, pp, vpp = degree["tensor_parallel_degree"], degree["pipeline_parallel_degree"], degree["virtual_pp_degree"]
    model_ranks = math.prod(degree[key] for key in MODEL_DEGREES)
    data_ranks = 1
    for key in ("sharding_parallel_degree", "data_parallel_degree"):  # -1: every card the others leave
        wanted = int(values.get(key) or 1)
        if wanted > DATA_RANKS:
            change(key, DATA_RANKS, f"{DATA_RANKS} ranks on CPU: the same code path as {wanted}")
        data_ranks *= DATA_RANKS if wanted == -1 or wanted >= DATA_RANKS else 1
    nproc = model_ranks * data_ranks
    changes.append(
        f"cards: {nproc} CPU processes = {model_ranks} per model replica (the recipe's tensor x pipeline x sep x "
        f"context degrees) x {data_ranks} data-parallel/sharding ranks (sharding "
        f"'{values.get('sharding') or 'none'}', sharding_parallel_degree {values.get('sharding_parallel_degree')}): "
        "the recipe's code paths, with fewer data ranks than a GPU node has"
    )
    shrink = "the model shrunk for CPU: the layout, not the model, is rehearsed"
    stages, dense = pp * vpp, first_moe_layer(arch.get("first_k_dense_replace"), arch.get("moe_layer_freq"))
    layers = -(-max(2, dense + 1) // stages) * stages  # DeepSeek: its dense layers, then one with experts
    moe = f"; the first {dense} are dense (first_k_dense_replace), then one with experts" if dense else ""
    change("num_hidden_layers", layers, f"{shrink}; pipeline x virtual stages divide it{moe}")
    change("hidden_size", HIDDEN_SIZE, shrink)
    heads = HEADS_PER_TP_RANK * tp
    change("num_attention_heads", heads, f"{shrink}; {HEADS_PER_TP_RANK} heads per tensor-parallel rank")
    if "num_key_value_heads" in arch:
        grouped = arch["num_key_value_heads"] < arch.get("num_attention_heads", 0)
        change("num_key_value_heads", tp if grouped else heads, f"{shrink}; grouped as the architecture")
    change("intermediate_size", 2 * HIDDEN_SIZE, shrink)
    # the experts and DeepSeek's latent attention: a save gathers every tensor through gloo, whose 30 s limit
    # a checkpoint of all of them outlasted on 2 loaded cores (DeepSeek-V2-Lite: 37 s; V3: 41 s)
    for key in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        if key in arch:
            change(key, 2 * HIDDEN_SIZE, f"{shrink}; each expert as wide as the MLP")
    if arch.get("n_routed_experts"):
        top_k, groups = arch["num_experts_per_tok"], arch.get("n_group") or 1
        why = f"{EXPERTS_PER_CHOICE} x the {top_k} a token takes, over its {groups} expert group(s)"
        change("n_routed_experts", rehearsal_experts(arch), f"{shrink}; {why}")
    for key, rank in (("q_lora_rank", HIDDEN_SIZE), ("kv_lora_rank", HIDDEN_SIZE // 2)):
        if arch.get(key):
            change(key, rank, shrink)
    tokens = _tokenizer_size(values)
    if tokens is not None and values.get("vocab_size") and padded_vocab_size(tokens) < values["vocab_size"]:
        change(
            "vocab_size",
            padded_vocab_size(tokens),
            f"{shrink}; the tokenizer's {tokens} tokens, padded to a multiple of 128 (no id reaches the rest)",
        )
    change("max_seq_length", SEQ_LENGTH, "shorter samples for CPU")

    accumulation = max(2, pp)
    if values.get("global_batch_size"):
        batch = int(values.get("per_device_train_batch_size") or 1) * data_ranks * accumulation
        change("global_batch_size", batch, f"gradient accumulation {accumulation} on {nproc} processes")
    else:
        change("gradient_accumulation_steps", accumulation, "a few micro-batches per step on CPU")
    change("max_steps", steps, "a rehearsal")
    change("save_steps", save_every, f"a checkpoint to resume from at step {save_every}")
    change("warmup_steps", 1, f"the schedule fits {steps} steps")
    change("logging_steps", 1, "a loss for every step")
    if values.get("do_eval"):
        change("eval_steps", steps, "one evaluation, at the end")
        change("eval_iters", 1, "one evaluation batch")
    change("overwrite_output_dir", True, "each rehearsal starts fresh in its own folder")
    folder = f"{str(values.get('output_dir', 'output')).rstrip('/')}_rehearsal"
    changes.append(
        f"output_dir: {values.get('output_dir')} -> {folder}/run, /resumed and /hf (the recipe's is not touched)"
    )
    kept = [token for i, token in enumerate(user) if "--output_dir" not in (token, user[i - 1] if i else "")]
    return Rehearsal(argv[0], folder, nproc, overrides + kept, changes, steps, save_every)


def rehearsal_experts(arch: dict) -> int:
    """Routed experts of a DeepSeek architecture in its rehearsal: ``EXPERTS_PER_CHOICE`` x top-k, spread over its
    ``n_group`` groups so that the ``topk_group`` groups a token may use hold that many (``moe_gate.py``:
    ``_topk_group_limited_greedy`` splits the experts into n_group equal groups), even (expert parallelism over
    ``DATA_RANKS``), at most the architecture's."""
    groups, used_groups = int(arch.get("n_group") or 1), int(arch.get("topk_group") or 1)
    per_group = -(-EXPERTS_PER_CHOICE * arch["num_experts_per_tok"] // used_groups)
    experts = groups * per_group
    while experts % DATA_RANKS:  # one more expert per group keeps the groups equal
        experts += groups
    return min(experts, arch["n_routed_experts"])


def _tokenizer_size(values: dict):
    """Tokens of the run's tokenizer (``tokenizer_name_or_path``, else ``model_name_or_path``); None when it
    does not load (the preflight names why)."""
    try:
        return len(load_tokenizer_from(values.get("tokenizer_name_or_path") or values["model_name_or_path"]))
    except UserError:
        return None


def _is_rehearse_token(tokens: list, i: int) -> bool:
    return tokens[i].startswith("--rehearse") or (i > 0 and tokens[i - 1] == "--rehearse")


def rehearse(argv: list) -> int:
    """Run the rehearsal of ``CONFIG.json [--key value ...] --rehearse true``; print what changed, then the
    checklist; return the exit status (0: every check passed, 1: a check failed, preflight included).

    The rehearsal holds ``<output_dir>_rehearsal`` (``pretrain.run_lock``) from before it empties the folder
    to its end. SIGINT (Ctrl-C) and SIGTERM end the launch under way with every process it started
    (``pretrain.cluster.process_end.kill_process_tree``), then the rehearsal, in one line.

    Raises:
        UserError: under ``paddle.distributed.launch`` (the rehearsal launches its own processes), on a CUDA build
            of paddle (its launcher assigns GPUs: paddle/distributed/launch/context/device.py, ``detect_device``),
            the config is invalid (``plan_rehearsal``), or another rehearsal holds the folder (its pid and host
            named).
        RunStopped: on SIGINT (exit status 130) or SIGTERM (143).
    """
    if os.environ.get("PADDLE_TRAINER_ID") is not None:
        raise UserError(
            "--rehearse true launches its own CPU processes; run it without paddle.distributed.launch: "
            f"python run_pretrain.py {argv[0]} --rehearse true"
        )
    import paddle  # here: the checks above answer without it

    if paddle.is_compiled_with_cuda():
        raise UserError(
            f"--rehearse true needs the CPU build of paddle, and this is paddle {paddle.__version__}'s CUDA build: its "
            "paddle.distributed.launch places the ranks on GPUs (IndexError with more ranks than GPUs) and its ranks "
            "communicate with NCCL, so the CPU layer would not be rehearsed; rehearse from a CPU environment: "
            "python3 -m venv .venv-cpu && .venv-cpu/bin/pip install -r requirements-cpu.txt && .venv-cpu/bin/pip "
            f"install --no-deps -e . && .venv-cpu/bin/python run_pretrain.py {argv[0]} --rehearse true"
        )
    plan = plan_rehearsal(argv)
    _say(f"rehearsal of {plan.recipe} on {plan.nproc} CPU processes; changed from the recipe:")
    for line in plan.changes:
        _say(f"  {line}")
    with output_dir_lock(plan.folder, local_zero=True), _stopped_by_signals(plan):
        for name in ("run", "resumed", "hf", "logs_run", "logs_resumed"):
            shutil.rmtree(os.path.join(plan.folder, name), ignore_errors=True)
        problems = _preflight(plan)
        checks = [(False, f"preflight: {problem}") for problem in problems] or _launch_and_check(plan)
    _say(f"rehearsal of {plan.recipe}: what it checked")
    for passed, line in checks:
        _say(f"  [{'ok' if passed else 'FAIL'}] {line}")
    _say(
        "  not rehearsed: bf16/fp16 numerics, flash attention and fused CUDA kernels, NCCL, GPU memory and speed "
        f"(predicted by tools/plan.py {plan.recipe})"
    )
    return 0 if all(passed for passed, _ in checks) else 1


@contextmanager
def _stopped_by_signals(plan: Rehearsal):
    """Within this context SIGINT and SIGTERM raise ``RunStopped`` (once: a second signal is ignored while
    the launch is being ended); the previous handlers come back after it."""

    def stop(signum, frame):
        for each in STOP_SIGNALS:
            signal.signal(each, signal.SIG_IGN)
        raise RunStopped(
            f"rehearsal of {plan.recipe} stopped by {signal.Signals(signum).name}; no process it launched is "
            f"left, and {plan.folder} holds an incomplete rehearsal (the next one replaces it)",
            128 + signum,
        )

    previous = {each: signal.signal(each, stop) for each in STOP_SIGNALS}
    try:
        yield
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)


def _preflight(plan: Rehearsal) -> list:
    """The preflight problems of launch "run", one line each, found in this process as its ranks would find
    them (``pretrain.preflight.check_run`` under ``pretrain.layout.simulated_launch`` on ``plan.nproc`` cards):
    within seconds, before a launch of several processes (about 30 s) stops on them."""
    with simulated_launch(1, plan.nproc):
        try:
            model_args, data_args, training_args = parse_arguments(plan.arguments("run"))
            layout = ParallelLayout.from_arguments(training_args, 1)
        except UserError as error:  # one line, or a heading and "  - problem" lines (errors.raise_problems)
            lines = str(error).splitlines()
            return [line.strip()[2:] for line in lines[1:]] or lines
    return check_run(resolve_run(model_args, data_args, training_args, layout))


def _launch_and_check(plan: Rehearsal) -> list:
    """Launch "run", then (when it passed) "resumed", and export: the checklist, ``[(passed, line)]``."""
    checks: list = []
    steps, save_every = plan.steps, plan.save_every
    run, resumed, hf = (os.path.join(plan.folder, name) for name in ("run", "resumed", "hf"))
    started = time.time()
    problem = _launch(plan, "run")
    losses = _losses(run) if problem is None else {}
    if problem is None and (
        sorted(losses) != list(range(1, steps + 1)) or not all(map(math.isfinite, losses.values()))
    ):
        problem = f"expected finite losses for steps 1-{steps}, got {losses} ({run}/loss_history.json)"
    checks.append(
        (
            problem is None,
            problem
            or f"layout {_layout_name(run)} ran {steps} steps on {plan.nproc} processes: loss {losses[1]:.4f} -> "
            f"{losses[steps]:.4f} ({time.time() - started:.0f} s)",
        )
    )
    if problem is None:
        checks.append(_saved(run, steps, save_every))
    if not all(passed for passed, _ in checks):
        return checks
    first = os.path.join(run, f"checkpoint-{save_every}")
    shutil.copytree(first, os.path.join(resumed, os.path.basename(first)))
    started = time.time()
    problem = _launch(plan, "resumed", "--overwrite_output_dir", "false")
    checks.append(
        (problem is None, problem) if problem else _resumed_equal(run, resumed, save_every, time.time() - started)
    )
    try:
        summary = export(run, hf)
        checks.append(
            (
                True,
                f"exported to Hugging Face: {hf} ({summary['architecture']}, {summary['total_bytes'] / 1e6:.1f} MB; "
                f"the same as tools/export_hf.py {run} --output {hf})",
            )
        )
    except UserError as error:
        checks.append((False, f"export to Hugging Face failed: {error}"))
    return checks


def _say(line: str) -> None:
    print(f"[rehearse] {line}", flush=True)


def _launch(plan: Rehearsal, name: str, *extra: str):
    """Run the launch ``name`` to its end; None when it succeeded, else one line: its status, its last
    ``error:`` line and the log to read."""
    command = plan.command(name) + list(extra)
    _say(f"launch: {' '.join(command)}")
    logs = os.path.join(plan.folder, f"logs_{name}")
    os.makedirs(logs, exist_ok=True)
    process = None
    try:
        with open(os.path.join(logs, "launch.log"), "w") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        status = process.wait(timeout=LAUNCH_TIMEOUT)
    except BaseException as stop:  # the time limit, or RunStopped (SIGINT, SIGTERM): no process of it is left
        if process is not None:
            kill_process_tree(process.pid)  # the launcher, and its ranks in sessions of their own
            process.wait()
        if not isinstance(stop, subprocess.TimeoutExpired):
            raise
        return f"launch '{name}' did not finish in {LAUNCH_TIMEOUT} s: see {logs}"
    if status == 0:
        return None
    return f"launch '{name}' exited with status {status}: {_last_error(logs)} (see {logs}/workerlog.0)"


def _last_error(logs: str) -> str:
    """The last ``error:`` line (else the last line) of the launch's logs."""
    lines = []
    for name in sorted(os.listdir(logs)):
        with open(os.path.join(logs, name), encoding="utf-8", errors="replace") as f:
            lines += [line.strip() for line in f if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["no output"])[-1]


def _layout_name(output_dir: str) -> str:
    """The layout a run resolved (``TP2PP1SH2SP2DP1``: run_config.json)."""
    with open(os.path.join(output_dir, "run_config.json"), encoding="utf-8") as f:
        return json.load(f)["layout"]["name"]


def _losses(output_dir: str) -> dict:
    """``{step: training loss}`` of a finished run, every digit (loss_history.json)."""
    return dict(load_train_losses(output_dir))


def _saved(run: str, steps: int, save_every: int) -> tuple:
    """(passed, line): every checkpoint of ``run`` (one each ``save_every`` of ``steps``) is complete and verified."""
    folders = [folder for _, folder in list_checkpoints(run)]
    problems = [problem for problem in map(checkpoint_problem, folders) if problem]
    names = ", ".join(os.path.basename(folder) for folder in folders)
    wanted = [os.path.join(run, f"checkpoint-{step}") for step in range(save_every, steps + 1, save_every)]
    if problems or sorted(folders) != sorted(wanted):
        return False, f"checkpoints: expected {len(wanted)} complete ones in {run}, found {names or 'none'}: {problems}"
    return True, f"saved {names}, each complete (checksums verified), and the final model"


def _weights(output_dir: str) -> dict:
    """``{name: array}`` of the final model a run saved, per-rank files merged (``pretrain.hf_export``)."""
    folder = model_folder(output_dir)
    config = load_local_config(folder)
    return dict(saved_tensors(folder, config, implementation_for(config.model_type)))


def _resumed_equal(run: str, resumed: str, save_every: int, seconds: float) -> tuple:
    """(passed, line): the resumed run's losses after checkpoint-``save_every`` and its final weights equal
    ``run``'s."""
    want, got = _losses(run), _losses(resumed)
    later = [step for step in want if step > save_every]
    if [got.get(step) for step in later] != [want[step] for step in later]:
        return False, f"resumed from checkpoint-{save_every}: losses {got} differ from the uninterrupted {want}"
    want_weights, got_weights = _weights(run), _weights(resumed)
    differ = [
        name
        for name in want_weights
        if name not in got_weights or not np.array_equal(want_weights[name], got_weights[name])
    ]
    if differ or set(got_weights) != set(want_weights) or not want_weights:
        return (
            False,
            f"resumed from checkpoint-{save_every}: final weights differ from the uninterrupted run's: {differ[:5]}",
        )
    return True, (
        f"resumed from checkpoint-{save_every} in a second launch ({seconds:.0f} s): losses of steps "
        f"{later[0]}-{later[-1]} and all {len(want_weights)} final weights equal the uninterrupted run's, bit for bit"
    )
