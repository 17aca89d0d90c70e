"""The argument schema: each key's type and range in its dataclass field, relations checked explicitly.

A key's range is one entry of its field's metadata, in interval notation::

    max_seq_length: int = field(default=1024, metadata={"help": "Tokens per training sample.", "range": "[1, inf)"})

``[`` and ``]`` include the bound, ``(`` and ``)`` exclude it; ``inf`` is no bound (a float key
never takes nan or inf, whatever its range). A key that
paddlenlp's ``TrainingArguments`` defines gets its range by being declared again with ``ranged``,
which copies paddlenlp's default and help and adds the range (one line in ``PreTrainingArguments``).
One generic checker (``range_problems``) reads every range, so a value is valid in one place only;
the ``--help`` text (``help_with_range``) and docs/arguments.md (``reference_markdown``, written by
``tools/argument_docs.py``) are generated from the same metadata. Besides the ranges, a JSON value
must have its key's JSON type (``json_type_problem``: ``"false"`` is a string, not a boolean); a
key given several times on the command line takes its last value (``repeated_keys`` finds them).

What depends on several keys is not declarative: ``relation_problems`` checks each relation
explicitly, one line each naming the key and the fix (min_learning_rate <= learning_rate, the
warm-up against the decay, an accumulation given with a global batch, an ``output_dir`` that is
empty or a file, a ``logging_dir`` that is a file).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import typing
from typing import Any, NamedTuple, Optional

RANGE = re.compile(r"^\s*([\[(])\s*([^,\s]+)\s*,\s*([^,\s]+)\s*([\])])\s*$")
SCHEDULES_WITH_DECAY = ("linear", "cosine")


class Interval(NamedTuple):
    """A range of numbers; a bound of None is no bound."""

    low: Optional[float]
    high: Optional[float]
    low_closed: bool
    high_closed: bool
    text: str  # as written in the metadata, e.g. "[0, 1)"

    def __contains__(self, value) -> bool:
        if self.low is not None and (value < self.low or (value == self.low and not self.low_closed)):
            return False
        if self.high is not None and (value > self.high or (value == self.high and not self.high_closed)):
            return False
        return True

    def words(self) -> str:
        """The range for a person, e.g. ``>= 1``, ``>= 0 and < 1``."""
        parts = []
        if self.low is not None:
            parts.append(f"{'>=' if self.low_closed else '>'} {_number(self.low)}")
        if self.high is not None:
            parts.append(f"{'<=' if self.high_closed else '<'} {_number(self.high)}")
        return " and ".join(parts) or "any number"


def _number(value) -> str:
    """A bound or value as written: whole numbers without a decimal point or exponent."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e16 else f"{value:g}"


def parse_range(text: str) -> Interval:
    """``"[0, 1)"`` as an ``Interval``; ``inf``/``-inf`` (or an empty side) mean no bound.

    Raises:
        ValueError: ``text`` is not interval notation (a mistake in a field's metadata).
    """
    match = RANGE.match(text)
    if not match:
        raise ValueError(f"range {text!r} is not interval notation such as '[0, 1)'")
    opening, low, high, closing = match.groups()

    def bound(word: str) -> Optional[float]:
        return None if word.lstrip("+-") == "inf" else float(word)

    return Interval(bound(low), bound(high), opening == "[", closing == "]", text.strip())


def field_range(spec: dataclasses.Field) -> Optional[Interval]:
    """The ``Interval`` of a field's ``"range"`` metadata, or None when it has none."""
    text = spec.metadata.get("range")
    return parse_range(text) if text else None


def redeclared(parent, name: str, **metadata) -> Any:  # a dataclasses.Field, typed as its value
    """A field that redeclares ``parent``'s field ``name`` (default and help kept) with ``metadata`` added,
    e.g. argparse's ``choices``. For the keys of paddlenlp's ``TrainingArguments``, in a subclass::

        lr_scheduler_type: str = redeclared(TrainingArguments, "lr_scheduler_type", choices=("linear", "cosine"))
    """
    inherited = parent.__dataclass_fields__[name]
    kept = {key: getattr(inherited, key) for key in ("default", "default_factory") if _given(getattr(inherited, key))}
    return dataclasses.field(**kept, metadata={**inherited.metadata, **metadata})


