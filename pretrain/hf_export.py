"""A saved model as a Hugging Face ``transformers`` folder (tools/export_hf.py).

The output loads with ``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` and
``AutoTokenizer.from_pretrained(DIR)``, no custom code: ``config.json`` for the family's transformers
class (``registry.Implementation.hf``: LLaMA/Baichuan-7B -> LlamaForCausalLM, Qwen2 and Qwen v1 ->
Qwen2ForCausalLM, GPT-3 -> GPT2LMHeadModel, Qwen2-MoE -> Qwen2MoeForCausalLM, Mixtral ->
MixtralForCausalLM), ``model-0000i-of-0000n.safetensors`` in torch layout
(``[out, in]`` linear weights, metadata ``format: pt``) with ``model.safetensors.index.json``,
``generation_config.json`` and the tokenizer's files (SentencePiece, GPT-2 BPE, or tiktoken as
``tokenizer.json``).

Tensor names and layouts are paddlenlp's own (``model_class._get_name_mappings``: Hugging Face name ->
paddlenlp name, transpose or q/k/v split), applied in reverse. Every layout a run saves is read:
one file or index-sharded (``model_state.pdparams``, ``model.safetensors``: save_pretrained, unified
checkpoints, a LoRA run after tools/merge_lora.py) and per-rank files of tensor/pipeline parallel runs
(``model_state.tp01_pp00.pdparams``: merged with paddlenlp's tensor-parallel merge actions).

Memory: safetensors input is read one tensor at a time and output written one tensor at a time, so
an export needs about one tensor (plus the pages of the input file the OS keeps mapped); a
``.pdparams`` file is loaded whole (per-rank files: the tensor-parallel ranks of one pipeline stage).
"""

from __future__ import annotations

import copy
import glob
import json
import os
import re
import shutil
from typing import Iterator, Optional

import ml_dtypes
import numpy as np
from paddlenlp.utils.env import (
    CONFIG_NAME,
    LORA_CONFIG_NAME,
    PADDLE_WEIGHTS_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
)

