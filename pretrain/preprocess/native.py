"""Token ids of documents from each tokenizer family's own library: what preprocessing encodes with.

paddlenlp's tokenizer classes are Python wrappers around these libraries; the wrapper costs about
three quarters of the time and parses special-token text inside documents (a literal ``<s>`` would
become LLaMA's BOS id). Preprocessing calls the library directly, on the same folder's files:

- ``LlamaTokenizer``: ``sentencepiece``, ``SentencePieceProcessor.encode(batch, num_threads=1)``;
- ``GPTTokenizer``: ``tiktoken``, ``Encoding.encode_to_numpy`` with ranks from ``vocab.json`` +
  ``merges.txt`` and tiktoken's GPT-2 regex;
- ``QWenTokenizer``: ``tiktoken``, ``Encoding.encode_to_numpy`` with Qwen's ranks, regex and
  special tokens;
- ``Llama3Tokenizer``: ``tiktoken``, ``Encoding.encode_to_numpy`` with Llama 3's ranks
  (``tokenizer.model``), regex and 256 special tokens, as Meta's reference tokenizer (``llama3/tokenizer.py``
  of meta-llama/llama3) builds it;
- a folder of another class holding a Hugging Face ``tokenizer.json`` (``PreTrainedTokenizerFast``,
  ``Qwen2Tokenizer``, ...; ``pretrain.tokenizers.read_tokenizer_folder``): the Rust ``tokenizers`` library,
  ``Tokenizer.encode`` per document with ``encode_special_tokens`` and no post-processor (no BOS); EOS and
  BOS are the config's tokens (``pretrain.tokenizer_json.special_tokens``), as transformers reads them.

Documents are text: ``<s>``, ``</s>``, ``<|endoftext|>``, ``<|im_start|>``, ``<|begin_of_text|>`` inside
one are encoded as the characters they are; the caller appends EOS by id. For text without such strings the ids are
paddlenlp's (tests/test_preprocess_native.py). GPT-2 runs on tiktoken rather than ``tokenizers``: the same
ids, 8x faster on the benchmark corpus (5.6 vs 0.7 M tokens/s on one core). tiktoken's batch call
runs a thread pool, slower on one thread than a loop over ``encode_to_numpy`` (3.1 vs 4.5 M
tokens/s), so documents are encoded one by one there. One thread per process: ``--workers``
decides the parallelism.

Other tokenizer classes are encoded by paddlenlp (``AutoTokenizer``, special tokens split as text),
at the wrapper's speed.
"""

from __future__ import annotations

import itertools
import json
from typing import Optional

import numpy as np
import sentencepiece
import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks, load_tiktoken_bpe
from tiktoken_ext.openai_public import r50k_pat_str

from pretrain.errors import UserError
from pretrain.tokenizer_folder import TokenizerFolder, read_tokenizer_folder
from pretrain.tokenizers import tiktoken_uncached

# Qwen's pre-tokenizer regex and special tokens, from Qwen's tokenization_qwen.py (Qwen-7B release),
# as paddlenlp.transformers.qwen.tokenizer has them (tests/test_preprocess_native.py compares the two).
QWEN_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501
QWEN_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>") + tuple(f"<|extra_{i}|>" for i in range(205))
# Llama 3's, from Meta's llama3/tokenizer.py (meta-llama/llama3), as paddlenlp.transformers.llama.tokenizer and the
# published tokenizer.json have them (tests/test_llama3_tokenizer.py compares the three): ids 128000..128255.
LLAMA3_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501
_RESERVED = tuple(f"<|reserved_special_token_{i}|>" for i in range(251))
LLAMA3_SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    *_RESERVED[:4],
    "<|start_header_id|>",
    "<|end_header_id|>",
) + (_RESERVED[4], "<|eot_id|>", *_RESERVED[5:])


def _from_lists(lists: list) -> tuple:
    """(ids [total] int64, lengths [len(lists)] int64) of a list of id lists."""
    lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    ids = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int64, count=int(lengths.sum()))
    return ids, lengths