def ranged(parent, name: str, range_text: str, **metadata) -> Any:  # a dataclasses.Field, typed as its value
    """``redeclared`` with ``"range"`` added, e.g. ``ranged(TrainingArguments, "learning_rate", "[0, inf)")``."""
    return redeclared(parent, name, **metadata, range=range_text)


def _given(value) -> bool:
    return value is not dataclasses.MISSING


def help_with_range(spec: dataclasses.Field) -> str:
    """A field's help text, with its range appended when it has one (the ``--help`` text and the docs)."""
    text = spec.metadata.get("help", "")
    interval = field_range(spec)
    return f"{text} Range: {interval.text}." if interval else text


def value_problem(name: str, value, interval: Optional[Interval]) -> Optional[str]:
    """Why ``value`` is not valid for key ``name`` of range ``interval`` (None: it is), one line with the fix.

    None is always valid (it means "unset" for Optional keys); a float must be finite.
    """
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and math.isnan(value):
        return f"{name}: nan is not a number; give a finite value" + (f" {interval.words()}" if interval else "")
    if isinstance(value, float) and math.isinf(value):
        return f"{name}: {value} is not finite; give a finite value" + (f" {interval.words()}" if interval else "")
    if interval is not None and value not in interval:
        return f"{name}: {_number(value)} is out of range {interval.text}; give a value {interval.words()}"
    return None


def range_problems(classes: tuple, values: dict, prefix: str = "") -> list:
    """The problems of ``values`` (key -> value, e.g. a parsed namespace's ``vars``) against the
    ranges and finiteness of every field of ``classes``, one line each, in field order, each naming the
    key after ``prefix`` (``--`` for a tool's flags)."""
    problems, seen = [], set()
    for cls in classes:
        for spec in dataclasses.fields(cls):
            if spec.name in seen or spec.name not in values:
                continue
            seen.add(spec.name)
            problem = value_problem(prefix + spec.name, values[spec.name], field_range(spec))
            if problem:
                problems.append(problem)
    return problems


def json_type_problem(key: str, value, parse_type) -> Optional[str]:
    """Why a JSON ``value`` has the wrong JSON type for a key that argparse parses with ``parse_type``
    (``int``, ``float``, paddlenlp's ``strtobool``, ``str``, ...), or None. A string such as ``"false"`` or
    ``"10"`` is refused for a boolean or a number: JSON has those types, and a quoted one is a mistake
    (``"false"`` reads as true in Python); a number or boolean for a text key (``"output_dir": 5``) too."""
    kind = getattr(parse_type, "__name__", "")
    if kind == "strtobool" and not isinstance(value, bool):
        return f"key '{key}' = {value!r} is not a JSON boolean; write true or false without quotes"
    if parse_type is int and (isinstance(value, bool) or not isinstance(value, int)):
        return f"key '{key}' = {value!r} is not a JSON integer; write a whole number without quotes"
    if parse_type is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return f"key '{key}' = {value!r} is not a JSON number; write a number without quotes"
    if parse_type is str and isinstance(value, (bool, int, float)):
        return f"key '{key}' = {json.dumps(value)} is not a JSON string; write it in quotes if it is meant"
    return None


def repeated_keys(tokens: list) -> list:
    """The ``--key`` (or ``--key=value``) options given more than once in ``tokens``, in order of repetition."""
    seen, repeated = set(), []
    for token in tokens:
        if token.startswith("--"):
            key = token[2:].split("=", 1)[0]
            if key in seen and key not in repeated:
                repeated.append(key)
            seen.add(key)
    return repeated


