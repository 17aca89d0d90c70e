"""The LoRA adapter: paddlenlp.peft's LoRAConfig/LoRAModel around a saved causal LM, its size, its merge.

- ``lora_config``: ``LoRAArguments`` as a ``paddlenlp.peft.LoRAConfig``;
- ``adapter_parameter_count``: adapter size from the model config alone (preflight, dry run), for
  the LLaMA-style families (llama, baichuan, qwen2), whose linear layers ``linear_layer_shapes`` lists;
- ``build_lora_model``: the plan's saved model (``pretrain.model.build_model``) wrapped in ``LoRAModel``,
  which freezes every base weight;
- ``parameter_counts``: trainable and total parameters of a built model;
- ``load_lora_model``: a saved base model plus a saved adapter (``tools/merge_lora.py``);
- ``save_merged``: paddlenlp's ``LoRAModel.merge`` (W += A @ B x alpha / r), then the base model's
  ``save_pretrained`` without the A and B tensors, with the tokenizer: a model directory that
  ``AutoModelForCausalLM.from_pretrained`` loads. (paddlenlp's ``restore_original_model`` would
  leave a zero bias on every bias-free layer it restores.)

An adapter saved by paddlenlp is ``lora_model_state.pdparams`` (the A and B matrices only) plus
``lora_config.json``; paddlenlp's Trainer writes both into every checkpoint and, at the end, into
output_dir, and loads them back on resume.
"""

from __future__ import annotations

import os
import pickle
import re
from typing import Optional

import numpy as np
import paddle
from paddlenlp.peft import LoRAConfig, LoRAModel
from paddlenlp.transformers import PretrainedConfig

from pretrain.atomic import atomic_folder
from pretrain.errors import UserError
from pretrain.model import build_model
from pretrain.param_count import decoder_shape
from pretrain.precision import Precision
from pretrain.registry import implementation_for
from pretrain.use import load_model


def lora_config(lora_args, training_args, tensor_parallel_degree: int, base_model: str) -> LoRAConfig:
    """paddlenlp's ``LoRAConfig`` for ``LoRAArguments``; the adapter's dtype is the model's
    (``Precision.param_dtype``)."""
    return LoRAConfig(
        target_modules=list(lora_args.lora_target_modules),
        r=lora_args.lora_rank,
        lora_alpha=lora_args.lora_alpha,
        lora_dropout=lora_args.lora_dropout,
        dtype=Precision.from_arguments(training_args).param_dtype,
        tensor_parallel_degree=tensor_parallel_degree,
        base_model_name_or_path=base_model,
    )


def linear_layer_shapes(config: PretrainedConfig) -> Optional[dict]:
    """``{sublayer name: (in_features, out_features)}`` of every linear layer in the decoder layers
    of a LLaMA-style model (its registry record's ``lora_layers``; paddlenlp's names, e.g.
    ``llama.layers.0.self_attn.q_proj``); None for other model types. (The output head is not an
    ``nn.Linear`` in these models: LoRA never adapts it.)

    Fused projections replace their parts when the config fuses them: ``qkv_proj`` for
    q/k/v (``fuse_attention_qkv``), ``gate_up_fused_proj`` for gate/up (``fuse_attention_ffn``).
    """
    prefix = implementation_for(config.model_type).lora_layers
    if prefix is None:
        return None
    shape = decoder_shape(config)
    d, q, kv, f = shape.hidden_size, shape.query_size, shape.key_value_size, shape.mlp_width
    if getattr(config, "fuse_attention_qkv", False):
        attention = {"self_attn.qkv_proj": (d, q + 2 * kv)}
    else:
        attention = {"self_attn.q_proj": (d, q), "self_attn.k_proj": (d, kv), "self_attn.v_proj": (d, kv)}
    attention["self_attn.o_proj"] = (q, d)
    if getattr(config, "fuse_attention_ffn", False):
        mlp = {"mlp.gate_up_fused_proj": (d, 2 * f)}
    else:
        mlp = {"mlp.gate_proj": (d, f), "mlp.up_proj": (d, f)}
    mlp["mlp.down_proj"] = (f, d)
    return {
        f"{prefix}.{layer}.{name}": in_out
        for layer in range(config.num_hidden_layers)
        for name, in_out in {**attention, **mlp}.items()
    }


