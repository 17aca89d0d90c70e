"""MMLU few-shot accuracy of a causal LM, scored the way Hendrycks et al. score it.

Data layout (the MMLU release, github.com/hendrycks/test): ``<data_dir>/dev/<subject>_dev.csv``
(5 worked examples per subject, the few-shot prompt) and ``<data_dir>/test/<subject>_test.csv``
(the questions scored); each CSV row, without a header, is ``question, A, B, C, D, answer`` with
``answer`` one of A-D.

Prompt (Hendrycks' ``evaluate.py``): "The following are multiple choice questions (with answers)
about <subject with spaces>.\\n\\n", then ``shots`` dev examples, each "question\\nA. ..\\nB. ..\\nC.
..\\nD. ..\\nAnswer: X\\n\\n", then the test question ending in "Answer:". When the prompt is longer
than ``max_length`` tokens, shots are dropped (the last first) until it fits.

Score: one forward pass; the prediction is whichever of the tokens " A", " B", " C", " D" (each
must be one token after "Answer:") has the largest next-token logit at the prompt's last
position; other tokens are ignored. Accuracy per subject = correct / questions; ``accuracy`` is
over all questions (micro average, Hendrycks' "average accuracy"), ``macro_accuracy`` the mean of
the subjects'.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass

import numpy as np
import paddle

from pretrain.errors import UserError

CHOICES = ("A", "B", "C", "D")


@dataclass(frozen=True)
class Question:
    """One MMLU row: the question, its four options (A-D) and the correct letter."""

    question: str
    options: tuple
    answer: str


def read_questions(path: str) -> list:
    """The questions of one MMLU CSV (no header; ``question, A, B, C, D, answer``).

    Raises:
        UserError: the file is not UTF-8 (the message names file and line), a row has not 6 fields or
            its answer is not A-D (the message names file and row), or the file holds no row.
    """
    with open(path, "rb") as f:
        raw = f.read()  # whole, to name the line of a byte that is not UTF-8 (one subject: a few MB at most)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise UserError(
            f"{path}:{line}: not UTF-8 (byte {raw[e.start]:#04x}); re-encode the file (e.g. iconv -t UTF-8)"
        ) from None
    questions = []
    with io.StringIO(text, newline="") as f:
        for row_number, row in enumerate(csv.reader(f), 1):
            if len(row) != 6 or row[5].strip() not in CHOICES:
                raise UserError(
                    f"{path}: row {row_number} must be question, A, B, C, D, answer (one of A-D), got {row!r:.80}"
                )
            questions.append(Question(row[0], tuple(row[1:5]), row[5].strip()))
    if not questions:
        raise UserError(f"{path} holds no question; write one row question, A, B, C, D, answer per question")
    return questions


def list_subjects(data_dir: str) -> list:
    """Subjects with a ``test/<subject>_test.csv`` in ``data_dir``, sorted.

    Raises:
        UserError: no test folder or no test CSV.
    """
    test_dir = os.path.join(data_dir, "test")
    names = sorted(os.listdir(test_dir)) if os.path.isdir(test_dir) else []
    subjects = [name[: -len("_test.csv")] for name in names if name.endswith("_test.csv")]
    if not subjects:
        raise UserError(f"--data_dir {data_dir}: no test/<subject>_test.csv found; point it at the MMLU data folder")
    return subjects


def format_question(question: Question, with_answer: bool) -> str:
    """'question\\nA. ..\\nB. ..\\nC. ..\\nD. ..\\nAnswer:' (+ ' X\\n\\n' with the answer)."""
    text = question.question + "".join(f"\n{letter}. {option}" for letter, option in zip(CHOICES, question.options))
    return text + "\nAnswer:" + (f" {question.answer}\n\n" if with_answer else "")


def build_prompt(subject: str, shots: list, question: Question) -> str:
    """The header, the worked ``shots`` and the unanswered ``question`` (see the module docstring)."""
    header = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
    return header + "".join(format_question(shot, True) for shot in shots) + format_question(question, False)


def choice_token_ids(tokenizer) -> list:
    """Token ids of " A", " B", " C", " D" as they follow "Answer:".

    Raises:
        UserError: the tokenizer does not turn "Answer: X" into "Answer:"'s tokens plus one token.
    """
    stem = tokenizer("Answer:", add_special_tokens=False)["input_ids"]
    ids = []
    for letter in CHOICES:
        full = tokenizer(f"Answer: {letter}", add_special_tokens=False)["input_ids"]
        if full[: len(stem)] != stem or len(full) != len(stem) + 1:
            raise UserError(
                f"the tokenizer splits ' {letter}' after 'Answer:' into {len(full) - len(stem)} tokens; "
                "next-token scoring needs one token per choice"
            )
        ids.append(full[-1])
    return ids


def prompt_ids(tokenizer, subject: str, dev: list, shots: int, question: Question, max_length: int) -> tuple:
    """(token ids, shots used): the prompt with up to ``shots`` dev examples, fewer if it exceeds ``max_length``.

    Raises:
        UserError: even the zero-shot prompt is longer than ``max_length`` tokens.
    """
    for used in range(min(shots, len(dev)), -1, -1):
        ids = tokenizer(build_prompt(subject, dev[:used], question))["input_ids"]
        if len(ids) <= max_length:
            return ids, used
    raise UserError(
        f"a {subject} test question alone is {len(ids)} tokens, longer than max_length {max_length}; raise it"
    )


@paddle.no_grad()
def choice_logits(model, ids: list, choice_ids: list) -> np.ndarray:
    """The next-token logits of ``choice_ids`` after the prompt ``ids``: float32 [4]."""
    output = model(input_ids=paddle.to_tensor([ids], dtype="int64"), return_dict=True)
    return output.logits[0, -1].astype("float32").numpy()[choice_ids]


def evaluate_mmlu(model, tokenizer, data_dir: str, shots: int, max_length: int, subjects=None) -> dict:
    """Few-shot MMLU accuracy of ``model`` on ``data_dir``'s test questions (see the module docstring).

    Args:
        subjects: the subjects to score; default every one with a test CSV.

    Returns:
        ``{"accuracy", "macro_accuracy", "correct", "questions", "shots",
        "subjects": {subject: {"accuracy", "correct", "questions", "min_shots_used", "predictions"}}}``.

    Raises:
        UserError: see ``list_subjects``, ``read_questions``, ``choice_token_ids``, ``prompt_ids``;
            or a subject has no test CSV, or no dev CSV while shots > 0. Every CSV is read before
            the first question is scored.
    """
    model.eval()
    choice_ids = choice_token_ids(tokenizer)
    data = {}  # subject -> (dev questions, test questions)
    for subject in subjects or list_subjects(data_dir):
        dev_path = os.path.join(data_dir, "dev", f"{subject}_dev.csv")
        test_path = os.path.join(data_dir, "test", f"{subject}_test.csv")
        if not os.path.isfile(test_path):
            raise UserError(f"--subjects {subject}: {test_path} does not exist; name subjects that test/ holds")
        if shots > 0 and not os.path.isfile(dev_path):
            raise UserError(f"{dev_path} does not exist; {shots}-shot prompts take their examples from dev/")
        data[subject] = (read_questions(dev_path) if shots > 0 else [], read_questions(test_path))
    results = {}
    for subject, (dev, questions) in data.items():
        predictions, shots_used = [], []
        for question in questions:
            ids, used = prompt_ids(tokenizer, subject, dev, shots, question, max_length)
            predictions.append(CHOICES[int(np.argmax(choice_logits(model, ids, choice_ids)))])
            shots_used.append(used)
        correct = sum(p == q.answer for p, q in zip(predictions, questions))
        results[subject] = {
            "accuracy": correct / len(questions) if questions else None,
            "correct": correct,
            "questions": len(questions),
            "min_shots_used": min(shots_used, default=shots),
            "predictions": "".join(predictions),
        }
    correct = sum(r["correct"] for r in results.values())
    total = sum(r["questions"] for r in results.values())
    scored = [r["accuracy"] for r in results.values() if r["accuracy"] is not None]
    return {
        "accuracy": correct / total if total else None,
        "macro_accuracy": sum(scored) / len(scored) if scored else None,
        "correct": correct,
        "questions": total,
        "shots": shots,
        "subjects": results,
    }
