"""Resuming on another tensor or pipeline layout, proven by construction on a tiny LLaMA (no tensor- or
pipeline-parallel group on CPU: a stand-in communication group answers paddle's and paddlenlp's queries).

- Tensor parallel: paddlenlp's unified checkpoint (``unified_checkpoint true``) saves each tensor merged
  over the tensor-parallel ranks (``merge_tensor_parallel_with_shard`` for the weights,
  ``merge_tensor_parallel_for_optimizer`` for the Adam moments, with the model's merge actions) and each
  rank of the loading layout reads its part from the safetensors file (``load_state_dict`` with
  ``get_tensor_parallel_convert_actions``, and ``mapping_optimizer_tp_actions`` for the moments). Split
  for tensor_parallel_degree 2 and merged back, weights and moments are unchanged bit for bit, and each
  rank's part has the shapes of that rank's parameters in a tensor-parallel model.
- Pipeline parallel: ``LlamaForCausalLMPipe`` names its parameters by layer index within its stage
  ("3.self_attn.q_proj.weight") and maps them to and from the single-model names; over 2 stages the
  stages hold disjoint parts that together are LlamaForCausalLM's parameters, and a state dict set
  and read back through that mapping is unchanged bit for bit.
"""

from contextlib import ExitStack, contextmanager
from types import SimpleNamespace
from unittest import mock

import numpy as np
import paddle
import paddle.distributed
import pytest
from paddle.distributed import fleet
from paddle.distributed.fleet.base import topology
from paddle.distributed.fleet.layers.mpu import random as mp_random
from paddlenlp.trainer.unified_checkpoint import utils as unified
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM
from paddlenlp.transformers.llama.modeling_pp import LlamaForCausalLMPipe
from paddlenlp.transformers.model_utils import load_state_dict
from safetensors.numpy import save_file

TINY = dict(vocab_size=96, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4)
TP = 2
CASES = {  # what paddlenlp splits differs per case; replicated tensors are read whole by every rank
    "separate q/k/v and gate/up": dict(num_key_value_heads=2),
    "fused qkv and gate_up": dict(num_key_value_heads=2, fuse_attention_qkv=True, fuse_attention_ffn=True),
    "replicated vocabulary (odd) and k/v (1 head)": dict(vocab_size=95, num_key_value_heads=1),
}
MOMENTS = ("moment1_0", "moment2_0")  # AdamW's per-element state; beta1/beta2 powers are scalars


@contextmanager
def stand_in_group(tensor_parallel_degree: int = 1, tensor_rank: int = 0, pipeline_degree: int = 1, stage: int = 0):
    """A hybrid communicate group of this shape, seen from (``tensor_rank``, ``stage``), for building and
    saving models in one process: paddle's parallel layers and paddlenlp's unified checkpoint ask it for
    degrees, ranks and topology. Nothing communicates."""
    model_group = SimpleNamespace(
        nranks=tensor_parallel_degree, rank=tensor_rank, ranks=list(range(tensor_parallel_degree)), id=0
    )
    topo = fleet.CommunicateTopology(
        ["data", "pipe", "sharding", "sep", "model"], [1, pipeline_degree, 1, 1, tensor_parallel_degree]
    )
    hcg = SimpleNamespace(
        topology=lambda: topo,
        get_model_parallel_group=lambda: model_group,
        get_model_parallel_world_size=lambda: tensor_parallel_degree,
        get_model_parallel_rank=lambda: tensor_rank,
        get_model_parallel_group_src_rank=lambda: 0,
        get_pipe_parallel_group=lambda: SimpleNamespace(nranks=pipeline_degree),
    )
    tracker = mp_random.RNGStatesTracker()
    tracker.add(mp_random.MODEL_PARALLEL_RNG, 1234)  # tensor-parallel layers draw their init from it
    global_rank = topo.get_rank(data=0, pipe=stage, sharding=0, sep=0, model=tensor_rank)
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(fleet, "get_hybrid_communicate_group", return_value=hcg))
        stack.enter_context(mock.patch.object(topology, "_HYBRID_PARALLEL_GROUP", hcg))
        stack.enter_context(mock.patch.object(mp_random, "RNG_STATE_TRACKER", tracker))
        strategy = fleet.DistributedStrategy()
        stack.enter_context(mock.patch.object(fleet.fleet, "_user_defined_strategy", strategy, create=True))
        stack.enter_context(mock.patch.object(paddle.distributed, "get_rank", return_value=global_rank))
        device = mock.PropertyMock(return_value=0)  # a pipeline layer reads it; absent on CPU
        stack.enter_context(mock.patch.object(paddle.distributed.ParallelEnv, "device_id", new_callable=device))
        yield