def relation_problems(values: dict, given: set) -> list:
    """Problems of keys that are valid alone but contradict each other, one line each.

    Args:
        values: every key's parsed value (before paddlenlp's ``__post_init__`` rewrites any).
        given: the keys the JSON file or the command line set (a default contradicts nothing).
    """
    problems = []
    lr, min_lr = values.get("learning_rate"), values.get("min_learning_rate")
    if lr is not None and min_lr is not None and min_lr > lr:
        problems.append(
            f"min_learning_rate: {min_lr:g} is above learning_rate {lr:g}, so the decay would raise the rate; "
            f"give a min_learning_rate <= {lr:g} (e.g. a tenth of it)"
        )
    problems += _warmup_problems(values)
    accumulation = values.get("gradient_accumulation_steps")
    if "global_batch_size" in given and "gradient_accumulation_steps" in given and accumulation != 1:
        problems.append(
            f"gradient_accumulation_steps: {accumulation} is set together with "
            f"global_batch_size {values.get('global_batch_size')}, which derives it from the card count; keep one"
        )
    if "output_dir" in values and not (values["output_dir"] or "").strip():
        problems.append("output_dir: empty; give the folder the run writes to, e.g. output/my_run")
    for key in ("output_dir", "logging_dir"):  # a logging_dir under a file: VisualDL would log nothing, silently
        file = file_on_path(values[key]) if (values.get(key) or "").strip() else None
        if file:
            problems.append(f"{key}: {file} is a file, not a folder; give a folder path (new or existing)")
    return problems


def file_on_path(folder: str) -> Optional[str]:
    """``folder`` or the nearest of its parents that exists, when that is a file (not a folder), else None."""
    existing = os.path.abspath(folder)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    return None if os.path.isdir(existing) else existing


def _warmup_problems(values: dict) -> list:
    """A warm-up that ends at or after the decay while the run goes on past it: the rate would jump from
    learning_rate to min_learning_rate at the warm-up's end. A run that ends inside its warm-up (the
    published benchmark cases: 100 steps of a 2000-step warm-up) is fine."""
    schedule = str(values.get("lr_scheduler_type", ""))
    max_steps, warmup = values.get("max_steps"), values.get("warmup_steps") or 0
    if schedule not in SCHEDULES_WITH_DECAY or not max_steps or max_steps <= 0 or warmup <= 0:
        return []
    decay = values.get("decay_steps") or max_steps
    if warmup >= decay and max_steps > warmup:
        return [
            f"warmup_steps: {warmup} warm-up steps reach past the decay's end (decay_steps {decay}) and the run goes "
            f"on to step {max_steps}: the rate would jump from learning_rate to min_learning_rate at step {warmup}; "
            f"give warmup_steps < {decay} or raise decay_steps"
        ]
    return []


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def reference_markdown(groups: list) -> str:
    """docs/arguments.md: for each ``(title, classes)`` of ``groups``, a table of every key with its
    type, default, range (or choices) and help (each key once, under the first group that has it)."""
    lines = [
        "# Argument reference",
        "",
        "Generated from the argument dataclasses by `python tools/argument_docs.py` (do not edit by hand):",
        "a key's range is its field's `range` metadata (`pretrain/schema.py`), or its `choices`, checked before",
        "anything runs; `[`/`]` include the bound, `(`/`)` exclude it. Relations between keys are listed in",
        "`pretrain.schema.relation_problems` and `pretrain.preflight`.",
    ]
    for title, classes in groups:
        lines += ["", f"## {title}", "", "| key | type | default | range | help |", "|---|---|---|---|---|"]
        seen = set()
        for cls in classes:
            hints = _type_names(cls)
            for spec in dataclasses.fields(cls):
                if spec.name in seen or not spec.init:
                    continue
                seen.add(spec.name)
                default = spec.default if _given(spec.default) else "(required)"
                if _given(spec.default_factory):
                    default = spec.default_factory()  # type: ignore[operator]  # mypy does not narrow MISSING away
                row = (f"`{spec.name}`", hints[spec.name], default, _allowed(spec))
                lines.append("| " + " | ".join(_cell(c) for c in (*row, spec.metadata.get("help", ""))) + " |")
    return "\n".join(lines) + "\n"


def _allowed(spec: dataclasses.Field) -> str:
    """The range column of a key: its interval, or its choices (``one of a, b``), or nothing."""
    interval, choices = field_range(spec), spec.metadata.get("choices")
    return interval.text if interval else f"one of {', '.join(map(str, choices))}" if choices else ""


def _type_names(cls) -> dict:
    hints = typing.get_type_hints(cls)
    return {
        name: hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
        for name, hint in hints.items()
    }
