"""The CPU fine-tuning demo's data: "where is this passage from?" as src/tgt pairs.

Built offline from the demo corpus (``data/demo/corpus.jsonl``, see ``pretrain.preprocess``): King
James Bible chapters (``"<Book> <chapter>\\n\\n<text>"``) and pieces of Shakespeare's plays
(speeches as ``"SPEAKER.\\n<lines>"`` paragraphs). A pair is

    {"src": "Passage: <a sentence or a speech>\\nFrom:", "tgt": "<answer>"}

where the answer is ``Shakespeare`` or the part of the Bible the book belongs to
(``BIBLE_SECTIONS``: Law, History, Poetry, Prophets, Gospels, Letters), so the right answer
depends on the passage's content and style, and greedy decoding shows whether the adapter picked
that up (answers are whole words the demo tokenizer knows).

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
SHAKESPEARE = "Shakespeare"
# The books of the King James Bible by the part they belong to (the usual Protestant grouping,
# Acts with the history books and Revelation with the prophets).
BIBLE_SECTIONS = {
    "Law": "Genesis Exodus Leviticus Numbers Deuteronomy",
    "History": "Joshua|Judges|Ruth|1 Samuel|2 Samuel|1 Kings|2 Kings|1 Chronicles|2 Chronicles|Ezra|Nehemiah|"
    "Esther|Acts",
    "Poetry": "Job|Psalms|Proverbs|Ecclesiastes|Song of Solomon",
    "Prophets": "Isaiah Jeremiah Lamentations Ezekiel Daniel Hosea Joel Amos Obadiah Jonah Micah Nahum Habakkuk "
    "Zephaniah Haggai Zechariah Malachi Revelation",
    "Gospels": "Matthew Mark Luke John",
    "Letters": "Romans|1 Corinthians|2 Corinthians|Galatians|Ephesians|Philippians|Colossians|1 Thessalonians|"
    "2 Thessalonians|1 Timothy|2 Timothy|Titus|Philemon|Hebrews|James|1 Peter|2 Peter|1 John|2 John|3 John|Jude",
}
SECTION_OF_BOOK = {
    book: section
    for section, books in BIBLE_SECTIONS.items()
    for book in (books.split("|") if "|" in books else books.split())
}


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
    """(book, chapter text) when ``text`` is a Bible chapter ("<Book> <n>", then one paragraph), else None.

    Raises:
        UserError: the book is not in ``BIBLE_SECTIONS``.
    """
    title, _, body = text.partition("\n\n")
    match = CHAPTER_TITLE.match(title)
    if not (match and body and "\n" not in body.strip()):
        return None
    if match.group(1) not in SECTION_OF_BOOK:
        raise UserError(
            f"the demo corpus has a chapter of {match.group(1)!r}, a book BIBLE_SECTIONS lacks; add it there"
        )
    return match.group(1), body.strip()


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
    train, dev, seen = [], [], {"bible": 0, "shakespeare": 0}
    for text in read_corpus(corpus_path):
        chapter = bible_chapter(text)
        if chapter is not None:
            kind, answer, passages = "bible", SECTION_OF_BOOK[chapter[0]], sentences(chapter[1], min_words, max_words)
        else:
            kind, answer, passages = "shakespeare", SHAKESPEARE, speeches(text, min_words, max_words)
        held_out = seen[kind] % eval_every == 0
        seen[kind] += 1
        for passage in passages[: 1 if held_out else per_document]:
            (dev if held_out else train).append({"src": PROMPT.format(passage=passage), "tgt": answer})
    answers = {pair["tgt"] for pair in train}
    if SHAKESPEARE not in answers or not answers & set(BIBLE_SECTIONS):
        raise UserError(f"{corpus_path} lacks Bible chapters or Shakespeare speeches; rebuild it with `make data`")
    return train, dev


def write_pairs(pairs: list, path: str) -> None:
    """Write ``pairs`` as jsonl (one ``{"src", "tgt"}`` object per line)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for pair in pairs:
            f.write(json.dumps(pair, ensure_ascii=False) + "\n")