from pretrain.atomic import atomic_folder
from pretrain.checkpoint import latest_complete_checkpoint
from pretrain.errors import UserError
from pretrain.hf_import import mapping_config, rope_config_fields
from pretrain.log import logger
from pretrain.model_config import (
    describe_token_id_differences,
    load_local_config,
    set_token_ids,
    token_id_differences,
)
from pretrain.registry import Implementation, implementation_for
from pretrain.tokenizer_folder import read_tokenizer_folder
from pretrain.tokenizers import load_tokenizer_from, special_token_ids, tiktoken_uncached

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
SHARD_NAME = "model-{:05d}-of-{:05d}.safetensors"
PER_RANK_FILE = re.compile(r"^(model_state|model)\.(tp(\d{2}))?_?(pp(\d{2}))?\.(pdparams|safetensors)$")
# safetensors dtype names (the format's spec: github.com/huggingface/safetensors, "Format").
SAFETENSORS_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
NUMPY_DTYPES = {
    **{code: DTYPES[name] for name, code in SAFETENSORS_DTYPES.items()},
    **{"F64": np.float64, "I64": np.int64, "I32": np.int32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_},
}
SIZE_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    """Bytes in ``"5GB"`` (decimal units, as transformers' ``max_shard_size``; ``GiB`` is binary) or ``"1000"``.

    Raises:
        UserError: not a positive number with an optional unit.
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B)?\s*", text.upper())
    if not match or float(match.group(1)) <= 0:
        raise UserError(f"--max_shard_size {text!r} is not a size; write e.g. 5GB, 500MB or 2GiB")
    return int(float(match.group(1)) * SIZE_UNITS.get(match.group(2) or "", 1))


def model_folder(path: str) -> str:
    """The folder holding the model to export: ``path`` itself when it has config.json (a run's final
    model, a ``checkpoint-<step>`` folder, any save_pretrained folder), else ``path``'s newest complete
    checkpoint (a run stopped before its final save).

    Raises:
        UserError: neither; a LoRA adapter (run_finetune.py's output_dir or checkpoint), which holds no model.
    """
    if os.path.isfile(os.path.join(path, LORA_CONFIG_NAME)):
        merged = os.path.join(path, "merged")
        raise UserError(
            f"{path} holds a LoRA adapter ({LORA_CONFIG_NAME}), not a model; export "
            + (merged if os.path.isdir(merged) else "the folder tools/merge_lora.py writes from it and its base model")
        )
    if os.path.isfile(os.path.join(path, CONFIG_NAME)):
        return path
    checkpoint = latest_complete_checkpoint(path) if os.path.isdir(path) else None
    if checkpoint is None:
        raise UserError(
            f"{path}: no {CONFIG_NAME} and no complete checkpoint-<step> folder; give a run's output_dir, "
            "one of its checkpoints, or a folder written by save_pretrained"
        )
    return checkpoint


def _as_numpy(value) -> np.ndarray:
    """A loaded tensor as numpy; paddle's bfloat16 (numpy uint16 bits) as ml_dtypes.bfloat16."""
    array = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
    return array.view(ml_dtypes.bfloat16) if array.dtype == np.uint16 else array


def read_safetensors(path: str) -> Iterator[tuple]:
    """``(name, array)`` of a safetensors file, each tensor read into memory of its own with ``readinto``.

    The library's ``safe_open`` maps the whole file, and every page it touches stays resident until the
    file is closed: reading a shard that way holds the shard. Layout: see ``ShardWriter``.
    """
    with open(path, "rb") as f:
        header_size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_size))
        header.pop("__metadata__", None)
        for name, info in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
            begin, end = info["data_offsets"]
            array = np.empty(info["shape"], dtype=NUMPY_DTYPES[info["dtype"]])
            f.seek(8 + header_size + begin)
            f.readinto(memoryview(array.reshape(-1).view(np.uint8))[: end - begin])  # type: ignore[arg-type]  # numpy 1.26 stubs
            yield name, _as_numpy(array)


def _read_file(path: str) -> Iterator[tuple]:
    """``(name, array)`` of one saved weight file: safetensors one tensor at a time, pdparams whole."""
    if path.endswith(".safetensors"):
        yield from read_safetensors(path)
        return
    import paddle

    state = paddle.load(path, return_numpy=True)
    while state:
        name = next(iter(state))
        yield name, _as_numpy(state.pop(name))


def _merged_ranks(paths_by_rank: list, config, impl: Implementation) -> Iterator[tuple]:
    """``(name, array)`` of one pipeline stage saved by ``len(paths_by_rank)`` tensor-parallel ranks,
    each tensor merged with paddlenlp's merge action (``_get_tensor_parallel_mappings(is_split=False)``)."""
    states = [dict(_read_file(path)) for path in paths_by_rank]
    if len(states) == 1:
        yield from states[0].items()
        return
    impl.install_compat()  # GPT: the tied head's merge action (pretrain.compat.gpt)
    merge_config = copy.deepcopy(config)
    merge_config.tensor_parallel_degree = len(states)
    actions = impl.model_class.get_tensor_parallel_convert_actions(
        merge_config, list(states[0]), is_split=False, ignore_error=True
    )
    for name in list(states[0]):
        parts = [state.pop(name) for state in states]
        yield name, _as_numpy(np.asarray(actions[name](parts))) if name in actions else parts[0]


def saved_tensors(folder: str, config, impl: Implementation) -> Iterator[tuple]:
    """Every ``(paddlenlp name, numpy array)`` of the model saved in ``folder``, one file at a time;
    tensors of a model trained with ``fuse_attention_qkv/ffn`` split into q/k/v and gate/up with
    paddlenlp's split actions (``get_fuse_or_split_param_convert_actions``). The fusion is read from
    the names: paddlenlp does not write the runtime flags into config.json.

    Raises:
        UserError: the folder holds no weights.
    """
    tensors = _saved_tensors(folder, config, impl)
    unfused = copy.deepcopy(config)
    unfused.fuse_attention_qkv, unfused.fuse_attention_ffn = False, False
    for name, array in tensors:
        actions, _ = impl.model_class.get_fuse_or_split_param_convert_actions(
            unfused, [name], is_fuse=False, ignore_error=True
        )
        if not actions:
            yield name, array
            continue
        ((keys, split),) = actions.items()  # keys: the unfused names, then the fused one
        yield from zip(keys[:-1], split(array))


