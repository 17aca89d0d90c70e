"""Starting a run from a Hugging Face ``transformers`` folder (``model_name_or_path`` + ``continue_training``).

A folder is a Hugging Face one when its config.json names an architecture some implementation imports
(``registry.HFFormat.imports``: LlamaForCausalLM, Qwen2ForCausalLM, QWenLMHeadModel, GPT2LMHeadModel,
Qwen2MoeForCausalLM, MixtralForCausalLM)
and its weights are in torch layout: safetensors whose metadata says ``format: pt`` (what
transformers writes), or ``pytorch_model*.bin``. paddlenlp's own folders (``format: np``, or
``model_state.pdparams``) keep their usual path.

The weights are converted as they load, one Hugging Face file at a time, with paddlenlp's own name
mappings (``model_class._get_name_mappings``: rename, transpose, GPT-2's q/k/v split), fused for a
run with ``fuse_attention_qkv/ffn`` (``convert_fuse_and_split``) and split for tensor parallelism
(``get_tensor_parallel_convert_actions``), each rank keeping what its model holds (pipeline stages too;
under expert parallelism its own experts: ``other_ranks_experts``). Values are only cast to the run's
dtype: float32 (or a bfloat16/float16 run of a checkpoint of that dtype) is bit-exact, so
``learning_rate 0`` then tools/export_hf.py returns the same tensors.

RoPE comes in two config.json forms (``read_rope``): transformers >= 5 writes ``rope_parameters``
(``rope_type``, ``rope_theta`` and the scaling's keys), 4.x writes top-level ``rope_theta`` and
``rope_scaling``. Both are read into the first; an export writes both (``rope_config_fields``).
"""

from __future__ import annotations

import copy
import glob
import json
import os
from typing import Iterator, Optional

import numpy as np
from paddlenlp.utils.env import CONFIG_NAME

from pretrain.errors import UserError
from pretrain.registry import IMPLEMENTATIONS, Implementation

# Tensors a transformers checkpoint may hold that paddlenlp's models recompute (RoPE frequencies,
# GPT-2's causal-mask buffers).
RECOMPUTED = (".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")


