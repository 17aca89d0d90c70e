"""The executor of the support matrix's cells (``pretrain.support_matrix``): an executable cell launched on CPU
processes through run_pretrain.py and checked against one process (or its own uninterrupted run).

``Cells(root).run(feature, layout, family)`` runs one cell and returns a line of what it measured, or raises
AssertionError naming what differs. Runs are shared between cells: each (family, layout, arguments) is launched
once per ``Cells`` (the plain run with a checkpoint at step 2 serves the resume, preemption and export cells of
its layout, and each reference serves every layout compared with it). Every run starts from the same initial
weights per family and layer count (``parallel_golden.initial_weights``); a mixture of experts' load-balancing
coefficient is 0 there, since with it a data-parallel run differs from one process by design (the loss is
computed on each rank's tokens: docs/models.md, "Expert parallelism"). The tolerances are the golden runs':
losses within ``LOSS_RTOL`` relative, final weights every element within 1e-6 of the tensor's scale. Every
launched run is also checked for what each rank held: no more parameter or optimizer-state elements than the
planner's busiest card of its pipeline stage, the busiest exactly that (``parallel_golden.held_mismatches``).
"""

import hashlib
import json
import os
import shutil
import signal
import time

import numpy as np
from parallel_golden import (
    assert_golden_weights,
    assert_same_run,
    final_weights,
    held_mismatches,
    initial_weights,
    launch,
    layout_command,
    planned_held,
    resume,
    run_arguments,
)
from tiny_run import kill_group, kill_when, run, spike_norm_figures, start, text_of, wait

from pretrain.checkpoint import MARKER
from pretrain.errors import UserError
from pretrain.metrics.loss_curves import load_train_losses, read_loss_history
from pretrain.registry import FAMILIES
from pretrain.support_matrix import (
    FEATURES,
    LAYOUTS,
    SAVE_AT_2,
    SPIKE_AT,
    debug_size,
    groups,
    resume_partner,
    together_arguments,
)

LOSS_RTOL = 1e-6  # test_parallel_layouts' (float32: only the summation order differs, measured <= 1.1e-7)
HALF_RTOL = 1e-2  # fp16/bf16 losses: 8 and 11 significant bits
STD_RTOL = 0.05  # test_fresh_init_layouts': a split matrix of the debug models holds 8k elements or more
NORM_RTOL = 1e-6  # the spike detector's kept gradient norms against one process's
SUMMARY_EQUAL = ("train_tokens",)  # run_summary.json figures a layout reports as one process does


