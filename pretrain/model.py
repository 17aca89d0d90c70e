"""Building the run's model: the paddlenlp class, the parameter dtype, and saved weights when continuing.

From scratch the model is ``from_config`` (random init); with ``continue_training`` it is
``from_pretrained`` on the directory ``model_name_or_path`` (a run's output_dir, or anything
``save_pretrained`` wrote), or a Hugging Face transformers folder converted as it loads
(``pretrain.hf_import``). Pipeline parallel runs use the family's ``*Pipe`` class.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Optional

import paddle
from paddlenlp.transformers import PretrainedConfig
from paddlenlp.transformers.model_utils import PipelinePretrainedModel, _add_variant
from paddlenlp.utils.env import (
    CONFIG_NAME,
    PADDLE_WEIGHTS_INDEX_NAME,
    PADDLE_WEIGHTS_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
)

from pretrain import mtp
from pretrain.compat import deepseek_attention, rope_tables, weight_init
from pretrain.compat import moe as moe_compat
from pretrain.errors import UserError
from pretrain.hf_import import hf_implementation, load_hf_weights, shape_problem
from pretrain.precision import Precision
from pretrain.registry import implementation_for

# Files save_pretrained writes the weights to (one of them, single-file or sharded with an index).
# Merged (the full model, also what unified_checkpoint writes) they load into any parallel layout:
# paddlenlp splits them for tensor parallelism as it loads. Saved by a tensor- or pipeline-parallel
# run without unified_checkpoint, each rank writes its own part, named with paddlenlp's variant
# "tp{rank:02d}" / "pp{stage:02d}" (``weight_name_suffix``), e.g. model_state.tp01_pp00.pdparams.
WEIGHT_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, PADDLE_WEIGHTS_NAME, PADDLE_WEIGHTS_INDEX_NAME)
PER_RANK_VARIANT = re.compile(r"^(model_state|model)\..*\b(tp\d{2}|pp\d{2}|tp\d{2}_pp\d{2})\.")


def rank_variant(tensor_rank: int, pipeline_stage: int, layout) -> str:
    """The variant paddlenlp inserts into a rank's weight file name (``weight_name_suffix``):
    "tp{rank:02d}" under tensor parallelism, "pp{stage:02d}" under pipeline parallelism, joined by "_"."""
    parts = []
    if layout.tensor_parallel_degree > 1:
        parts.append(f"tp{tensor_rank:0>2d}")
    if layout.pipeline_parallel_degree > 1:
        parts.append(f"pp{pipeline_stage:0>2d}")
    return "_".join(parts)


def saved_weights_problem(path: str, layout, config: Optional[PretrainedConfig] = None) -> Optional[str]:
    """None when the folder ``path`` holds weights every rank of ``layout`` can load, else why not.

    A Hugging Face folder (``pretrain.hf_import``) loads into any layout; its tensors' shapes are
    checked against ``config`` (the run's model config), when given.

    Merged weights (``WEIGHT_FILES``) load into any layout; per-rank weights only into the tensor x
    pipeline layout that wrote them: every rank's variant of one of ``WEIGHT_FILES`` must exist.
    """
    hf_impl = hf_implementation(path)
    if hf_impl is not None:  # a Hugging Face transformers folder: its tensors must fit the architecture
        return shape_problem(path, config, hf_impl) if config is not None else None
    names = set(os.listdir(path))
    if names & set(WEIGHT_FILES):
        return None
    tp, pp = layout.tensor_parallel_degree, layout.pipeline_parallel_degree
    variants = [rank_variant(t, s, layout) for t in range(tp) for s in range(pp)]
    if variants != [""] and all(any(_add_variant(f, v) in names for f in WEIGHT_FILES) for v in variants):
        return None
    per_rank = sorted(name for name in names if PER_RANK_VARIANT.match(name))
    if per_rank:
        return (
            f"continue_training: {path} holds weights saved per rank by another tensor/pipeline layout "
            f"({', '.join(per_rank[:4])}{', ...' if len(per_rank) > 4 else ''}) than this run's TP{tp}PP{pp}; "
            "continue with the layout that saved them, or save them merged (unified_checkpoint true)"
        )
    return (
        f"continue_training: {path} holds no weights (none of {', '.join(WEIGHT_FILES)}); point "
        "model_name_or_path at a directory written by save_pretrained (e.g. a run's output_dir)"
    )


def model_class_for(config: PretrainedConfig, pipeline_parallel_degree: int) -> type[Any]:
    """The paddlenlp causal-LM class for ``config.model_type``: its Pipe class when pipeline_parallel_degree > 1.

    Raises:
        UserError: pipeline_parallel_degree > 1 for a model type without a Pipe class (preflight's layout rules
            say so first).
    """
    impl = implementation_for(config.model_type, "model config")
    if pipeline_parallel_degree <= 1:
        return impl.model_class
    if impl.pipe_class is None:
        raise UserError(f"pipeline_parallel_degree: paddlenlp has no pipeline-parallel class for {config.model_type}")
    return impl.pipe_class


def mark_shared_weights(model: paddle.nn.Layer) -> None:
    """Count a weight shared by pipeline stages (tied embeddings) once in the global gradient norm.

    paddle 3.3.1's ``PipelineLayer`` means to mark the first stage's copy ``is_firstly_shared`` and the
    others not, for ``HybridParallelClipGrad`` to leave the others out of the norm, but compares
    parameter names ("embedding_0.w_0") with attribute names ("embedding_weight") and marks none: every
    stage's copy is counted, the clipped gradient is smaller than one process's, and a PP2 run of a
    tied-embedding model (Qwen2 debug) leaves the 1-process loss curve at the first clipped step after
    the first (measured 2.5e-4 relative at step 3; equal without clipping). Here the marks are set by
    attribute. Does nothing to a model without pipeline-shared weights.
    """
    rank = paddle.distributed.get_rank()
    for comm in getattr(model, "shared_comm", {}).values():
        for attribute in comm["weight_attr"]:
            getattr(comm["layer"], attribute).is_firstly_shared = rank == min(comm["ranks"])


NO_DECAY_PATH_PARTS = ("bias", "norm")  # paddlenlp 3.0.0b4's Trainer.create_optimizer rule, on the path in the model


def weight_decay_rule(model: paddle.nn.Layer) -> Callable[[str], bool]:
    """Which parameters (by ``param.name``) get weight decay: all but biases and the weights of normalisation
    layers, decided as in one process for every layout.

    paddlenlp 3.0.0b4's Trainer exempts a parameter when "bias" or "norm" is in its path in the model. Two cases
    it misses, both fixed here: a normalisation layer whose path has no "norm" (Qwen's ``ln_1``, ``ln_2``,
    ``ln_f``: ``QWenRMSNorm``, decayed in every Qwen run, unlike its own transformers export, a Qwen2 model, whose
    continuation left the Qwen curve at step 2: measured 2.1e-7 relative, 1.5e-5 by step 4); and a pipeline
    model, where the path is the layer's index in the pipeline ("4.weight") unless the norm is a sublayer of the
    pipe layer (LLaMA's ``LlamaRMSNormPipe.norm``): GPT's ``LayerNormPipe`` is the norm itself, so its final
    LayerNorm weight was decayed under PP only (a PP2 run left the 1-process curve at step 2). Here a parameter is
    exempt when its single-model path (a pipeline model's from paddlenlp's own pipeline name mapping) has "bias"
    or "norm" in it, or it belongs to a layer whose class is a normalisation (its name ends in ``Norm`` or
    ``NormPipe``), as Hugging Face's Trainer exempts its ``ALL_LAYERNORM_LAYERS`` (``get_decay_parameter_names``).
    """
    paths = {tensor.name: key for key, tensor in model.named_parameters()}
    if isinstance(model, PipelinePretrainedModel):
        if getattr(model, "_pp_to_single_mapping", None) is None:
            model._set_pipeline_name_mapping()
        single_names = model._pp_to_single_mapping
        paths = {
            tensor.name: single_names[key] for key, tensor in super(PipelinePretrainedModel, model).state_dict().items()
        }
    normalised = {
        parameter.name
        for _, layer in model.named_sublayers(include_self=True)
        if type(layer).__name__.endswith(("Norm", "NormPipe"))
        for parameter in layer.parameters()
    }
    decayed = {
        name
        for name, path in paths.items()
        if name not in normalised and not any(part in path for part in NO_DECAY_PATH_PARTS)
    }
    return decayed.__contains__


def compute_as_trained(model: paddle.nn.Layer, model_type: str) -> paddle.nn.Layer:
    """``model`` (a paddlenlp causal LM of ``model_type``, built or loaded) computing what this application trains:
    for a family with experts paddlenlp's MoE code fixed for this paddle (``moe_compat.apply``: without it paddle
    3.3.1 fails the forward of Qwen2-MoE and DeepSeek with a type-promotion TypeError, of Mixtral with a shape
    error), and DeepSeek's routed output scaled in training with its sequence-wise loss counting its choices
    (``moe_compat.fix_deepseek_moe``, on the instance), its multi-token-prediction projections without the bias
    paddlenlp gives them (``mtp.drop_projection_bias``). Any other model is returned as it is. Returns ``model``.

    Every model of a run goes through it (``build_model``), and every saved model loaded outside one
    (``pretrain.use.load_model``: tools/generate.py, tools/eval_mmlu.py, a LoRA adapter's base).
    """
    if implementation_for(model_type).routing is not None:
        moe_compat.apply()
    moe_compat.fix_deepseek_moe(model)
    mtp.drop_projection_bias(model)
    return model


def build_model(plan) -> paddle.nn.Layer:
    """Build the causal LM of a ``RunPlan``: from its model config (random init) or, when
    continue_training, from the saved weights in model_name_or_path; weights shared by pipeline
    stages are marked for the gradient norm (``mark_shared_weights``); the RoPE tables keep the rows of the run's
    sequence length (``pretrain.compat.rope_tables``).

    The class is ``model_class_for(config, pipeline_parallel_degree)``, the dtype ``Precision.param_dtype``.
    The model type's ``pretrain.compat`` fixes (``Implementation.install_compat``: GPT's tensor-parallel mapping
    of its tied head) are installed first. A mixture-of-experts model gets, from scratch, its routers
    (DeepSeek-V2: every weight matrix) initialised where paddlenlp leaves them constant (or at paddle's default),
    paddlenlp's MoE code fixed for this paddle and DeepSeek's routed output scaled in training with its
    sequence-wise load-balancing loss counting its choices (``compute_as_trained``), and under expert parallelism
    its expert gradients averaged over the ranks as every other gradient is (``pretrain.compat.moe``); under
    tensor parallelism DeepSeek's shared rotary key gets the gradient of all heads
    (``pretrain.compat.deepseek_attention``).

    Raises:
        UserError: continue_training and the weights' shapes do not fit the directory's config.json
            (preflight's ``saved_weights_problem`` has checked that the files exist).
    """
    model = compute_as_trained(_constructed_model(plan), plan.model_config.model_type)
    rope_tables.trim(model, plan.model_config.seq_length)
    deepseek_attention.sum_rotary_key_gradient(model)
    mark_shared_weights(model)
    moe_compat.average_expert_gradients(model)
    return model


def _constructed_model(plan) -> paddle.nn.Layer:
    """``build_model``'s model as paddlenlp builds or loads it."""
    model_args, config = plan.model_args, plan.model_config
    model_class = model_class_for(config, plan.layout.pipeline_parallel_degree)
    implementation_for(config.model_type).install_compat()  # before paddlenlp reads its tensor-parallel mapping
    routing = implementation_for(config.model_type).routing
    dtype = Precision.from_arguments(plan.training_args).param_dtype
    if not model_args.continue_training:
        model = model_class.from_config(config, dtype=dtype)
        init = implementation_for(config.model_type).init_weights
        if init is not None:
            weight_init.redraw(model, config, init.depth_scaled)
        if routing is not None and routing.init_routers:
            moe_compat.init_routers(model, routing.router_suffix, config.initializer_range)
        return model

    path = model_args.model_name_or_path
    hf_impl = hf_implementation(path)
    if hf_impl is not None:  # a Hugging Face transformers folder: converted as it loads
        model = model_class.from_config(config, dtype=dtype)
        load_hf_weights(model, path, config, hf_impl)
        return model
    try:
        return model_class.from_pretrained(path, config=config, dtype=dtype)
    except RuntimeError as e:
        if "Error(s) in loading state_dict" not in str(e):
            raise
        detail = next((line.strip() for line in str(e).splitlines()[1:] if line.strip()), "")
        raise UserError(f"continue_training: the weights in {path} do not fit its {CONFIG_NAME} ({detail})") from e
