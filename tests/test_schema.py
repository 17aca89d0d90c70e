"""The argument schema (pretrain/schema.py): ranges in field metadata, one generic checker, the help
text and docs/arguments.md generated from them. The bad values themselves: tests/bad_input_table.py."""

import math
import os
from dataclasses import dataclass, field
from typing import Optional

import pytest
from conftest import REPO, load_script

from pretrain.arguments import ARGUMENT_CLASSES, make_parser, parse_arguments
from pretrain.enums import plain
from pretrain.errors import UserError
from pretrain.schema import json_type_problem, parse_range, range_problems, relation_problems, repeated_keys


def test_interval_notation():
    unit = parse_range("[0, 1)")
    assert 0 in unit and 0.999 in unit and 1 not in unit and -1e-9 not in unit
    assert unit.words() == ">= 0 and < 1"
    positive = parse_range("(0, inf)")
    assert 0 not in positive and 1e30 in positive and positive.words() == "> 0"
    assert 5 in parse_range("[1, 5]") and 5.0001 not in parse_range("[1, 5]")
    with pytest.raises(ValueError, match="not interval notation"):
        parse_range("0..1")


def test_a_new_key_with_a_range_is_one_metadata_entry():
    @dataclass
    class SpikeArguments:  # what another feature adds: nothing else to write
        spike_factor: float = field(
            default=3.0, metadata={"help": "Loss / median above which a step spikes.", "range": "(1, inf)"}
        )
        spike_window: Optional[int] = field(
            default=None, metadata={"help": "Steps in the median.", "range": "[1, inf)"}
        )

    assert range_problems((SpikeArguments,), {"spike_factor": 3.0, "spike_window": None}) == []
    assert range_problems((SpikeArguments,), {"spike_factor": 1.0, "spike_window": 0}) == [
        "spike_factor: 1 is out of range (1, inf); give a value > 1",
        "spike_window: 0 is out of range [1, inf); give a value >= 1",
    ]
    assert range_problems((SpikeArguments,), {"spike_factor": math.nan}) == [
        "spike_factor: nan is not a number; give a finite value > 1"
    ]


def test_every_range_in_the_argument_classes_parses_and_holds_its_default():
    from dataclasses import MISSING, fields

    from pretrain.finetune.lora_arguments import FINETUNE_ARGUMENT_CLASSES

    checked = 0
    for cls in {*ARGUMENT_CLASSES, *FINETUNE_ARGUMENT_CLASSES}:
        for spec in fields(cls):
            if "range" in spec.metadata:
                checked += 1
                interval = parse_range(spec.metadata["range"])
                assert spec.default is MISSING or spec.default is None or spec.default in interval, spec.name
    assert checked >= 30


def test_help_shows_each_range():
    help_text = make_parser().format_help()
    assert "Beta1 for AdamW optimizer Range: [0, 1)." in help_text  # paddlenlp's help, our range
    assert "Tokens per training sample. Range: [1, inf)." in " ".join(help_text.split())


@pytest.mark.parametrize("name", ["linear", "cosine", "constant", "constant_with_warmup", "polynomial", "nonsense"])
def test_lr_scheduler_type_is_one_of_the_offered_schedules(name):
    # `run_pretrain.py --help` offers these four; paddlenlp's polynomial is not among pretrain.lr_schedule's
    argv = [os.path.join(REPO, "config", "llama", "pretrain_demo_cpu.json"), "--lr_scheduler_type", name]
    if name in ("linear", "cosine", "constant", "constant_with_warmup"):
        assert str(plain(parse_arguments(argv)[2].lr_scheduler_type)) == name
    else:
        with pytest.raises(UserError, match=f"--lr_scheduler_type: invalid choice: '{name}' \\(choose from"):
            parse_arguments(argv)


def test_json_types():
    assert json_type_problem("do_eval", "false", make_parser()._option_string_actions["--do_eval"].type)
    assert json_type_problem("max_steps", "10", int) and json_type_problem("max_steps", True, int)
    assert json_type_problem("learning_rate", "1e-3", float) and not json_type_problem("learning_rate", 1, float)
    assert not json_type_problem("output_dir", "out", str)


def test_repeated_command_line_keys():
    assert repeated_keys(["--a", "1", "--b=2", "--a=3", "--b", "4", "--c"]) == ["a", "b"]


def test_relations_name_the_key(tmp_path):
    values = dict(learning_rate=1e-3, min_learning_rate=1e-4, lr_scheduler_type="cosine", max_steps=100)
    assert relation_problems({**values, "warmup_steps": 10}, set()) == []
    # the published benchmark cases: 100 steps inside a 2000-step warm-up
    assert relation_problems({**values, "warmup_steps": 2000}, set()) == []
    assert relation_problems({**values, "warmup_steps": 50, "decay_steps": 40}, set())[0].startswith("warmup_steps:")
    assert (
        relation_problems({**values, "warmup_steps": 50, "lr_scheduler_type": "constant", "decay_steps": 40}, set())
        == []
    )
    (line,) = relation_problems({**values, "min_learning_rate": 2e-3}, set())
    assert line.startswith("min_learning_rate: 0.002 is above learning_rate 0.001")


def test_argument_reference_is_generated_from_the_schema():
    load_script("tools/argument_docs.py").main(["--check"])  # UserError when docs/arguments.md is stale


def test_argument_reference_lists_ranges(tmp_path):
    text = load_script("tools/argument_docs.py").main(["--output", str(tmp_path / "arguments.md")])
    assert "| `adam_beta1` | float | 0.9 | [0, 1) |" in text
    assert "| `lora_dropout` | float | 0.05 | [0, 1) |" in text
    assert "| `workers` | int | 1 | [1, inf) |" in text