def _config(case: dict, tensor_rank: int = 0, degree: int = 1) -> LlamaConfig:
    return LlamaConfig(**{**TINY, **case}, tensor_parallel_degree=degree, tensor_parallel_rank=tensor_rank)


def _numpy(state: dict) -> dict:
    return {key: np.asarray(value.numpy() if hasattr(value, "numpy") else value) for key, value in state.items()}


def _whole(case: dict) -> tuple:
    """(weights, optimizer state) of a tiny LlamaForCausalLM on one card, as the unified checkpoint names them:
    ``{structured name: array}`` and ``{structured name/moment: array}`` (random moments, scalar beta powers)."""
    paddle.seed(0)
    weights = _numpy(LlamaForCausalLM(_config(case)).state_dict())
    rng = np.random.default_rng(0)
    optimizer = {}
    for key, value in weights.items():
        for moment in MOMENTS:
            optimizer[f"{key}/{moment}"] = rng.standard_normal(value.shape).astype(np.float32)
        optimizer[f"{key}/beta1_pow_acc_0"] = np.array([0.9**4], dtype=np.float32)
    return weights, optimizer


def _merged(parts: list, actions: dict, merge) -> dict:
    """What the unified checkpoint saves from the ranks' ``parts``: ``merge`` (paddlenlp's, called as each
    tensor-parallel rank calls it) with the gather over ranks answered from ``parts``; the ranks' keys
    split in halves (paddlenlp's ``filter_params`` balances them by bytes: any split gives the same files)."""
    tensors = [{key: paddle.to_tensor(value) for key, value in part.items()} for part in parts]
    name_of = {id(tensor): key for part in tensors for key, tensor in part.items()}

    def gather(tensor, dst=0, group=None, offload=False):
        return [part[name_of[id(tensor)]] for part in tensors]

    keys = sorted(parts[0])
    saved_by = [keys[: len(keys) // 2], keys[len(keys) // 2 :]]
    merged = {}
    for rank in range(TP):
        with stand_in_group(TP, rank), mock.patch.object(unified, "distributed_gather", side_effect=gather):
            merged.update(_numpy(merge(tensors[rank], dict(actions), saved_by)))
    return merged


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_unified_checkpoint_split_and_merge_are_an_identity(case, tmp_path):
    weights, optimizer = _whole(case)
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "np"})
    save_file(optimizer, str(tmp_path / "optimizer.safetensors"), metadata={"format": "np"})

    weight_parts, optimizer_parts = [], []
    for rank in range(TP):
        config = _config(case, rank, TP)
        with stand_in_group(TP, rank):
            shapes = {key: tuple(value.shape) for key, value in LlamaForCausalLM(config).state_dict().items()}
        split = LlamaForCausalLM.get_tensor_parallel_convert_actions(config, list(weights), ignore_error=True)
        part = _numpy(load_state_dict(str(tmp_path / "model.safetensors"), split, device="cpu"))
        assert {key: value.shape for key, value in part.items()} == shapes  # rank's share = its parameters
        weight_parts.append(part)
        moment_split = unified.mapping_optimizer_tp_actions(split, list(optimizer))
        optimizer_parts.append(_numpy(load_state_dict(str(tmp_path / "optimizer.safetensors"), moment_split)))
        for key in optimizer:
            expected = shapes[key.split("/")[0]] if key.split("/")[1] in MOMENTS else (1,)
            assert optimizer_parts[-1][key].shape == expected, key

    split_keys = [key for key in weights if weight_parts[0][key].shape != weights[key].shape]
    assert "llama.layers.1.mlp.down_proj.weight" in split_keys  # the test splits something
    assert ("llama.embed_tokens.weight" in split_keys) == (case.get("vocab_size", 96) % TP == 0)
    merge = LlamaForCausalLM.get_tensor_parallel_convert_actions(
        _config(case, 0, TP), list(weights), is_split=False, ignore_error=True
    )
    for name, whole, parts, merge_function in (
        ("weights", weights, weight_parts, unified.merge_tensor_parallel_with_shard),
        ("optimizer", optimizer, optimizer_parts, unified.merge_tensor_parallel_for_optimizer),
    ):
        merged = _merged(parts, merge, merge_function)
        assert merged.keys() == whole.keys(), name
        for key in whole:
            assert merged[key].dtype == whole[key].dtype and np.array_equal(merged[key], whole[key]), f"{name}: {key}"


