"""The CPU fine-tuning demo's data: "which book of the Bible is this verse from?" as src/tgt pairs.

Built offline from the demo corpus (``data/demo/corpus.jsonl``, see ``pretrain.preprocess``), whose
King James Bible documents are whole chapters, ``"<Book> <chapter>\\n\\n<text>"``. Each chapter's
text is cut into sentences; a pair is

    {"src": "Verse: <sentence>\\nBook:", "tgt": "<Book>"}

with a numbered book's number spelled out ("1 Samuel" -> "First Samuel"): the demo tokenizer has
no piece for a space followed by a digit, so "1 Samuel" would start with a lone "▁" token that
every numbered book shares, and greedy decoding of a small model stalls on it.

Chapters, not sentences, are split between train.json and dev.json (every ``eval_every``-th
chapter of the corpus order is held out), so no held-out sentence's chapter was fine-tuned on. The
pretrained demo model has read all of this text, but never in this question-and-answer form: its
loss on the answer tokens is high, and an adapter trained on the train pairs lowers it on the
held-out ones.
"""

from __future__ import annotations

import json
import os
import re

from pretrain.errors import UserError

CHAPTER_TITLE = re.compile(r"^((?:[1-3] )?[A-Z][A-Za-z]*(?: of [A-Z][a-z]+| [A-Z][a-z]+)*) (\d+)$")
SENTENCE_END = re.compile(r"(?<=[.?!])\s+(?=[A-Z])")
PROMPT = "Verse: {sentence}\nBook:"
ORDINALS = {"1": "First", "2": "Second", "3": "Third"}


def chapters(corpus_path: str) -> list:
    """``[(book, chapter, text)]`` of the corpus's Bible chapters, in corpus order.

    Raises:
        UserError: the corpus does not exist or holds no Bible chapter.
    """
    if not os.path.isfile(corpus_path):
        raise UserError(f"{corpus_path} does not exist; build the demo corpus first with `make data`")
    found = []
    with open(corpus_path, encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            title, _, body = text.partition("\n\n")
            match = CHAPTER_TITLE.match(title)
            if match and body and "\n" not in body.strip():  # a chapter is one paragraph of verses
                found.append((match.group(1), int(match.group(2)), body.strip()))
    if not found:
        raise UserError(f"{corpus_path} holds no Bible chapter ('<Book> <n>' + text); rebuild it with `make data`")
    return found


def answer(book: str) -> str:
    """The answer for ``book``: its name, the number of a numbered book spelled out ("2 Kings" -> "Second Kings")."""
    number, _, name = book.partition(" ")
    return f"{ORDINALS[number]} {name}" if number in ORDINALS else book


def sentences(text: str, min_words: int, max_words: int) -> list:
    """The sentences of ``text`` of ``min_words`` to ``max_words`` words, in order."""
    return [s for s in SENTENCE_END.split(text) if min_words <= len(s.split()) <= max_words]


def build_pairs(
    corpus_path: str, per_chapter: int = 4, eval_every: int = 10, min_words: int = 6, max_words: int = 40
) -> tuple:
    """(train pairs, dev pairs): up to ``per_chapter`` sentences of each chapter, every
    ``eval_every``-th chapter held out (one sentence of each; see the module docstring)."""
    train, dev = [], []
    for index, (book, _, text) in enumerate(chapters(corpus_path)):
        held_out = index % eval_every == 0
        for sentence in sentences(text, min_words, max_words)[: 1 if held_out else per_chapter]:
            (dev if held_out else train).append({"src": PROMPT.format(sentence=sentence), "tgt": answer(book)})
    return train, dev


def write_pairs(pairs: list, path: str) -> None:
    """Write ``pairs`` as jsonl (one ``{"src", "tgt"}`` object per line)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for pair in pairs:
            f.write(json.dumps(pair, ensure_ascii=False) + "\n")
