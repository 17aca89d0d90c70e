"""A Hugging Face ``tokenizer.json`` folder as a tokenizer for training, over the Rust ``tokenizers`` library.

Most 2025-26 releases (Llama 3.x, Qwen2.5/3, DeepSeek-V3) ship only ``tokenizer.json`` plus a
``tokenizer_config.json`` naming ``PreTrainedTokenizerFast`` (or a class whose own vocabulary files
are not there, such as Qwen's ``Qwen2Tokenizer`` without ``vocab.json`` + ``merges.txt``). paddlenlp
has no loader for that form; ``TokenizerJson`` gives the part of paddlenlp's tokenizer interface the
application uses (encode and batch encode to ids, special tokens and their ids, ``len``, ``vocab_size``,
``decode``, ``save_pretrained``) with the behaviour of transformers' ``AutoTokenizer`` on the same
folder (tests/test_tokenizer_json.py compares the ids):

- what ``add_special_tokens=True`` adds is the ``tokenizer.json`` post-processor's (transformers'
  ``PreTrainedTokenizerFast`` runs the same one): Qwen's adds nothing, nor does Llama 3's first release
  (a ``ByteLevel`` post-processor); later Llama 3 files (a ``TemplateProcessing`` one) prepend
  ``<|begin_of_text|>``;
- special tokens (``bos_token``, ``eos_token``, ``pad_token``, ``unk_token``,
  ``additional_special_tokens``) are ``tokenizer_config.json``'s, a saved ``AddedToken`` dict read by its
  ``content`` (a ``special_tokens_map.json`` is not read, as transformers' ``AutoTokenizer`` does not read it for
  these folders);
- special-token text inside a text is the special token (``<|im_end|>`` becomes its id), as in transformers;
  preprocessing encodes documents as text instead (``pretrain.preprocess.native``);
- no chat template is applied; ``decode`` cleans up tokenization spaces when the config asks for it
  (``clean_up_tokenization_spaces``), as transformers does.
"""

from __future__ import annotations

import os
import shutil
from typing import Optional, Union

from tokenizers import Tokenizer

from pretrain.errors import UserError
from pretrain.tokenizer_folder import TOKENIZER_CONFIG, TokenizerFolder

SPECIAL_TOKENS_MAP = "special_tokens_map.json"
SPECIAL_KINDS = ("bos_token", "eos_token", "pad_token", "unk_token")


def _content(value) -> Optional[str]:
    """A special token's text, also when saved as an ``AddedToken`` dict."""
    return value.get("content") if isinstance(value, dict) else value


def special_tokens(folder: TokenizerFolder) -> dict:
    """``{kind: token text}`` of the folder's special tokens (``SPECIAL_KINDS`` that are set, and
    ``additional_special_tokens`` as a list), from ``tokenizer_config.json``. A ``special_tokens_map.json`` beside
    it is not read: transformers 4.55's ``AutoTokenizer`` does not take its tokens for a ``tokenizer.json`` folder
    either (tests/test_tokenizer_json.py shows it on Llama 3's and Qwen3's)."""
    tokens: dict = {kind: _content(folder.config.get(kind)) for kind in SPECIAL_KINDS if folder.config.get(kind)}
    tokens["additional_special_tokens"] = [_content(v) for v in folder.config.get("additional_special_tokens") or ()]
    return tokens


def read_tokenizer_json(folder: TokenizerFolder) -> Tokenizer:
    """The Rust ``tokenizers`` library's ``Tokenizer`` of the folder's ``tokenizer.json``, no padding or truncation.

    Raises:
        UserError: the file is not one the library reads (its message included).
    """
    path = folder.files["tokenizer_file"]
    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
        raise UserError(
            f"{path}: not a tokenizer.json the tokenizers library reads ({e}); copy it again from the model's release"
        ) from e
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