def test_pipeline_stage_names_map_to_the_single_model_and_back():
    config = dict(TINY, num_hidden_layers=4, num_key_value_heads=2)
    paddle.seed(0)
    whole = _numpy(LlamaForCausalLM(LlamaConfig(**config)).state_dict())
    stages, renamed, read_back = [], {}, {}
    for stage in range(2):
        with stand_in_group(pipeline_degree=2, stage=stage):
            pipe = LlamaForCausalLMPipe(LlamaConfig(**config))
        local = list(paddle.nn.Layer.state_dict(pipe))  # the pipeline's own names: layer index in the stage
        stages.append(set(pipe._set_pipeline_name_mapping()))  # single-model names of this stage
        assert not set(local) & stages[-1] and len(local) == len(stages[-1])
        renamed.update(pipe._pp_to_single_mapping)
        pipe.set_state_dict({key: paddle.to_tensor(value) for key, value in whole.items()})  # other stage's: skipped
        read_back.update(_numpy(pipe.state_dict()))
    # layer 0 is the embedding: decoder layer i is pipeline layer i + 1, on stage 0 (layers 0-1) or 1 (2-3)
    assert renamed["1.self_attn.q_proj.weight"] == "llama.layers.0.self_attn.q_proj.weight"
    assert renamed["3.self_attn.q_proj.weight"] == "llama.layers.2.self_attn.q_proj.weight"
    assert not stages[0] & stages[1] and stages[0] | stages[1] == set(whole)
    assert "llama.embed_tokens.weight" in stages[0] and "lm_head.weight" in stages[1]
    assert read_back.keys() == whole.keys()
    for key in whole:
        assert np.array_equal(read_back[key], whole[key]), key


def test_one_process_loads_every_file_of_a_checkpoint_saved_by_several_ranks(tmp_path, monkeypatch):
    """A unified checkpoint written by a TP2 or PP2 run has a weight file per position
    (``model-00001-of-00002.safetensors``, ...); paddlenlp 3.0.0b4's single-process loader read the first
    only and kept the initial weights of the others' tensors (``pretrain.resume_layout.load_every_shard``)."""
    import json

    from paddlenlp.trainer.unified_checkpoint import load_save_single_card

    from pretrain.resume_layout import install_single_process_unified_load

    paddle.seed(1)
    saved = _numpy(LlamaForCausalLM(LlamaConfig(**TINY)).state_dict())
    names = sorted(saved)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in halves.items():
        save_file({key: saved[key] for key in keys}, str(tmp_path / file), metadata={"format": "np"})
    weight_map = {key: file for file, keys in halves.items() for key in keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    def loaded() -> dict:
        paddle.seed(2)
        model = LlamaForCausalLM(LlamaConfig(**TINY))
        load_save_single_card.load_single_card_checkpoint(model, str(tmp_path))
        return _numpy(model.state_dict())

    monkeypatch.setattr(load_save_single_card, "load_state_dict", load_state_dict)  # restored after the test
    as_paddlenlp = loaded()
    second = [key for key in halves["model-00002-of-00002.safetensors"] if "norm" not in key]  # norms init to 1
    assert [key for key in names if not np.array_equal(as_paddlenlp[key], saved[key])] == second
    install_single_process_unified_load()
    every = loaded()
    for key in names:
        np.testing.assert_array_equal(every[key], saved[key], err_msg=key)