def _read_config(path: str) -> dict:
    config_file = os.path.join(path, CONFIG_NAME)
    try:
        with open(config_file, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return {}


# transformers' default RoPE base (LlamaConfig, Qwen2Config, and 5.x's ``default_theta``).
DEFAULT_ROPE_THETA = 10000.0


def read_rope(hf_config: dict, config_file: str) -> dict:
    """The RoPE of a transformers config.json as transformers >= 5 holds it: ``{"rope_type": "default" |
    "linear" | "dynamic" | "llama3" | ..., "rope_theta": base, **the scaling's keys ("factor", ...)}``.

    Both forms are read, as transformers 5 reads them: ``rope_parameters`` (5.x), or the 4.x top-level
    ``rope_theta`` and ``rope_scaling`` (its type under ``type`` or ``rope_type``; null: no scaling). A
    config without either gets ``{"rope_type": "default", "rope_theta": DEFAULT_ROPE_THETA}``.

    Raises:
        UserError: both forms are present and disagree (one line naming ``config_file``, both keys and
            values); ``rope_parameters`` given per layer type (paddlenlp computes one RoPE for every layer).
    """
    new = hf_config.get("rope_parameters") or {}
    if any(isinstance(value, dict) for value in new.values()):
        raise UserError(
            f"{config_file}: rope_parameters {new} differ by layer type; paddlenlp's models compute one RoPE for "
            "every layer"
        )
    old = dict(hf_config.get("rope_scaling") or {})
    if "type" in old:
        old.setdefault("rope_type", old.pop("type"))
    if "rope_theta" in hf_config:
        old["rope_theta"] = hf_config["rope_theta"]
    for key in set(old) & set(new):
        if old[key] != new[key]:
            where = "rope_theta" if key == "rope_theta" else f"rope_scaling.{key}"
            raise UserError(
                f"{config_file}: {where} {old[key]!r} and rope_parameters.{key} {new[key]!r} disagree (the "
                "transformers 4.x and 5 forms of the same RoPE); keep one of them"
            )
    return {"rope_type": "default", "rope_theta": DEFAULT_ROPE_THETA, **old, **new}


def rope_config_fields(rope: dict) -> dict:
    """The config.json fields of RoPE ``rope`` (``read_rope``'s form) that both transformers 4.x and 5 read:
    ``rope_parameters`` (5.x's form) and the same values as 4.x's ``rope_theta`` and ``rope_scaling`` (null
    without scaling), which 5.x also reads (``convert_rope_params_to_dict``)."""
    scaling = {key: value for key, value in rope.items() if key != "rope_theta"}
    return {
        "rope_theta": rope["rope_theta"],
        "rope_scaling": scaling if scaling["rope_type"] != "default" else None,
        "rope_parameters": rope,
    }


def _safetensors_formats(path: str) -> dict:
    """``{file: its metadata's "format" (None: none)}`` of ``path``'s safetensors files, sorted by name; an
    unreadable file is left out (the loader that reads it reports it)."""
    from safetensors import SafetensorError, safe_open

    formats = {}
    for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        try:
            with safe_open(file, framework="np") as f:
                formats[file] = (f.metadata() or {}).get("format")
        except (OSError, SafetensorError):
            continue
    return formats


def weight_files(path: str) -> list:
    """The torch-layout weight files of ``path`` (safetensors with ``format: pt``, ``pytorch_model*.bin``), sorted.

    An unreadable safetensors file is not counted (the loader that reads it reports it)."""
    files = [file for file, found in _safetensors_formats(path).items() if found == "pt"]
    return files or sorted(glob.glob(os.path.join(path, "pytorch_model*.bin")))


def read_hf_tensor(path: str, name: str) -> np.ndarray:
    """The array of tensor ``name`` of the Hugging Face folder ``path``, from the file that holds it.

    Raises:
        UserError: no file of ``path`` holds ``name``.
    """
    from safetensors import safe_open

    for file in weight_files(path):
        if not file.endswith(".safetensors"):
            state = _read_hf_file(file)
            if name in state:
                return state[name]
            continue
        with safe_open(file, framework="np") as f:
            if name in f.keys():
                return f.get_tensor(name)
    raise UserError(f"continue_training: {path} has no tensor {name}")


def hf_implementation(path: str) -> Optional[Implementation]:
    """The implementation that imports the Hugging Face folder ``path``, or None when ``path`` is not one.

    Raises:
        UserError: config.json names an architecture a family imports (a name paddlenlp's own folders use too)
            and a safetensors file says neither ``format: pt`` (transformers') nor ``np`` (paddlenlp's): torch's
            [out, in] and paddle's [in, out] layouts cannot be told apart, and a square weight would load
            transposed without an error (measured: an ERNIE-4.5-MoE folder without the metadata loaded with
            logits 2.9 off).
    """
    architectures = _read_config(path).get("architectures") or []
    for impl in IMPLEMENTATIONS.values():
        if impl.hf and set(architectures) & set(impl.hf.imports):
            unlabelled = [file for file, found in _safetensors_formats(path).items() if found not in ("pt", "np")]
            if unlabelled:
                raise UserError(
                    f"{unlabelled[0]}: its safetensors metadata has no format 'pt' (transformers) or 'np' "
                    f"(paddlenlp), so its weights' layout cannot be told; save the folder again with "
                    f"{impl.hf.imports[0]}.save_pretrained (transformers writes format 'pt')"
                )
            if weight_files(path):
                return impl
    return None


def load_hf_config(path: str, impl: Implementation):
    """The paddlenlp config of the Hugging Face folder ``path`` (paddlenlp's config class reads
    transformers' keys; GPT-2's through its ``attribute_map``), as a paddlenlp causal LM. ``HFFormat``'s
    ``unimportable`` and ``config_from_hf`` see the RoPE as ``rope_parameters`` (``read_rope``), whichever
    form the folder was saved in.

    Raises:
        UserError: the config uses something paddlenlp's class cannot compute (``HFFormat.unimportable``: a
            RoPE scaling the family's paddlenlp model does not implement, ...); see ``read_rope``.
    """
    assert impl.hf is not None  # hf_implementation picks a type with a Hugging Face format
    config_file = os.path.join(path, CONFIG_NAME)
    hf = _read_config(path)
    hf = {**hf, "rope_parameters": read_rope(hf, config_file)}  # both forms, as HFFormat reads them
    why = impl.hf.unimportable(hf)
    if why:
        raise UserError(f"{config_file}: cannot start from this Hugging Face model: {why}")
    config = impl.config_class.from_pretrained(path)
    config.model_type, config.architectures = impl.model_type, [impl.model_class.__name__]
    # transformers 5's key, read above: paddlenlp's classes read rope_theta and rope_scaling(_type/_factor),
    # which config_from_hf sets, so the run's config.json holds one RoPE.
    config.__dict__.pop("rope_parameters", None)
    for name, value in impl.hf.config_from_hf(hf).items():
        setattr(config, name, value)
    return config


def _read_hf_file(path: str) -> dict:
    """``{name: numpy array}`` of one Hugging Face weight file (bfloat16 as ml_dtypes.bfloat16)."""
    if path.endswith(".safetensors"):
        from safetensors.numpy import load_file

        return load_file(path)
    from paddlenlp.utils.serialization import load_torch

    return load_torch(path)


def mapping_config(config, impl: Implementation):
    """``config`` with the ``architectures`` paddlenlp's name mappings expect for a causal LM with a head
    (they prefix names and add ``lm_head`` by it)."""
    with_head = copy.deepcopy(config)
    with_head.architectures = [impl.model_class.__name__]
    return with_head


def paddle_shapes(model) -> dict:
    """``{name: shape}`` of a paddlenlp model's state dict (single-model names, also for a pipeline stage)."""
    return {name: tuple(value.shape) for name, value in model.state_dict().items()}


def expected_hf_shapes(config, impl: Implementation, shapes: dict) -> dict:
    """``{transformers name: shape}`` the folder must hold for a model whose paddlenlp (unsplit, unfused)
    state dict has ``shapes``: each mapping's paddlenlp shape, transposed back or its q/k/v split joined (and
    ``HFFormat.hf_shape``'s)."""
    assert impl.hf is not None  # only a type with a Hugging Face format is imported
    expected = {}
    for mapping in impl.model_class._get_name_mappings(mapping_config(config, impl)):
        shape = shapes.get(mapping.target_name)
        if shape is None:
            continue
        if mapping.action == "transpose":
            shape = shape[::-1]
        elif mapping.action == "split":
            shape = (*shape[:-1], 3 * shape[-1])
        expected[mapping.source_name] = impl.hf.hf_shape(mapping.source_name, tuple(shape))
    return expected


def hf_header_shapes(path: str) -> dict:
    """``{name: shape}`` of the safetensors files of ``path``, read from their headers (no tensor data)."""
    from safetensors import safe_open

    shapes = {}
    for file in weight_files(path):
        if file.endswith(".safetensors"):
            with safe_open(file, framework="np") as f:
                for name in f.keys():
                    shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def shape_problem(path: str, config, impl: Implementation) -> Optional[str]:
    """Preflight: the first tensor of the Hugging Face folder ``path`` whose shape does not fit the run's
    architecture ``config`` (or that is missing), as one line; None when all fit.

    The expected shapes come from the paddlenlp model of ``config`` built without memory
    (``paddle.LazyGuard``) and paddlenlp's mappings. ``pytorch_model*.bin`` folders are checked as they load.
    """
    header = hf_header_shapes(path)
    if not header:
        return None
    unsplit, shapes, elsewhere = _unsplit_shapes(config, impl)
    for name, shape in expected_hf_shapes(unsplit, impl, {**shapes, **elsewhere}).items():
        if name not in header:
            return (
                f"continue_training: {path} has no tensor {name} (shape {list(shape)}), which its {CONFIG_NAME} needs"
            )
        if header[name] != shape:
            return (
                f"continue_training: tensor {name} of {path} has shape {list(header[name])}, but this run's "
                f"architecture needs {list(shape)}; the weights do not fit its {CONFIG_NAME}"
            )
    return None


def _unsplit_shapes(config, impl: Implementation) -> tuple:
    """(``config`` unsplit and unfused, ``paddle_shapes`` of its paddlenlp model on this rank, ``{name: shape}`` of
    the experts that model leaves to other ranks: ``other_ranks_experts``), built without memory
    (``paddle.LazyGuard``)."""
    import paddle
    from paddlenlp.transformers.model_utils import no_init_weights

    unsplit = copy.deepcopy(config)
    unsplit.tensor_parallel_degree, unsplit.fuse_attention_qkv, unsplit.fuse_attention_ffn = 1, False, False
    with no_init_weights(_enable=True), paddle.LazyGuard():
        model = impl.model_class(unsplit)
    shapes = paddle_shapes(model)
    return unsplit, shapes, other_ranks_experts(model, shapes)


def other_ranks_experts(model, shapes: dict) -> dict:
    """``{name: shape}`` of the expert weights ``model`` (this rank's paddlenlp model, whose state dict has
    ``shapes``) leaves to the other ranks of its expert-parallel group; empty without expert parallelism.

    paddlenlp 3.0.0b4's ``MoELayer`` (Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3) builds expert i on rank i // (experts per
    rank) of the group and puts None in its ``experts`` list for every other (``transformers/moe_layer.py:185``),
    so this rank's state dict names its own experts by their global index, as the unified checkpoint and a
    transformers folder do. Every expert of a layer has the same class and arguments, hence the shapes of
    this rank's first one."""
    from paddlenlp.transformers.moe_layer import MoELayer

    elsewhere = {}
    for path, layer in model.named_sublayers():
        if not isinstance(layer, MoELayer) or layer.expert_parallel_degree <= 1:
            continue
        prefix = f"{path}.experts."
        local = next(i for i, expert in enumerate(layer.experts) if expert is not None)
        own = {
            name[len(f"{prefix}{local}.") :]: shape
            for name, shape in shapes.items()
            if name.startswith(f"{prefix}{local}.")
        }
        for index, expert in enumerate(layer.experts):
            if expert is None:
                elsewhere.update({f"{prefix}{index}.{rest}": shape for rest, shape in own.items()})
    return elsewhere


def converted_tensors(path: str, config, impl: Implementation) -> Iterator[tuple]:
    """``(paddlenlp name, numpy array)`` of the Hugging Face folder ``path`` for a model of ``config``:
    renamed and laid out by paddlenlp's mappings, fused as ``config`` fuses, split for its tensor-parallel rank.

    The mappings are those of tensors the model of ``config`` has: DeepSeek-V2's name every tensor any of its
    configs could have (q_proj and q_a_proj, experts in dense layers, V3's routing bias, MTP layers). Under
    expert parallelism the experts of other ranks (``other_ranks_experts``) are read past, not converted.

    Raises:
        UserError: a tensor the mappings do not name (not recomputed by paddlenlp), or one missing.
    """
    assert impl.hf is not None  # hf_implementation picks a type with a Hugging Face format
    _, held, elsewhere = _unsplit_shapes(config, impl)
    all_mappings = impl.model_class._get_name_mappings(mapping_config(config, impl))
    mappings = [m for m in all_mappings if m.target_name in held]
    other_ranks = {m.source_name for m in all_mappings if m.target_name in elsewhere}
    by_source = {}
    for mapping in mappings:
        by_source.setdefault(mapping.source_name, []).append(mapping)
    unfused = copy.deepcopy(config)
    unfused.fuse_attention_qkv, unfused.fuse_attention_ffn = False, False
    fuses = getattr(config, "fuse_attention_qkv", False) or getattr(config, "fuse_attention_ffn", False)
    tp_actions = {}
    if config.tensor_parallel_degree > 1:
        impl.install_compat()  # GPT: the tied head's split action (pretrain.compat.gpt)
        names = [m.target_name for m in mappings]
        tp_actions = impl.model_class.get_tensor_parallel_convert_actions(config, names, ignore_error=True)
    carried, seen = {}, set()
    for file in weight_files(path):
        hf_state = _read_hf_file(file)
        if impl.hf.from_hf is not None:
            hf_state = impl.hf.from_hf(hf_state, config, lambda name: read_hf_tensor(path, name))
        state = dict(carried)
        fused = set()
        for source in list(hf_state):
            if source not in by_source:
                if (
                    source in other_ranks
                    or source.endswith(RECOMPUTED)
                    or source == "lm_head.weight"
                    and config.tie_word_embeddings
                ):
                    hf_state.pop(source)
                    continue
                raise UserError(
                    f"continue_training: tensor {source} of {file} has no place in {impl.model_class.__name__}"
                )
            for mapping in by_source[source]:  # GPT-2's c_attn: three mappings, split index 0, 1, 2
                state[mapping.target_name] = np.asarray(mapping.run(hf_state, source))
                seen.add(mapping.target_name)
        if fuses:  # paddlenlp fuses (and splits for its rank) float32 numpy arrays; the cast is exact
            state = {name: array.astype(np.float32) for name, array in state.items()}
            before = set(state)
            state, carried = impl.model_class.convert_fuse_and_split(config, state, tp_actions)
            fused = set(state) - before
        for name, array in state.items():
            if name in carried:
                continue
            action = tp_actions.get(name) if name not in fused else None
            array = action(array) if action else array
            yield name, array.numpy() if hasattr(array, "numpy") else np.asarray(array)
    missing = [m.target_name for m in mappings if m.target_name not in seen and not m.target_name.endswith("inv_freq")]
    if missing:
        raise UserError(f"continue_training: {path} has no tensor for {missing[0]} ({len(missing)} missing in all)")


def load_hf_weights(model, path: str, config, impl: Implementation) -> None:
    """Set the weights of ``model`` (built from ``config``, on this rank) from the Hugging Face folder
    ``path``, cast to each parameter's dtype; tensors of other pipeline stages are skipped. A pipeline model's
    weights shared by stages (tied embeddings: the last stage's head, which a tied folder does not hold) are then
    broadcast from the first stage that holds them, as paddlenlp's ``from_pretrained`` does
    (``_synchronize_shared_weights``; collective over the pipeline ranks). Without it the matrix's Qwen2 PP2 import
    started its last stage from a random head (the suite's cell: first loss 9.0808 against one process's 9.0262).

    Raises:
        UserError: see ``converted_tensors``; a converted shape differs from the parameter's.
    """
    import paddle
    from paddle.distributed.fleet.meta_parallel import PipelineLayer

    targets = model.state_dict()
    state = {}
    for name, array in converted_tensors(path, config, impl):
        if name not in targets:
            continue
        param = targets[name]
        if tuple(array.shape) != tuple(param.shape):
            raise UserError(
                f"continue_training: tensor {name} from {path} has shape {list(array.shape)} after conversion, "
                f"the model needs {list(param.shape)}"
            )
        tensor = paddle.to_tensor(array if array.dtype in (np.float32, np.float16) else array.astype(np.float32))
        state[name] = tensor.astype(param.dtype) if tensor.dtype != param.dtype else tensor
    model.set_state_dict(state)
    if isinstance(model, PipelineLayer):
        model._synchronize_shared_weights()
