"""tools/eval_mmlu.py: MMLU CSVs in, the few-shot prompt, next-token scoring of " A".." D", accuracy out.

A small MMLU-format set is written here (two subjects; fields with commas, quotes and newlines).
A scripted model answers a chosen letter for each test question, so the accuracy can be computed
by hand; it also puts a larger logit on a token that is not a choice, which must be ignored.
A real tiny model then runs through the command line on the same files.
"""

import csv
import json
import os
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from conftest import REPO, load_script
from tiny_finetune import pretrain_tiny_model

from pretrain.errors import UserError
from pretrain.finetune.mmlu import build_prompt, choice_token_ids, evaluate_mmlu, read_questions
from pretrain.tokenizers import load_tokenizer_from

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

DEV = [
    ["What is closest to the Sun?", "Mercury", "Venus", "Earth", "Mars", "A"],
    ['Which is a "gas giant"?', "Mars", "Jupiter", "Venus", "Mercury", "B"],
    ["How many moons has Mars?", "0", "1", "2", "3", "C"],
    ["Which planet has rings, visibly?", "Mars", "Venus", "Earth", "Saturn", "D"],
    ["The Sun is a\nstar of type", "G", "O", "M", "B", "A"],
]
SUBJECTS = {
    "astronomy": [
        ["What orbits the Earth?", "The Moon", "Mars", "The Sun", "Venus", "A"],
        ["Largest planet, by mass?", "Earth", "Jupiter", "Mars", "Venus", "B"],
        ["Which is a dwarf planet?", "Earth", "Mars", "Pluto", "Venus", "C"],
        ["Red planet, in one word?", "Venus", "Earth", "Saturn", "Mars", "D"],
    ],
    "high_school_biology": [
        ["Where is DNA kept, mostly?", "Wall", "Ribosome", "Nucleus", "Vacuole", "C"],
        ["What do plants make by photosynthesis?", "Glucose", "Salt", "Iron", "Lead", "A"],
    ],
}
# The scripted model's answer to each test question, subject by subject (sorted), row by row.
SCRIPT = {"astronomy": "ABDD", "high_school_biology": "CB"}
# By hand: astronomy A=A, B=B, D!=C, D=D -> 3/4; biology C=C, B!=A -> 1/2.
# Overall (micro): 4 / 6; macro: (0.75 + 0.5) / 2 = 0.625.


def write_csv(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)


@pytest.fixture(scope="module")
def mmlu_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("mmlu")
    for subject, rows in SUBJECTS.items():
        write_csv(str(root / "dev" / f"{subject}_dev.csv"), DEV)
        write_csv(str(root / "test" / f"{subject}_test.csv"), rows)
    return str(root)


@pytest.fixture(scope="module")
def tokenizer(demo_dir):
    return load_tokenizer_from(os.path.join(REPO, "data", "demo", "tokenizer"))


class ScriptedLM(paddle.nn.Layer):
    """A causal LM stand-in: at the last position, logit 5 on the scripted letter's token, 9 on a
    token that is no choice, 0 elsewhere; it records every prompt it is given."""

    def __init__(self, vocab_size: int, choice_ids: list, answers: str, distractor: int):
        super().__init__()
        self.config = SimpleNamespace(max_position_embeddings=4096)
        self.vocab_size, self.choice_ids, self.answers, self.distractor = vocab_size, choice_ids, answers, distractor
        self.prompts = []

    def forward(self, input_ids, return_dict=True):
        self.prompts.append(input_ids.numpy()[0].tolist())
        logits = np.zeros([1, input_ids.shape[1], self.vocab_size], dtype="float32")
        letter = self.answers[len(self.prompts) - 1]
        logits[0, -1, self.choice_ids["ABCD".index(letter)]] = 5.0
        logits[0, -1, self.distractor] = 9.0
        return SimpleNamespace(logits=paddle.to_tensor(logits))


def scripted_model(tokenizer):
    choice_ids = choice_token_ids(tokenizer)
    distractor = tokenizer("the", add_special_tokens=False)["input_ids"][-1]
    assert distractor not in choice_ids
    return ScriptedLM(len(tokenizer), choice_ids, "".join(SCRIPT[s] for s in sorted(SCRIPT)), distractor)


def test_csv_fields_with_commas_quotes_and_newlines_survive(mmlu_dir):
    questions = read_questions(os.path.join(mmlu_dir, "dev", "astronomy_dev.csv"))
    assert questions[1].question == 'Which is a "gas giant"?' and questions[4].question == "The Sun is a\nstar of type"
    assert questions[2].options == ("0", "1", "2", "3") and questions[2].answer == "C"


def test_accuracy_equals_the_hand_computation(mmlu_dir, tokenizer):
    result = evaluate_mmlu(scripted_model(tokenizer), tokenizer, mmlu_dir, shots=5, max_length=4096)
    astronomy, biology = result["subjects"]["astronomy"], result["subjects"]["high_school_biology"]
    assert (astronomy["correct"], astronomy["questions"], astronomy["accuracy"]) == (3, 4, 0.75)
    assert (biology["correct"], biology["questions"], biology["accuracy"]) == (1, 2, 0.5)
    assert astronomy["predictions"] == "ABDD" and biology["predictions"] == "CB"  # the distractor never wins
    assert (result["correct"], result["questions"]) == (4, 6)
    assert result["accuracy"] == pytest.approx(4 / 6) and result["macro_accuracy"] == pytest.approx(0.625)