def unmatched_targets(config: PretrainedConfig, target_modules: list) -> Optional[list]:
    """The patterns of ``target_modules`` that match (``re.fullmatch``) no linear layer of
    ``linear_layer_shapes(config)``; None when the model type's layers are not listed there."""
    shapes = linear_layer_shapes(config)
    if shapes is None:
        return None
    return [pattern for pattern in target_modules if not any(re.fullmatch(pattern, name) for name in shapes)]


def adapter_parameter_count(config: PretrainedConfig, lora_args) -> Optional[int]:
    """Parameters of the adapter ``lora_args`` puts on the model ``config`` describes, without building it:
    r x (in + out) for every linear layer a target pattern matches (A is [in, r], B is [r, out]).
    None when ``linear_layer_shapes`` does not know the model type."""
    shapes = linear_layer_shapes(config)
    if shapes is None:
        return None
    patterns = list(lora_args.lora_target_modules)
    matched = [in_out for name, in_out in shapes.items() if any(re.fullmatch(p, name) for p in patterns)]
    return sum(lora_args.lora_rank * (fan_in + fan_out) for fan_in, fan_out in matched)


def parameter_counts(model: paddle.nn.Layer) -> tuple:
    """(trainable, total) parameters of a built model (elements): trainable = ``stop_gradient`` False."""
    trainable = total = 0
    for parameter in model.parameters():
        size = int(np.prod(parameter.shape))
        total += size
        trainable += 0 if parameter.stop_gradient else size
    return trainable, total


def build_lora_model(plan) -> LoRAModel:
    """The plan's saved model (``build_model``; preflight has checked ``continue_training``) wrapped in
    ``LoRAModel`` with ``lora_config(plan.lora_args, ...)``: base weights frozen, adapter trainable.

    Raises:
        UserError: no ``lora_target_modules`` pattern matched a linear layer, or paddlenlp refused the config.
    """
    config = lora_config(
        plan.lora_args, plan.training_args, plan.model_config.tensor_parallel_degree, plan.model_args.model_name_or_path
    )
    try:
        model = LoRAModel(build_model(plan), config)
    except (ValueError, TypeError) as e:
        raise UserError(f"lora_target_modules: paddlenlp's LoRAModel refused {config.target_modules} ({e})") from e
    if parameter_counts(model)[0] == 0:
        raise UserError(
            f"lora_target_modules: {config.target_modules} match no linear layer of "
            f"{plan.model_args.model_name_or_path}; patterns are matched in full against names such as "
            "llama.layers.0.self_attn.q_proj (e.g. '.*q_proj')"
        )
    return model


def load_lora_model(base_dir: str, adapter_dir: str) -> LoRAModel:
    """The causal LM saved in ``base_dir`` with the adapter saved in ``adapter_dir``
    (``lora_model_state.pdparams`` + ``lora_config.json``: run_finetune.py's output_dir or a checkpoint),
    the base loaded in the adapter's dtype (``lora_config.json``), as the two were trained.

    Raises:
        UserError: a folder lacks its files; the adapter file is damaged (``load_adapter_state``); or the
            adapter does not fit the base model (see ``check_adapter_fits``): nothing is loaded then.
    """
    needed = ((base_dir, "config.json"), (adapter_dir, "lora_config.json"), (adapter_dir, "lora_model_state.pdparams"))
    for folder, name in needed:
        if not os.path.isfile(os.path.join(folder, name)):
            raise UserError(
                f"{folder} has no {name}; give the base model's folder and a folder run_finetune.py wrote "
                "(its output_dir or a checkpoint-<step>)"
            )
    config = LoRAConfig.from_pretrained(adapter_dir)
    base = load_model(base_dir, config.dtype or paddle.get_default_dtype())  # computing what training computed
    # paddlenlp's LoRAModel.from_pretrained skips, with a warning only, every tensor whose name or shape
    # does not fit: the adapter would then be merged as initialised (B = 0, a no-op). Load it here instead.
    model = LoRAModel(base, config)
    state = load_adapter_state(os.path.join(adapter_dir, "lora_model_state.pdparams"))
    check_adapter_fits(model, state, base_dir, adapter_dir)
    model.set_state_dict(state)
    return model


