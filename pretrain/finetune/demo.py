"""The CPU fine-tuning demo's data: "is this passage from the Bible or from Shakespeare?" as src/tgt pairs.

Built offline from the demo corpus (``data/demo/corpus.jsonl``, see ``pretrain.preprocess``): King
James Bible chapters (``"<Book> <chapter>\\n\\n<text>"``, cut into sentences) and pieces of
Shakespeare's plays (speeches, ``"SPEAKER.\\n<lines>"`` paragraphs). A pair is

    {"src": "Passage: <a sentence or a speech>\\nFrom:", "tgt": "the Bible" or "Shakespeare"}

so the right answer depends on the passage, and greedy decoding shows whether the adapter picked
that up. (Finer answers, such as the part of the Bible, stayed at the majority answer with the
demo's 7.3 M-parameter model and 100 steps.)

Documents, not passages, are split between train.json and dev.json (every ``eval_every``-th
Bible chapter and every ``eval_every``-th Shakespeare document is held out), so no held-out
passage's document was fine-tuned on. The pretrained demo model has read this text, but never in
this question-and-answer form: its loss on the answer tokens is high, and an adapter trained on
the train pairs lowers it on the held-out ones.
"""

from __future__ import annotations

import json
import os
import re

from pretrain.errors import UserError

CHAPTER_TITLE = re.compile(r"^((?:[1-3] )?[A-Z][A-Za-z]*(?: of [A-Z][a-z]+| [A-Z][a-z]+)*) (\d+)$")
SENTENCE_END = re.compile(r"(?<=[.?!])\s+(?=[A-Z])")
SPEAKER = re.compile(r"^[A-Z][A-Za-z .']*\.$")  # "FAL.", "KING HENRY.", "Capulet."
PROMPT = "Passage: {passage}\nFrom:"
BIBLE, SHAKESPEARE = "the Bible", "Shakespeare"


def read_corpus(corpus_path: str) -> list:
    """The corpus's documents (texts), in order.

    Raises:
        UserError: the corpus does not exist.
    """
    if not os.path.isfile(corpus_path):
        raise UserError(f"{corpus_path} does not exist; build the demo corpus first with `make data`")
    with open(corpus_path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def bible_chapter(text: str):
    """(book, chapter text) when ``text`` is a Bible chapter ("<Book> <n>", then one paragraph), else None."""
    title, _, body = text.partition("\n\n")
    match = CHAPTER_TITLE.match(title)
    if match and body and "\n" not in body.strip():
        return match.group(1), body.strip()
    return None


def sentences(text: str, min_words: int, max_words: int) -> list:
    """The sentences of ``text`` of ``min_words`` to ``max_words`` words, in order."""
    return [s for s in SENTENCE_END.split(text) if min_words <= len(s.split()) <= max_words]


def speeches(text: str, min_words: int, max_words: int) -> list:
    """The speeches of a Shakespeare document ("SPEAKER.\\nline\\nline"), their lines joined by spaces,
    of ``min_words`` to ``max_words`` words, in order (speaker names and stage directions left out)."""
    found = []
    for paragraph in text.split("\n\n"):
        speaker, _, lines = paragraph.partition("\n")
        speech = " ".join(line.strip() for line in lines.splitlines() if not line.strip().startswith("["))
        if SPEAKER.match(speaker.strip()) and min_words <= len(speech.split()) <= max_words:
            found.append(speech)
    return found


def build_pairs(
    corpus_path: str, per_document: int = 3, eval_every: int = 10, min_words: int = 6, max_words: int = 40
) -> tuple:
    """(train pairs, dev pairs): up to ``per_document`` passages of each document (one of each held-out
    document), every ``eval_every``-th Bible chapter and Shakespeare document held out.

    Raises:
        UserError: the corpus is missing, or holds no Bible chapter or no Shakespeare speech.
    """
    train, dev, seen = [], [], {BIBLE: 0, SHAKESPEARE: 0}
    for text in read_corpus(corpus_path):
        chapter = bible_chapter(text)
        if chapter is not None:
            answer, passages = BIBLE, sentences(chapter[1], min_words, max_words)
        else:
            answer, passages = SHAKESPEARE, speeches(text, min_words, max_words)
        held_out = seen[answer] % eval_every == 0
        seen[answer] += 1
        for passage in passages[: 1 if held_out else per_document]:
            (dev if held_out else train).append({"src": PROMPT.format(passage=passage), "tgt": answer})
    if {pair["tgt"] for pair in train} != {BIBLE, SHAKESPEARE}:
        raise UserError(f"{corpus_path} lacks Bible chapters or Shakespeare speeches; rebuild it with `make data`")
    return train, dev


def write_pairs(pairs: list, path: str) -> None:
    """Write ``pairs`` as jsonl (one ``{"src", "tgt"}`` object per line)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for pair in pairs:
            f.write(json.dumps(pair, ensure_ascii=False) + "\n")