def test_the_prompt_is_hendrycks_few_shot_format(mmlu_dir, tokenizer):
    model = scripted_model(tokenizer)
    evaluate_mmlu(model, tokenizer, mmlu_dir, shots=2, max_length=4096, subjects=["astronomy"])
    expected = (
        "The following are multiple choice questions (with answers) about astronomy.\n\n"
        "What is closest to the Sun?\nA. Mercury\nB. Venus\nC. Earth\nD. Mars\nAnswer: A\n\n"
        'Which is a "gas giant"?\nA. Mars\nB. Jupiter\nC. Venus\nD. Mercury\nAnswer: B\n\n'
        "What orbits the Earth?\nA. The Moon\nB. Mars\nC. The Sun\nD. Venus\nAnswer:"
    )
    assert model.prompts[0] == tokenizer(expected)["input_ids"]
    assert len(model.prompts) == 4


def test_long_prompts_drop_shots_to_fit(mmlu_dir, tokenizer):
    question = read_questions(os.path.join(mmlu_dir, "test", "astronomy_test.csv"))[0]
    dev = read_questions(os.path.join(mmlu_dir, "dev", "astronomy_dev.csv"))
    two_shot = len(tokenizer(build_prompt("astronomy", dev[:2], question))["input_ids"])
    model = scripted_model(tokenizer)
    result = evaluate_mmlu(model, tokenizer, mmlu_dir, shots=5, max_length=two_shot, subjects=["astronomy"])
    assert result["subjects"]["astronomy"]["min_shots_used"] <= 2
    assert max(len(prompt) for prompt in model.prompts) <= two_shot


def test_bad_answer_is_named(tmp_path):
    write_csv(str(tmp_path / "test" / "x_test.csv"), [["q", "a", "b", "c", "d", "E"]])
    with pytest.raises(UserError, match="x_test.csv: row 1 must be question, A, B, C, D, answer"):
        read_questions(str(tmp_path / "test" / "x_test.csv"))


def test_command_line_prints_and_writes_the_hand_computed_accuracy(mmlu_dir, tokenizer, monkeypatch, capsys, tmp_path):
    tool = load_script("tools/eval_mmlu.py")
    monkeypatch.setattr(tool, "load_model", lambda path, lora_path: scripted_model(tokenizer))
    monkeypatch.setattr(tool, "load_tokenizer_from", lambda path: tokenizer)
    output = str(tmp_path / "mmlu.json")
    tool.main(["unused", "--data_dir", mmlu_dir, "--shots", "5", "--output", output])
    printed = capsys.readouterr().out
    assert "astronomy" in printed and "    3 /     4 = 0.7500" in printed
    assert "    4 /     6 = 0.6667; macro average over 2 subjects 0.6250 (5-shot)" in printed
    with open(output) as f:
        assert json.load(f)["subjects"]["high_school_biology"]["predictions"] == "CB"


def test_a_real_model_from_disk(mmlu_dir, tmp_path_factory, tokenizer, capsys):
    """A tiny pretrained model through the command line: the counts agree with its predictions and
    the answers in the CSVs (its accuracy itself is chance)."""
    model_dir = pretrain_tiny_model(str(tmp_path_factory.mktemp("tiny_mmlu")), steps=5)
    output = str(tmp_path_factory.mktemp("out") / "mmlu.json")
    load_script("tools/eval_mmlu.py").main([model_dir, "--data_dir", mmlu_dir, "--shots", "5", "--output", output])
    with open(output) as f:
        result = json.load(f)
    total = 0
    for subject, rows in SUBJECTS.items():
        scores = result["subjects"][subject]
        correct = sum(p == row[5] for p, row in zip(scores["predictions"], rows))
        assert len(scores["predictions"]) == len(rows) and set(scores["predictions"]) <= set("ABCD")
        assert scores["correct"] == correct and scores["accuracy"] == correct / len(rows)
        total += correct
    assert result["correct"] == total and result["accuracy"] == total / 6


def test_an_empty_csv_is_named_before_any_question_is_scored(mmlu_dir, tokenizer, tmp_path):
    import shutil

    data_dir = str(tmp_path / "mmlu")
    shutil.copytree(mmlu_dir, data_dir)
    open(os.path.join(data_dir, "test", "high_school_biology_test.csv"), "w").close()  # the second subject
    model = scripted_model(tokenizer)
    with pytest.raises(UserError, match=r"high_school_biology_test.csv holds no question; write one row question"):
        evaluate_mmlu(model, tokenizer, data_dir, shots=5, max_length=4096)
    assert model.prompts == []  # astronomy was not scored first


def test_an_unknown_subject_is_named(mmlu_dir, tokenizer):
    with pytest.raises(UserError, match=r"--subjects astrology: .*astrology_test.csv does not exist"):
        evaluate_mmlu(scripted_model(tokenizer), tokenizer, mmlu_dir, 5, 4096, subjects=["astronomy", "astrology"])


@pytest.mark.parametrize(
    "output, message",
    [(".", "is a folder; give a file name for the JSON"), ("no/mmlu.json", "is not an existing folder; create it")],
)
def test_a_bad_output_is_refused_before_the_model_loads(mmlu_dir, monkeypatch, tmp_path, output, message):
    tool = load_script("tools/eval_mmlu.py")

    def fail(*args):
        raise AssertionError("loaded before --output was checked")

    monkeypatch.setattr(tool, "load_model", fail)
    monkeypatch.setattr(tool, "load_tokenizer_from", fail)
    with pytest.raises(UserError, match=f"--output {tmp_path / output}.* {message}"):
        tool.main(["unused", "--data_dir", mmlu_dir, "--output", str(tmp_path / output)])
    assert os.listdir(tmp_path) == []