def load_adapter_state(path: str) -> dict:
    """The tensors of a saved adapter file (``lora_model_state.pdparams``), as numpy arrays.

    Raises:
        UserError: the file is cut short or is not a paddle state dict (paddle's unpickler raises
            one of several errors then).
    """
    try:
        state = paddle.load(path, return_numpy=True)
    except (EOFError, ValueError, RuntimeError, pickle.UnpicklingError, UnicodeDecodeError) as e:
        raise UserError(
            f"{path} is damaged or not a paddle state dict ({type(e).__name__}: {str(e)[:80]}); "
            "use another checkpoint-<step> of the run or train the adapter again"
        ) from e
    if not isinstance(state, dict):
        raise UserError(f"{path} holds a {type(state).__name__}, not a paddle state dict; give the adapter's file")
    return state


def check_adapter_fits(model: LoRAModel, state: dict, base_dir: str, adapter_dir: str) -> None:
    """Check that the saved adapter ``state`` fills every adapter tensor of ``model`` (the base model in
    ``base_dir`` wrapped with the adapter's ``lora_config.json``) with a tensor of its shape, and holds
    nothing else.

    Raises:
        UserError: a tensor of ``model``'s adapter is missing from ``state`` or has another shape there
            (both shapes named), or ``state`` holds a tensor that matches none of ``model``'s.
    """
    expected = {name: list(value.shape) for name, value in model.get_trainable_state_dict().items()}
    saved = {name: list(np.shape(value)) for name, value in state.items()}
    trained_on = model.lora_config.base_model_name_or_path
    fix = f"give the base model it was trained on{f' ({trained_on})' if trained_on else ''}"
    where = f"the adapter in {adapter_dir} does not fit the base model {base_dir}"
    missing = [name for name in expected if name not in saved]
    unknown = [name for name in saved if name not in expected]
    wrong = [name for name in expected if name in saved and saved[name] != expected[name]]
    if wrong:
        name = wrong[0]
        raise UserError(
            f"{where}: {name} is {saved[name]} in the adapter but {expected[name]} in the base model "
            f"({len(wrong)} of {len(expected)} tensors differ); {fix}"
        )
    if missing:
        raise UserError(
            f"{where}: the base model has {len(missing)} adapter tensors that the adapter lacks, "
            f"e.g. {missing[0]}; {fix}"
        )
    if unknown:
        raise UserError(
            f"{where}: {len(unknown)} of the adapter's tensors match no layer of the base model, "
            f"e.g. {unknown[0]}; {fix}"
        )


def save_merged(model: LoRAModel, tokenizer, output_dir: str) -> str:
    """Merge the adapter into the base weights (paddlenlp's ``LoRAModel.merge``: W += A @ B x alpha / r)
    and save the base model with those weights, without the adapter's A and B, plus the tokenizer, to
    ``output_dir``: a folder ``AutoModelForCausalLM.from_pretrained`` loads. Returns ``output_dir``.

    The folder is written aside and renamed into place when complete (``pretrain.atomic.atomic_folder``):
    a full disk leaves no half-written model. The LoRA layers stay merged afterwards (their forward
    uses the merged weight alone).
    """
    model.merge()
    base = model.model
    state_dict = {name: value for name, value in base.state_dict().items() if ".lora_" not in name}
    with atomic_folder(output_dir) as partial:
        base.save_pretrained(partial, state_dict=state_dict)
        tokenizer.save_pretrained(partial)
    return output_dir