def _saved_tensors(folder: str, config, impl: Implementation) -> Iterator[tuple]:
    for index_name in (SAFE_WEIGHTS_INDEX_NAME, PADDLE_WEIGHTS_NAME + ".index.json"):
        index_path = os.path.join(folder, index_name)
        if os.path.isfile(index_path):
            with open(index_path, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
            # the index names one file per tensor: paddlenlp's unified checkpoint of a pipeline run whose last
            # stage names its copy of a tied weight as the embedding (GPT) writes it into two shards
            for file in sorted(set(weight_map.values())):
                for name, array in _read_file(os.path.join(folder, file)):
                    if weight_map.get(name) == file:
                        yield name, array
            return
    for name in (SAFE_WEIGHTS_NAME, PADDLE_WEIGHTS_NAME):
        if os.path.isfile(os.path.join(folder, name)):
            yield from _read_file(os.path.join(folder, name))
            return
    per_rank = {}  # pipeline stage -> {tensor rank: path}
    for name in os.listdir(folder):
        match = PER_RANK_FILE.match(name)
        if match and (match.group(2) or match.group(4)):
            per_rank.setdefault(int(match.group(5) or 0), {})[int(match.group(3) or 0)] = os.path.join(folder, name)
    if not per_rank:
        raise UserError(
            f"{folder}: no weights ({SAFE_WEIGHTS_NAME}, {PADDLE_WEIGHTS_NAME}, their .index.json, or per-rank "
            "model_state.tpXX_ppYY.pdparams); give a folder written by save_pretrained or a training run"
        )
    seen = set()  # GPT's last pipeline stage saves its copy of the tied embedding under the embedding's name
    for stage in sorted(per_rank):
        ranks = per_rank[stage]
        for name, array in _merged_ranks([ranks[rank] for rank in sorted(ranks)], config, impl):
            if name not in seen:
                seen.add(name)
                yield name, array


def hf_tensors(tensors: Iterator[tuple], config, impl: Implementation) -> Iterator[tuple]:
    """``(transformers name, array in torch layout)`` from paddlenlp ``(name, array)``.

    paddlenlp's mappings read Hugging Face -> paddlenlp; here each is undone: ``transpose`` is
    transposed back, ``split`` (GPT-2's fused ``c_attn``: q, k, v along the last axis) concatenated
    once its three parts have come. A tied output layer (``lm_head.weight`` when the config ties) is
    dropped: transformers ties it to the input embedding.

    Raises:
        UserError: a saved tensor that the mappings do not name (a different model than config.json says).
    """
    assert impl.hf is not None  # export refuses a type without a Hugging Face format
    inverse = {m.target_name: m for m in impl.model_class._get_name_mappings(mapping_config(config, impl))}
    tied = impl.hf.config(config)["tie_word_embeddings"]
    pending = {}  # fused name -> {index: part}
    for name, array in tensors:
        mapping = inverse.get(name)
        if mapping is None:
            if tied and name == "lm_head.weight" or name.endswith("rotary_emb.inv_freq"):
                continue
            raise UserError(f"tensor {name} of the saved model has no Hugging Face name for {impl.hf.architecture}")
        if mapping.action == "split":
            parts = pending.setdefault(mapping.source_name, {})
            parts[mapping.index] = array
            if len(parts) < 3:
                continue
            array = np.concatenate([parts[i] for i in range(3)], axis=-1)
            del pending[mapping.source_name]
        elif mapping.action == "transpose":
            array = np.ascontiguousarray(array.T)
        elif mapping.action is not None:
            raise UserError(f"tensor {name}: paddlenlp mapping action {mapping.action!r} cannot be reversed")
        if impl.hf.rename is None:
            yield mapping.source_name, array
        else:
            yield from impl.hf.rename(mapping.source_name, array, config)


class ShardWriter:
    """A safetensors file written one tensor at a time: the raw bytes go to ``<path>.data`` as they come,
    and ``close`` writes the file (8-byte little-endian header length, JSON header with each tensor's
    dtype, shape and byte offsets, ``__metadata__`` ``format: pt``, padded with spaces to 8 bytes, then
    the data). The library's ``save_file`` needs the whole shard in memory; this needs one tensor."""

    def __init__(self, path: str):
        self.path, self.header, self.size = path, {}, 0
        self.data = open(path + ".data", "wb")

    def add(self, name: str, array: np.ndarray) -> None:
        self.header[name] = {
            "dtype": SAFETENSORS_DTYPES[array.dtype.name],
            "shape": list(array.shape),
            "data_offsets": [self.size, self.size + array.nbytes],
        }
        self.data.write(np.ascontiguousarray(array).tobytes())
        self.size += array.nbytes

    def close(self) -> None:
        self.data.close()
        header = json.dumps({"__metadata__": {"format": "pt"}, **self.header}, separators=(",", ":")).encode()
        header += b" " * (-len(header) % 8)
        with open(self.path, "wb") as out, open(self.path + ".data", "rb") as data:
            out.write(len(header).to_bytes(8, "little"))
            out.write(header)
            shutil.copyfileobj(data, out, 64 << 20)
        os.remove(self.path + ".data")


def cast_finite(name: str, array: np.ndarray, dtype) -> np.ndarray:
    """``array`` (the tensor ``name``) cast to ``dtype``, every value finite.

    Raises:
        UserError: ``array`` holds NaN or inf; or values past ``dtype``'s largest finite value (float16:
            65504, bfloat16: 3.39e38), which the cast would turn to inf: the line names the tensor, its
            max |value|, the range and the dtypes that hold it.
    """
    with np.errstate(over="ignore"):  # overflow to inf: reported below
        cast = array.astype(dtype, copy=False)
    if np.isfinite(cast).all():
        return cast
    bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
    if bad:
        raise UserError(
            f"tensor {name} holds {bad} NaN/inf value(s): the saved model has diverged; export a checkpoint from before"
        )
    largest = float(np.abs(array).max())
    fits = [other for other, numpy_dtype in DTYPES.items() if float(ml_dtypes.finfo(numpy_dtype).max) >= largest]
    raise UserError(
        f"tensor {name}: max |value| {largest:.4g} is past the range of {np.dtype(dtype).name} (largest finite "
        f"{float(ml_dtypes.finfo(dtype).max):g}); export with --dtype {' or '.join(fits)}"
    )


def flushed_to_zero(array: np.ndarray, cast: np.ndarray) -> int:
    """How many nonzero values of ``array`` are 0 in ``cast`` (the same values in a narrower dtype): up to half
    the dtype's smallest subnormal (float16's is 2**-24 = 5.96e-8, bfloat16's 9.2e-41), they round to zero."""
    return int(np.count_nonzero(array) - np.count_nonzero(cast))


def write_shards(tensors: Iterator[tuple], folder: str, max_shard_bytes: int, dtype) -> tuple:
    """Write ``(name, array)`` as safetensors shards of at most ``max_shard_bytes`` of tensors (a larger
    tensor gets a shard of its own), cast to ``dtype`` (``cast_finite``), plus ``model.safetensors.index.json``.
    One tensor is in memory at a time (``ShardWriter``).

    Returns:
        (the index, ``{tensor name: nonzero values the cast made 0}`` for each tensor that lost any:
        ``flushed_to_zero``).

    Raises:
        UserError: a tensor that is not finite in ``dtype`` (``cast_finite``).
        ValueError: a name comes twice (a shard would keep the first one's bytes unnamed: an invalid file).
    """
    weight_map, shards, total, writer, flushed = {}, [], 0, None, {}
    for name, array in tensors:
        if name in weight_map:
            raise ValueError(f"tensor {name} comes twice")
        cast = cast_finite(name, array, dtype)
        lost = flushed_to_zero(array, cast)
        if lost:
            flushed[name] = lost
        array = cast
        if writer is None or writer.header and writer.size + array.nbytes > max_shard_bytes:
            if writer is not None:
                writer.close()
            writer = ShardWriter(os.path.join(folder, f"shard-{len(shards) + 1}.partial"))
            shards.append(writer.path)
        writer.add(name, array)
        weight_map[name] = len(shards)
        total += array.nbytes
    if writer is not None:
        writer.close()
    for number, path in enumerate(shards, 1):
        os.replace(path, os.path.join(folder, SHARD_NAME.format(number, len(shards))))
    index = {
        "metadata": {"total_size": total},
        "weight_map": {name: SHARD_NAME.format(number, len(shards)) for name, number in sorted(weight_map.items())},
    }
    with open(os.path.join(folder, SAFE_WEIGHTS_INDEX_NAME), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2)
    return index, flushed


def flushed_warning(flushed: dict, dtype: str) -> Optional[str]:
    """One line for ``write_shards``' flushed values (None when none): how many, in how many tensors, each
    tensor's count (the most first)."""
    if not flushed:
        return None
    counts = ", ".join(f"{name} {count}" for name, count in sorted(flushed.items(), key=lambda item: -item[1]))
    wider = " or ".join(other for other in DTYPES if other != dtype)
    smallest = float(ml_dtypes.finfo(DTYPES[dtype]).smallest_subnormal)
    return (
        f"--dtype {dtype}: {sum(flushed.values())} nonzero value(s) in {len(flushed)} tensor(s) were written as 0 "
        f"(|value| <= {smallest / 2:.3g}, half {dtype}'s smallest {smallest:.3g}): {counts}; export with "
        f"--dtype {wider} to keep them"
    )


def _special_ids(config) -> dict:
    return {
        key: getattr(config, key)
        for key in ("bos_token_id", "eos_token_id", "pad_token_id")
        if getattr(config, key, None) is not None
    }


def adopt_tokenizer_ids(model_dir: str, config) -> Optional[str]:
    """Give ``config`` (in place) the begin- and end-of-text ids of the tokenizer saved in ``model_dir`` where its
    config.json names others (``model_config.set_token_ids``): the ids the export writes to config.json and
    generation_config.json, which transformers' ``generate`` and vLLM stop on. Returns the one line naming both,
    or None when they agree or ``model_dir`` holds no tokenizer.

    A model saved before runs took the tokenizer's ids (or built outside a run) has paddlenlp's defaults for the
    published tokenizer: Qwen2's eos 151643, past the 8,064 rows of a demo vocabulary, which ``generate`` never
    produces, so it never stops.
    """
    if not os.path.isfile(os.path.join(model_dir, "tokenizer_config.json")):
        return None
    token_ids = special_token_ids(load_tokenizer_from(model_dir, key="RUN_OR_CHECKPOINT"))
    differences = token_id_differences(config, token_ids)
    if not differences:
        return None
    set_token_ids(config, token_ids, from_scratch=False)
    return (
        f"{os.path.join(model_dir, CONFIG_NAME)} has {describe_token_id_differences(differences)}; the export "
        "writes the tokenizer's, which the model was trained to end text with"
    )


def transformers_version_warning(config, architecture: str) -> Optional[str]:
    """One line when transformers 4.x computes other logits than the model exported as ``architecture`` (the
    transformers class, ``HFFormat.architecture``) from ``config`` (None otherwise): a YaRN with ``mscale_all_dim``
    scales attention softmax by (0.1 mscale_all_dim ln(factor) + 1)^2 in paddlenlp (deepseek_v2/modeling.py lines
    891-895), DeepSeek's code, transformers 5 and 4.x's ``DeepseekV3Attention``, but not in transformers 4.x's
    ``DeepseekV2Attention`` (its ``scaling`` is head_dim^-0.5): docs/models.md measures it."""
    scaling = getattr(config, "rope_scaling", None) or {}
    if architecture != "DeepseekV2ForCausalLM" or not scaling.get("mscale_all_dim"):
        return None
    return (
        f"DeepSeek-V2's YaRN (mscale_all_dim {scaling['mscale_all_dim']}): transformers 5 computes the model's "
        "logits; transformers 4.x's DeepseekV2Attention leaves out YaRN's attention scale and computes others "
        '(docs/models.md, "From and to Hugging Face"): load the export with transformers >= 5'
    )


def hf_config(config, impl: Implementation, dtype: str) -> dict:
    """The transformers ``config.json`` of ``impl.hf.architecture`` for paddlenlp ``config``; RoPE in the
    forms of both transformers 4.x and 5 (``rope_config_fields``)."""
    assert impl.hf is not None  # export refuses a type without a Hugging Face format
    fields = impl.hf.config(config)
    rope = fields.pop("rope_parameters", None)
    return {
        "architectures": [impl.hf.architecture],
        "model_type": impl.hf.model_type,
        **fields,
        **(rope_config_fields(rope) if rope else {}),
        **_special_ids(config),
        "torch_dtype": dtype,
        "use_cache": True,
    }


def write_tokenizer(model_dir: str, folder: str) -> list:
    """Copy the tokenizer of ``model_dir`` in the form transformers reads; returns the files written.

    SentencePiece (paddlenlp ``LlamaTokenizer``): ``tokenizer.model`` + ``tokenizer_config.json`` naming
    ``LlamaTokenizer``; GPT-2 BPE (``GPTTokenizer``): ``vocab.json`` + ``merges.txt`` naming ``GPT2Tokenizer``;
    tiktoken (``QWenTokenizer``, ``Llama3Tokenizer``): ``tokenizer.json`` + ``tokenizer_config.json`` +
    ``special_tokens_map.json`` of a ``PreTrainedTokenizerFast`` (``write_tiktoken_tokenizer``); a Hugging Face
    ``tokenizer.json`` folder of another class (``pretrain.tokenizer_json``): its own files, as they are.

    Raises:
        UserError: another tokenizer class; see ``write_tiktoken_tokenizer``.
    """
    config_path = os.path.join(model_dir, "tokenizer_config.json")
    if not os.path.isfile(config_path):
        return []
    with open(config_path, encoding="utf-8") as f:
        tokenizer_config = json.load(f)
    tokenizer_class = tokenizer_config.get("tokenizer_class", "")
    keep = ("bos_token", "eos_token", "unk_token", "pad_token", "add_bos_token", "add_eos_token", "model_max_length")
    hf_tokenizer = {key: tokenizer_config[key] for key in keep if key in tokenizer_config}
    if tokenizer_class in ("LlamaTokenizer", "LlamaTokenizerFast"):
        model_files = glob.glob(os.path.join(model_dir, "*.model"))
        if not model_files:
            raise UserError(f"{model_dir}: LlamaTokenizer without its SentencePiece .model file")
        shutil.copyfile(model_files[0], os.path.join(folder, "tokenizer.model"))
        # legacy: the SentencePiece model's own encoding, as paddlenlp's LlamaTokenizer does.
        hf_tokenizer.update(tokenizer_class="LlamaTokenizer", legacy=True)
        written = ["tokenizer.model"]
    elif tokenizer_class in ("GPTTokenizer", "GPTTokenizerFast", "GPT2Tokenizer"):
        for name in ("vocab.json", "merges.txt"):
            shutil.copyfile(os.path.join(model_dir, name), os.path.join(folder, name))
        hf_tokenizer.update(tokenizer_class="GPT2Tokenizer")
        written = ["vocab.json", "merges.txt"]
    elif tokenizer_class in ("QWenTokenizer", "Llama3Tokenizer"):
        return write_tiktoken_tokenizer(model_dir, hf_tokenizer, folder)
    elif os.path.isfile(os.path.join(model_dir, "tokenizer.json")):  # a Hugging Face folder: as it came
        from pretrain.tokenizer_folder import read_tokenizer_folder
        from pretrain.tokenizer_json import TokenizerJson

        return [
            os.path.basename(path) for path in TokenizerJson(read_tokenizer_folder(model_dir)).save_pretrained(folder)
        ]
    else:
        raise UserError(
            f"{config_path}: tokenizer_class {tokenizer_class!r} has no transformers conversion here (SentencePiece "
            "LlamaTokenizer, GPT-2 BPE, Qwen's tiktoken and tokenizer.json folders only); pass --no_tokenizer to "
            "export the model alone"
        )
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(hf_tokenizer, f, indent=2)
    return [*written, "tokenizer_config.json"]


def write_tiktoken_tokenizer(model_dir: str, settings: dict, folder: str) -> list:
    """Write a tiktoken vocabulary (paddlenlp ``QWenTokenizer``: Qwen's; ``Llama3Tokenizer``: Llama 3's) as a
    ``tokenizers`` byte-level BPE that ``AutoTokenizer`` loads as ``PreTrainedTokenizerFast``, encoding text
    to paddlenlp's ids; returns the files.

    transformers' ``TikTokenConverter`` recovers the merges from the ranks (a token's merges rank as the
    token) and splits text with the class's regex (paddlenlp's ``PAT_STR``); its special tokens
    (``SPECIAL_TOKENS``: Qwen's ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` and 205 extras; Llama 3's
    256) follow the ranks, matched in text as paddlenlp does, and text is NFC-normalised first, as both
    classes' ``tokenize`` do. With ``add_bos_token`` (``Llama3Tokenizer``'s default) the BOS token starts
    every sequence, as paddlenlp puts it.
    ``settings``: what ``write_tokenizer`` keeps of the paddlenlp ``tokenizer_config.json`` (``eos_token``, ...).

    Raises:
        UserError: transformers is not installed; the ranks are not the ids 0..n-1 tiktoken gives.
    """
    try:
        from paddlenlp.transformers.llama import tokenizer as llama3
        from paddlenlp.transformers.qwen import tokenizer as qwen
        from tokenizers import normalizers, processors
        from transformers import PreTrainedTokenizerFast
        from transformers.convert_slow_tokenizer import TikTokenConverter
    except ImportError as e:
        raise UserError(
            f"{model_dir}: writing a tiktoken tokenizer for transformers needs transformers ({e}); install "
            "requirements-dev.txt, or pass --no_tokenizer to export the model alone"
        ) from e
    source = read_tokenizer_folder(model_dir)
    constants = {"QWenTokenizer": qwen, "Llama3Tokenizer": llama3}[source.tokenizer_class]
    vocab_file, special_tokens = source.files["vocab_file"], list(constants.SPECIAL_TOKENS)
    with tiktoken_uncached():
        converter = TikTokenConverter(vocab_file, pattern=constants.PAT_STR, additional_special_tokens=special_tokens)
        tokenizer = converter.converted()
    tokenizer.normalizer = normalizers.NFC()
    ranks = tokenizer.get_vocab_size(with_added_tokens=False)
    if [tokenizer.token_to_id(token) for token in special_tokens] != list(range(ranks, ranks + len(special_tokens))):
        raise UserError(f"{vocab_file}: the ranks are not the ids 0..{ranks - 1}; fetch the tiktoken file anew")
    kwargs = {key: value.get("content") if isinstance(value, dict) else value for key, value in settings.items()}
    bos = kwargs.get("bos_token")
    if kwargs.get("add_bos_token") and bos is not None:
        single, pair = f"{bos} $A", f"{bos} $A {bos} $B"
        bos_id = [(bos, tokenizer.token_to_id(bos))]
        tokenizer.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=bos_id)
    files = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **kwargs).save_pretrained(folder)
    return sorted(os.path.basename(path) for path in files)