class TokenizerJson:
    """A ``tokenizer.json`` folder's tokenizer, paddlenlp-style (``pretrain.tokenizers.load_tokenizer_from``
    returns one for such folders; ``UserError`` from ``read_tokenizer_json``). Ids are Python ints;
    ``tokenizer_class`` is the class the folder's config names (what preprocessing records in ``.stats.json``)."""

    def __init__(self, folder: TokenizerFolder):
        self.folder = folder
        self.tokenizer_class = folder.tokenizer_class
        self.backend = read_tokenizer_json(folder)
        tokens = special_tokens(folder)
        self.additional_special_tokens = tokens.pop("additional_special_tokens")
        self.bos_token: Optional[str] = tokens.get("bos_token")
        self.eos_token: Optional[str] = tokens.get("eos_token")
        self.pad_token: Optional[str] = tokens.get("pad_token")
        self.unk_token: Optional[str] = tokens.get("unk_token")
        self.clean_up_tokenization_spaces = bool(folder.config.get("clean_up_tokenization_spaces", False))

    @property
    def special_tokens_map(self) -> dict:
        """``{kind: token}`` of the set special tokens, as paddlenlp's and transformers' property."""
        tokens: dict = {kind: getattr(self, kind) for kind in SPECIAL_KINDS if getattr(self, kind)}
        if self.additional_special_tokens:
            tokens["additional_special_tokens"] = list(self.additional_special_tokens)
        return tokens

    def _id(self, token: Optional[str]) -> Optional[int]:
        return None if token is None else self.backend.token_to_id(token)

    @property
    def bos_token_id(self) -> Optional[int]:
        return self._id(self.bos_token)

    @property
    def eos_token_id(self) -> Optional[int]:
        return self._id(self.eos_token)

    @property
    def pad_token_id(self) -> Optional[int]:
        return self._id(self.pad_token)

    @property
    def unk_token_id(self) -> Optional[int]:
        return self._id(self.unk_token)

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary without added tokens (transformers' ``vocab_size``)."""
        return self.backend.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        """Ids the tokenizer can emit, added tokens included (transformers' and paddlenlp's ``len``)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict:
        return self.backend.get_vocab(with_added_tokens=True)

    def convert_tokens_to_ids(self, tokens: Union[str, list]):
        """A token's id (None for an unknown token), or a list of them."""
        return self._id(tokens) if isinstance(tokens, str) else [self._id(token) for token in tokens]

    def convert_ids_to_tokens(self, ids: Union[int, list]):
        return self.backend.id_to_token(ids) if isinstance(ids, int) else [self.backend.id_to_token(i) for i in ids]

    def encode(self, text: str, add_special_tokens: bool = True, **_) -> dict:
        """``{"input_ids": [ids], "attention_mask": [1, ...]}`` of one text, as paddlenlp's ``encode`` returns."""
        ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}

    def batch_encode(self, texts: list, add_special_tokens: bool = True, **_) -> dict:
        """``{"input_ids": [[ids] per text], "attention_mask": [...]}``, unpadded."""
        ids = [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)]
        return {"input_ids": ids, "attention_mask": [[1] * len(row) for row in ids]}

    def __call__(self, text, add_special_tokens: bool = True, return_tensors: Optional[str] = None, **_) -> dict:
        """``encode`` of a text or ``batch_encode`` of a list; ``return_tensors="pd"`` gives [1, tokens] int64
        paddle tensors of one text (what ``generate`` passes a model)."""
        if not isinstance(text, str):
            return self.batch_encode(text, add_special_tokens)
        encoded = self.encode(text, add_special_tokens)
        if return_tensors == "pd":
            import paddle

            return {key: paddle.to_tensor([value], dtype="int64") for key, value in encoded.items()}
        return encoded

    def decode(self, ids, skip_special_tokens: bool = False, **_) -> str:
        """The text of ``ids`` (a list, or anything with ``tolist``)."""
        text = self.backend.decode(list(ids.tolist() if hasattr(ids, "tolist") else ids), skip_special_tokens)
        if self.clean_up_tokenization_spaces:
            from paddlenlp.transformers.tokenizer_utils_base import PretrainedTokenizerBase

            text = PretrainedTokenizerBase.clean_up_tokenization(text)
        return text

    def save_pretrained(self, save_directory: str, **_) -> tuple:
        """Copy the folder's tokenizer files (``tokenizer.json``, ``tokenizer_config.json`` and
        ``special_tokens_map.json`` where present) into ``save_directory``; returns the paths written."""
        os.makedirs(save_directory, exist_ok=True)
        written = []
        for name in (os.path.basename(self.folder.files["tokenizer_file"]), TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP):
            source = os.path.join(self.folder.path, name)
            target = os.path.join(save_directory, name)
            if os.path.isfile(source) and os.path.abspath(source) != os.path.abspath(target):
                shutil.copyfile(source, target)
            if os.path.isfile(target):
                written.append(target)
        return tuple(written)