class SentencePieceEncoder:
    """A ``LlamaTokenizer`` folder's SentencePiece model. EOS and BOS are the model's ``eos_id``, ``bos_id`` (as in
    paddlenlp)."""

    library = "sentencepiece"

    def __init__(self, folder: TokenizerFolder):
        self.tokenizer_class = folder.tokenizer_class
        self.processor = sentencepiece.SentencePieceProcessor(model_file=folder.files["vocab_file"])
        self.vocab_size = self.processor.get_piece_size()
        self.eos_token_id = self.processor.eos_id() if self.processor.eos_id() >= 0 else None
        self.bos_token_id = self.processor.bos_id() if self.processor.bos_id() >= 0 else None

    def encode(self, texts: list) -> tuple:
        """(ids [total] int64, lengths [len(texts)] int64) of the texts, no special tokens added."""
        return _from_lists(self.processor.encode(texts, num_threads=1))

    def reference_encode(self, text: str) -> list:
        """The library's plain encode of one text (the benchmark's reference)."""
        return self.processor.encode(text)


class TiktokenEncoder:
    """A tiktoken ``Encoding`` built from a folder's ranks; special-token text is encoded as text."""

    library = "tiktoken"

    def __init__(
        self,
        tokenizer_class: str,
        encoding,
        vocab_size: int,
        eos_token_id: Optional[int],
        bos_token_id: Optional[int],
    ):
        self.tokenizer_class = tokenizer_class
        self.encoding = encoding
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.bos_token_id = bos_token_id

    def encode(self, texts: list) -> tuple:
        """(ids [total] uint32, lengths [len(texts)] int64) of the texts, no special tokens added."""
        arrays = [self.encoding.encode_to_numpy(text, disallowed_special=()) for text in texts]
        lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
        return (np.concatenate(arrays) if arrays else np.zeros(0, np.uint32)), lengths

    def reference_encode(self, text: str) -> list:
        """The library's plain encode of one text (the benchmark's reference)."""
        return self.encoding.encode_ordinary(text)


def _tiktoken_file(folder: TokenizerFolder, name: str, pattern: str, special_tokens: tuple) -> TiktokenEncoder:
    """A tiktoken rank file (``vocab_file``) with ``special_tokens`` numbered after the ranks; EOS and BOS are
    the special tokens the config names (``eos_token_id`` wins over ``eos_token``)."""
    try:
        with tiktoken_uncached():
            ranks = load_tiktoken_bpe(folder.files["vocab_file"])
    except ValueError as e:
        raise UserError(f"{folder.files['vocab_file']}: not a tiktoken rank file ({e}); fetch it anew") from e
    special: dict = {token: rank for rank, token in enumerate(special_tokens, start=len(ranks))}
    encoding = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=special)
    eos = folder.config.get("eos_token_id", special.get(folder.token("eos_token")))
    bos = special.get(folder.token("bos_token"))
    return TiktokenEncoder(folder.tokenizer_class, encoding, encoding.n_vocab, eos, bos)


def _qwen(folder: TokenizerFolder) -> TiktokenEncoder:
    return _tiktoken_file(folder, "qwen", QWEN_PATTERN, QWEN_SPECIAL_TOKENS)


def _llama3(folder: TokenizerFolder) -> TiktokenEncoder:
    return _tiktoken_file(folder, "llama3", LLAMA3_PATTERN, LLAMA3_SPECIAL_TOKENS)