def export_problem(config, impl: Implementation) -> Optional[str]:
    """Why a model of paddlenlp ``config`` (of ``impl``'s model type) cannot be exported to a transformers folder
    ("cannot export to Hugging Face transformers: ..."), or None."""
    if impl.hf is None:
        why = f"model_type {config.model_type} has no HFFormat in pretrain.registry"
    else:
        why = impl.hf.unexportable(config)
    return f"cannot export to Hugging Face transformers: {why}" if why else None


def export(
    source: str, output: str, dtype: Optional[str] = None, max_shard_size: str = "5GB", tokenizer: bool = True
) -> dict:
    """Export the model saved in ``source`` to a transformers folder ``output``; returns a summary
    (``model_dir``, ``architecture``, ``dtype``, ``shards``, ``total_bytes``, ``files``, ``tokenizer_files``,
    ``flushed``: ``write_shards``' values written as 0, ``warnings``: the lines logged).

    Logged as warnings, one line each: config.json's begin/end-of-text ids that are not the saved tokenizer's (the
    tokenizer's are written: ``adopt_tokenizer_ids``), values ``dtype`` writes as 0 (``flushed_warning``), a model
    transformers 4.x computes otherwise (``transformers_version_warning``).

    Args:
        source: a run's output_dir, a checkpoint folder, or any save_pretrained folder (``model_folder``).
        output: a new (or empty) folder; written aside (``pretrain.atomic.atomic_folder``) and renamed when complete.
        dtype: ``float32``, ``float16`` or ``bfloat16``; None keeps the saved config's ``dtype``.
        max_shard_size: largest safetensors shard, e.g. ``5GB`` (``parse_size``).
        tokenizer: also write the tokenizer's files (``write_tokenizer``).

    Raises:
        UserError: ``output`` is a file or a folder that is not empty; no model in ``source``; a model no
            transformers class can express (``HFFormat.unexportable``: Baichuan-13B's ALiBi, ...); an unknown
            dtype; a tensor with NaN/inf or past ``dtype``'s range (``cast_finite``). Nothing is left at
            ``output`` then.
    """
    max_bytes = parse_size(max_shard_size)
    if os.path.exists(output) and not os.path.isdir(output):
        raise UserError(f"--output {output} is a file; give a new folder (the export writes several files into it)")
    if os.path.isdir(output) and os.listdir(output):
        raise UserError(f"--output {output} exists and is not an empty folder; give a new folder")
    model_dir = model_folder(source)
    config = load_local_config(model_dir)
    impl = implementation_for(config.model_type, os.path.join(model_dir, CONFIG_NAME))
    why = export_problem(config, impl)
    if why or impl.hf is None:
        raise UserError(f"{model_dir}: {why}")
    dtype = dtype or getattr(config, "dtype", None) or "float32"
    if dtype not in DTYPES:
        raise UserError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")

    warnings = [adopt_tokenizer_ids(model_dir, config), transformers_version_warning(config, impl.hf.architecture)]
    with atomic_folder(output.rstrip("/")) as partial:
        tensors = hf_tensors(saved_tensors(model_dir, config, impl), config, impl)
        index, flushed = write_shards(tensors, partial, max_bytes, DTYPES[dtype])
        with open(os.path.join(partial, CONFIG_NAME), "w", encoding="utf-8") as f:
            json.dump(hf_config(config, impl, dtype), f, indent=2)
        with open(os.path.join(partial, "generation_config.json"), "w", encoding="utf-8") as f:
            json.dump(_special_ids(config), f, indent=2)
        tokenizer_files = write_tokenizer(model_dir, partial) if tokenizer else []
    warnings = [line for line in (*warnings, flushed_warning(flushed, dtype)) if line]
    for line in warnings:
        logger.warning(line)
    return {
        "model_dir": model_dir,
        "architecture": impl.hf.architecture,
        "dtype": dtype,
        "shards": len(set(index["weight_map"].values())),
        "total_bytes": index["metadata"]["total_size"],
        "files": sorted(os.listdir(output)),
        "tokenizer_files": tokenizer_files,
        "flushed": flushed,
        "warnings": warnings,
    }