class Cells:
    """The launched runs of a matrix (or of one test) under ``root``, shared between cells."""

    def __init__(self, root: str):
        self.root, self.runs, self.weights = root, {}, {}

    def forget(self, family: str) -> None:
        """Delete every folder of ``family``'s runs under ``root`` (a family's row writes gigabytes of checkpoints:
        the matrix keeps one family's at a time)."""
        self.runs = {key: out for key, out in self.runs.items() if key[0] != family}
        self.weights = {key: out for key, out in self.weights.items() if key[0] != family}
        for name in os.listdir(self.root):
            rest = name.removeprefix("init_").removeprefix("term").removeprefix("kill").removeprefix("_")
            owners = [owner for owner in FAMILIES if rest.startswith(f"{owner}_")]  # qwen2 and qwen2_moe: the longer
            if owners and max(owners, key=len) == family:
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)

    def initial(self, family: str, layers: int) -> str:
        """The initial weights of ``family`` at ``layers`` layers, load-balancing coefficient 0."""
        key = (family, layers)
        if key not in self.weights:
            folder = initial_weights(os.path.join(self.root, f"init_{family}_{layers}"), family, layers)
            routing = FAMILIES[family].implementation.routing
            if routing is not None:
                path = os.path.join(folder, "config.json")
                with open(path, encoding="utf-8") as f:
                    config = json.load(f)
                with open(path, "w", encoding="utf-8") as f:
                    json.dump({**config, routing.aux_loss_coef_key: 0.0}, f)
            self.weights[key] = folder
        return self.weights[key]

    def launched(self, family: str, layout: str, *extra: str, weights: str = None) -> str:
        """The output_dir of ``layout`` run from the family's initial weights (or ``weights``) with ``extra``,
        launched the first time it is asked for."""
        weights = weights or self.initial(family, LAYOUTS[layout].layers)
        key = (family, layout, weights, extra)
        if key not in self.runs:
            name = _name(f"{family}_{layout}_{hashlib.sha1(repr(key).encode()).hexdigest()[:8]}")
            layers = LAYOUTS[layout].layers
            out = launch(self.root, name, weights, family, layers, layout, *extra)
            planned = planned_held(run_arguments(self.root, name, weights, family, layers, layout, *extra), layout)
            mismatches = held_mismatches(out, planned)
            assert not mismatches, f"{name}: model states held against the planner's: {mismatches}"
            self.runs[key] = out
        return self.runs[key]

    def run(self, feature: str, layout: str, family: str) -> str:
        """Execute the cell; one line of what it measured.

        Raises:
            AssertionError: the cell's invariant does not hold, or a run failed (its log is named).
        """
        special = {
            "fresh initialisation": self._fresh,
            "Hugging Face import": self._hf_import,
            "exact resume after kill -9": self._killed,
            "resume on another layout": self._resumed_elsewhere,
            "SIGTERM preemption": self._preempted,
            "Hugging Face export": self._hf_export,
            "evaluation": self._evaluated,
        }
        return special.get(feature, self._equal)(feature, layout, family)

    def each(self, features: list, layout: str, family: str):
        """Execute the cells of ``features`` (each executable in the layout for the family) in their runs
        (``pretrain.support_matrix.groups``: a group of ``TOGETHER`` in one shared run, one by one when it fails);
        yield ``(feature, line)`` as each ends, the line an AssertionError where the cell failed (whatever it
        raised: a pass of the matrix goes on past a cell that fails in a way no check foresaw)."""
        for group in groups(features):
            lines = {}
            if len(group) > 1:
                try:
                    lines = {
                        f: f"with {len(group) - 1} more: {line}"
                        for f, line in self.together(group, layout, family).items()
                    }
                except Exception as e:  # the cells then run one by one, each saying what failed
                    print(f"together ({', '.join(group)}) | {layout} | {family}: {_said(e)}; one by one", flush=True)
            for feature in group:
                if feature in lines:
                    yield feature, lines[feature]
                    continue
                try:
                    yield feature, self.run(feature, layout, family)
                except Exception as e:  # an AssertionError, a UserError refusing what it asked, ...
                    yield feature, AssertionError(_said(e))

    def together(self, features: tuple, layout: str, family: str) -> dict:
        """Execute the cells of ``features`` (a group of ``pretrain.support_matrix.TOGETHER``, each executable in
        the layout for the family) in one run and the checks that reuse it; ``{feature: line}``.

        The run has every feature's arguments (``together_arguments``) and is compared with its reference run
        with the same; continued from the transformers export of the initial weights where the import is one of
        them (the reference from the paddle weights). Its kill -9 and SIGTERM cells interrupt one run of the
        same command (SIGTERM after step 1, then SIGKILL once checkpoint-2 is complete), which must end as the
        uninterrupted run did, bit for bit; its resume cell resumes its checkpoint-2 on ``resume_partner``.

        Raises:
            AssertionError: an invariant does not hold (the group's cells are then executed one by one).
        """
        arguments, reference_layout = together_arguments(features), LAYOUTS[layout].reference
        weights = self._exported(family, layout) if "Hugging Face import" in features else None
        reference = self.launched(family, reference_layout, *arguments)
        out = self.launched(family, layout, *arguments, weights=weights)
        line = self._compare(" + ".join(features), reference, out, spiked="spike skip" in features)
        if "evaluation" in features:
            line = f"{self._eval_equal(reference, out)}; {line}"
        lines = {feature: line for feature in features}
        if "Hugging Face export" in features:
            lines["Hugging Face export"] = self._exports_equal("Hugging Face export", reference, out)
        if "exact resume after kill -9" in features or "SIGTERM preemption" in features:
            term, kill = "SIGTERM preemption" in features, "exact resume after kill -9" in features
            line = self._interrupted(family, layout, out, arguments, weights, sigterm=term, sigkill=kill)
            lines.update({feature: line for feature in ("exact resume after kill -9", "SIGTERM preemption")})
        if "resume on another layout" in features:
            lines["resume on another layout"] = self._on_partner(family, layout, out, arguments, weights)
        return {feature: lines[feature] for feature in features}

    def _equal(self, feature: str, layout: str, family: str) -> str:
        """The layout with the feature's arguments equals its reference with them."""
        arguments = FEATURES[feature].arguments
        reference = self.launched(family, LAYOUTS[layout].reference, *arguments)
        out = self.launched(family, layout, *arguments)
        half, spiked = "--fp16" in arguments or "--bf16" in arguments, "--loss_spike_policy" in arguments
        return self._compare(feature, reference, out, half, spiked)

    def _compare(self, what: str, reference: str, out: str, half: bool = False, spiked: bool = False) -> str:
        """``out`` equals ``reference``: losses, the summary's ``SUMMARY_EQUAL`` and spike records (``spiked``: one
        process recorded the injected spike), the spike detector's kept gradient norms (the clipped global norm)
        at checkpoint-2 where both saved one, final weights."""
        if out == reference:  # the 1-process column: the run is the reference, its own records checked
            return "the reference run"
        single, parallel = dict(load_train_losses(reference)), dict(load_train_losses(out))
        assert single.keys() == parallel.keys() and single, f"{what}: logged steps {list(parallel)} vs {list(single)}"
        loss = max(abs(parallel[step] - single[step]) / abs(single[step]) for step in single)
        assert loss <= (HALF_RTOL if half else LOSS_RTOL), f"{what}: losses {single} vs {parallel}"
        with open(os.path.join(reference, "run_summary.json"), encoding="utf-8") as f:
            want = json.load(f)
        with open(os.path.join(out, "run_summary.json"), encoding="utf-8") as f:
            got = json.load(f)
        for key in SUMMARY_EQUAL + ("spike_skipped_steps", "rollbacks"):
            assert got.get(key) == want.get(key), f"{what}: {key} {got.get(key)} vs one process's {want.get(key)}"
        if spiked:
            assert want.get("spike_skipped_steps") == [SPIKE_AT] or want.get("rollbacks") == 1, f"{what}: {want}"
        if all(os.path.isdir(os.path.join(run, "checkpoint-2")) for run in (reference, out)):
            kept, norms = spike_norm_figures(reference, 2), spike_norm_figures(out, 2)
            assert np.allclose(norms, kept, rtol=NORM_RTOL, atol=0), f"{what}: detector norms {norms} vs {kept}"
        if half:
            return f"loss {loss:.1e}"
        return f"loss {loss:.1e}; weights {assert_golden_weights(what, final_weights(reference), final_weights(out))}"

    def _base(self, family: str, layout: str) -> str:
        """The layout's plain run, checkpoint at step 2."""
        return self.launched(family, layout, *SAVE_AT_2)

    def _fresh(self, feature: str, layout: str, family: str) -> str:
        arguments, scratch = FEATURES[feature].arguments, debug_size(family)
        reference = final_weights(self.launched(family, LAYOUTS[layout].reference, *arguments, weights=scratch))
        drawn = final_weights(self.launched(family, layout, *arguments, weights=scratch))
        if layout == LAYOUTS[layout].reference:
            return "the reference run"
        assert drawn.keys() <= reference.keys(), sorted(set(drawn) - set(reference))[:6]
        for name, value in drawn.items():
            if value.ndim == 2:
                rows, columns = value.shape[0] // 2, value.shape[1] // 2  # 0: one row or column, no halves
                equal_rows = rows and np.array_equal(value[:rows], value[rows : 2 * rows])
                assert not equal_rows, f"{name}: equal halves (rows)"
                equal_columns = columns and np.array_equal(value[:, :columns], value[:, columns : 2 * columns])
                assert not equal_columns, f"{name}: equal halves (columns)"
            if value.size >= 8192 and reference[name].std() > 0:
                assert abs(value.std() / reference[name].std() - 1) <= STD_RTOL, f"{name}: std {value.std()}"
                # two independent samples' means differ with standard deviation std x sqrt(2 / n): 5 of those (a
                # bound of 4 std / sqrt(n), 2.8 of them, failed DeepSeek-V3's EP2 cell on one expert of rank 1's
                # seed, whose mean left one process's by 2.9 of them)
                spread = reference[name].std() * np.sqrt(2 / value.size)
                mean_gap = abs(value.mean() - reference[name].mean())
                assert mean_gap <= 5 * spread, f"{name}: mean {value.mean()} against {reference[name].mean()}"
        return f"{len(drawn)} tensors drawn as in one process"

    def _hf_import(self, feature: str, layout: str, family: str) -> str:
        imported = self.launched(family, layout, weights=self._exported(family, layout))
        return self._compare(feature, self.launched(family, LAYOUTS[layout].reference), imported)

    def _exported(self, family: str, layout: str) -> str:
        """The transformers export (float32) of the family's initial weights at the layout's layers."""
        return _export(self.initial(family, LAYOUTS[layout].layers))

    def _killed(self, feature: str, layout: str, family: str) -> str:
        return self._interrupted(family, layout, self._base(family, layout), SAVE_AT_2, None, sigkill=True)

    def _resumed_elsewhere(self, feature: str, layout: str, family: str) -> str:
        return self._on_partner(family, layout, self._base(family, layout), SAVE_AT_2, None)

    def _on_partner(self, family: str, layout: str, saved: str, arguments: tuple, weights) -> str:
        """``saved``'s checkpoint-2 (a run of ``layout`` with ``arguments`` from ``weights``, default the initial
        ones) resumed on ``resume_partner(layout)`` with the same arguments ends as ``saved`` did."""
        partner, layers = resume_partner(layout), LAYOUTS[layout].layers
        name = _name(f"{os.path.basename(saved)}_on_{partner}")
        weights = weights or self.initial(family, layers)
        out = resume(self.root, name, saved, weights, family, layers, partner, *arguments)
        return f"on {partner}: " + self._compare("resume on another layout", saved, out)

    def _preempted(self, feature: str, layout: str, family: str) -> str:
        return self._interrupted(family, layout, self._base(family, layout), SAVE_AT_2, None, sigterm=True)

    def _interrupted(
        self, family: str, layout: str, uninterrupted: str, arguments: tuple, weights, sigterm=False, sigkill=False
    ) -> str:
        """The command of ``uninterrupted`` (``layout`` with ``arguments`` from ``weights``, default the initial
        ones) run again in another output_dir: with ``sigterm``, SIGTERM to the launcher once step 1 is logged
        (it saves and stops), then the same command; with ``sigkill``, SIGKILL of every process once
        checkpoint-2 is complete, then the same command. It ends as ``uninterrupted`` did, bit for bit."""
        layers = LAYOUTS[layout].layers
        name = _name(f"{'term' * sigterm}{'kill' * sigkill}_{os.path.basename(uninterrupted)}")
        weights = weights or self.initial(family, layers)
        command, out, logs = layout_command(self.root, name, weights, family, layers, layout, *arguments)
        last = max(step for step, _ in load_train_losses(uninterrupted))
        if sigterm:
            log = os.path.join(logs, "workerlog.0" if LAYOUTS[layout].processes > 1 else "terminated.log")
            process = start(command, log_path=os.path.join(logs, "terminated.log"))
            try:
                deadline = time.monotonic() + 300
                while "] step 1/" not in text_of(log):
                    assert process.poll() is None and time.monotonic() < deadline, f"no step 1 logged; see {logs}"
                    time.sleep(0.01)
                process.send_signal(signal.SIGTERM)
                wait(process, timeout=300)
            finally:
                kill_group(process)
            assert not os.path.exists(os.path.join(out, f"checkpoint-{last}")), f"it did not stop early; see {logs}"
        if sigkill:
            process = start(command, log_path=os.path.join(logs, "killed.log"))
            marker = os.path.join(out, "checkpoint-2", MARKER)
            assert kill_when(process, marker, timeout=300), f"not killed; see {logs}"
            assert not os.path.exists(os.path.join(out, f"checkpoint-{last}")), "killed too late: training had finished"
        assert run(command, log_path=os.path.join(logs, "resumed.log"), timeout=300) == 0, f"restart failed: {logs}"
        assert "Continuing training from checkpoint" in text_of(os.path.join(logs, "resumed.log")), f"see {logs}"
        assert_same_run(out, uninterrupted)
        return "bit-exact"

    def _hf_export(self, feature: str, layout: str, family: str) -> str:
        return self._exports_equal(feature, self._base(family, LAYOUTS[layout].reference), self._base(family, layout))

    @staticmethod
    def _exports_equal(what: str, reference: str, out: str) -> str:
        """The transformers exports of ``out``'s final folder and ``reference``'s within the golden tolerance."""
        tensors = [_safetensors(_export(folder)) for folder in (reference, out)]
        return f"weights {assert_golden_weights(what, *tensors)}"

    def _evaluated(self, feature: str, layout: str, family: str) -> str:
        arguments = FEATURES[feature].arguments
        reference = self.launched(family, LAYOUTS[layout].reference, *arguments)
        out = self.launched(family, layout, *arguments)
        return f"{self._eval_equal(reference, out)}; " + self._compare(feature, reference, out)

    @staticmethod
    def _eval_equal(reference: str, out: str) -> str:
        """``out``'s evaluation losses are ``reference``'s (the same steps, ``LOSS_RTOL``)."""
        want, got = (read_loss_history(os.path.join(o, "loss_history.json"))["eval"] for o in (reference, out))
        assert [s for s, _ in got] == [s for s, _ in want] and want, f"evaluated steps {got} vs {want}"
        worst = max(abs(b - a) / abs(a) for (_, a), (_, b) in zip(want, got))
        assert worst <= LOSS_RTOL, f"eval losses {got} vs {want}"
        return f"eval loss {worst:.1e}"


def _said(error: Exception) -> str:
    """``error``'s message; for anything but a failed check or a refusal, prefixed with its type."""
    return str(error) if isinstance(error, (AssertionError, UserError)) else f"{type(error).__name__}: {error}"


def _name(text: str) -> str:
    """``text`` as a folder name (no spaces, plus signs or commas)."""
    return text.replace(" ", "_").replace("+", "_").replace(",", "")


def _export(folder: str) -> str:
    """``folder``'s transformers export (float32, no tokenizer) beside it, written the first time."""
    from pretrain.hf_export import export

    exported = f"{folder}_hf"
    if not os.path.isdir(exported):
        export(folder, exported, dtype="float32", tokenizer=False)
    return exported


def _safetensors(folder: str) -> dict:
    """``{name: array}`` of every safetensors file in ``folder``."""
    from safetensors.numpy import load_file

    tensors = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(folder, name)))
    return tensors