def _gpt2(folder: TokenizerFolder) -> TiktokenEncoder:
    with open(folder.files["vocab_file"], encoding="utf-8") as f:
        vocab = json.load(f)
    try:
        with tiktoken_uncached():
            ranks = data_gym_to_mergeable_bpe_ranks(folder.files["merges_file"], folder.files["vocab_file"])
    except (AssertionError, KeyError, ValueError) as e:
        raise UserError(
            f"{folder.path}: vocab.json and merges.txt do not describe one byte-level BPE ({type(e).__name__}); "
            "use the pair published together"
        ) from e
    special = {token: vocab[token] for token in ("<|endoftext|>",) if token in vocab}
    encoding = tiktoken.Encoding("gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks, special_tokens=special)
    return TiktokenEncoder(
        folder.tokenizer_class,
        encoding,
        len(vocab),
        vocab.get(folder.token("eos_token") or "<|endoftext|>"),
        vocab.get(folder.token("bos_token")),
    )


class RustTokenizersEncoder:
    """A ``tokenizer.json`` folder through the Rust ``tokenizers`` library; special-token text is encoded as text.

    One document per ``encode`` call: ``encode_batch`` runs a thread pool (the library's ``RAYON`` threads),
    and ``--workers`` decides the parallelism."""

    library = "tokenizers"

    def __init__(self, folder: TokenizerFolder):
        from pretrain.tokenizer_json import read_tokenizer_json, special_tokens

        self.tokenizer_class = folder.tokenizer_class
        self.tokenizer = read_tokenizer_json(folder)
        self.tokenizer.encode_special_tokens = True
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        tokens = special_tokens(folder)  # training's (TokenizerJson's): the EOS the data ends documents with
        self.eos_token_id = self._id(tokens.get("eos_token"))
        self.bos_token_id = self._id(tokens.get("bos_token"))

    def _id(self, token: Optional[str]) -> Optional[int]:
        return None if token is None else self.tokenizer.token_to_id(token)

    def encode(self, texts: list) -> tuple:
        """(ids [total] int64, lengths [len(texts)] int64) of the texts, no special tokens added."""
        return _from_lists([self.reference_encode(text) for text in texts])

    def reference_encode(self, text: str) -> list:
        """The library's plain encode of one text (the benchmark's reference), special tokens as text."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids


class PaddleNLPEncoder:
    """Any other paddlenlp tokenizer class, through ``AutoTokenizer``, special tokens split as text."""

    library = "paddlenlp"

    def __init__(self, folder: TokenizerFolder):
        from pretrain.tokenizers import load_tokenizer_from

        self.tokenizer = load_tokenizer_from(folder.path)
        self.tokenizer_class = folder.tokenizer_class
        self.vocab_size = len(self.tokenizer)
        self.eos_token_id = self.tokenizer.eos_token_id
        self.bos_token_id = self.tokenizer.bos_token_id

    def encode(self, texts: list) -> tuple:
        """(ids [total] int64, lengths [len(texts)] int64) of the texts, no special tokens added."""
        if not texts:
            return _from_lists([])
        batch = self.tokenizer(
            texts,
            add_special_tokens=False,
            split_special_tokens=True,
            return_attention_mask=False,
            return_token_type_ids=False,
        )
        return _from_lists(batch["input_ids"])

    def reference_encode(self, text: str) -> list:
        """paddlenlp's encode of one text."""
        return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


NATIVE = {
    "LlamaTokenizer": SentencePieceEncoder,
    "GPTTokenizer": _gpt2,
    "QWenTokenizer": _qwen,
    "Llama3Tokenizer": _llama3,
}


def load_encoder(path: str):
    """The encoder for the tokenizer folder ``path``: its native library (the Rust ``tokenizers`` one for a
    ``tokenizer.json`` folder), or paddlenlp for other classes.

    Returns:
        An object with ``encode(texts) -> (ids, lengths)``, ``reference_encode(text)``,
        ``vocab_size``, ``eos_token_id`` and ``bos_token_id`` (None when the tokenizer has none),
        ``tokenizer_class``, ``library``.

    Raises:
        UserError: see ``pretrain.tokenizers.read_tokenizer_folder``; inconsistent vocabulary files.
    """
    folder = read_tokenizer_folder(path)
    if folder.is_tokenizer_json:
        return RustTokenizersEncoder(folder)
    return NATIVE.get(folder.tokenizer_class, PaddleNLPEncoder)(folder)
