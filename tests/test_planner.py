"""The planner's formulas on hand-computed cases, against paddle's own saved tensors, and its invariants.

Accuracy against published runs lives in benchmarks/planner_accuracy.py, not here.
"""

import dataclasses
import glob
import os

import paddle
import pytest
from conftest import REPO, resolve_plan

from pretrain.arguments import parse_arguments
from pretrain.compat import rope_tables
from pretrain.errors import UserError
from pretrain.fused_ops import fused_ln_problem
from pretrain.layout import ParallelLayout, simulated_launch
from pretrain.metrics.hardware import find_gpu
from pretrain.model import build_model, compute_as_trained
from pretrain.model_config import build_model_config
from pretrain.mtp import drop_projection_bias
from pretrain.param_count import count_config_parameters, decoder_shape
from pretrain.planner import Workload, estimate, memory, throughput
from pretrain.planner.activations import (
    embedding_bytes,
    layer_dims,
    layer_saved_bytes,
    loss_bytes,
    recomputed_layer_bytes,
)
from pretrain.planner.constants import DEFAULT_CONSTANTS
from pretrain.planner.experts import dispatch_saved_bytes
from pretrain.planner.parameters import (
    held_elements,
    layer_shapes,
    owned_numel,
    sharded_numel,
    stage2_gradient_storage_numel,
    stage_parameters,
)
from pretrain.planner.search import search
from pretrain.planner.validity import problems
from pretrain.registry import IMPLEMENTATIONS, MODEL_SIZES, find_model_size, implementation_for

A100_80G, A100_40G = find_gpu("A100-SXM4-80GB"), find_gpu("A100-SXM4-40GB")
LLAMA_7B_PARAMS = 6_738_415_616  # 32 x 202,383,360 per layer + 2 x 131,072,000 (embedding, head) + 4,096 (norm)
LLAMA_7B_LAYER = 202_383_360  # 4 x 4096^2 (q, k, v, o) + 3 x 4096 x 11008 (gate, up, down) + 2 x 4096 (norms)


def llama_7b(seq: int = 2048):
    config = find_model_size("llama-7b").model_config()
    config.seq_length = seq
    return config


def workload(config=None, *, tp=1, pp=1, virtual=1, stage=0, degree=1, world=8, **knobs) -> Workload:
    """A Workload of LLaMA-7B (unless ``config``) on ``world`` A100-80GB cards; the rest is data parallel."""
    layout = ParallelLayout(
        world_size=world,
        nnodes=1,
        tensor_parallel_degree=tp,
        pipeline_parallel_degree=pp,
        virtual_pp_degree=virtual,
        sharding_stage=stage,
        sharding_parallel_degree=degree,
        data_parallel_degree=world // (tp * pp * degree),
    )
    defaults = dict(
        micro_batch_size=4,
        gradient_accumulation_steps=64,
        seq_length=2048,
        precision="fp16",
        use_flash_attention=True,
        use_fused_rms_norm=True,
    )
    return Workload(model_config=config or llama_7b(), layout=layout, gpu=A100_80G, **{**defaults, **knobs})


# -- activations: the formula is what paddle saves --------------------------------------------------


def _saved_tensor_bytes(name: str, layers: int, fused_norm: bool, depth: int = 0) -> tuple:
    """Bytes of the non-parameter tensors a float32 forward of 2 x 64 tokens saves for backward (paddle's
    saved_tensors_hooks); ``depth``: DeepSeek-V3's MTP modules (reading 64 + depth tokens)."""
    config = find_model_size(name).model_config()
    config.num_hidden_layers = layers
    if hasattr(config, "num_nextn_predict_layers"):
        config.num_nextn_predict_layers = depth
    config.seq_length = 64 + depth
    config.use_fused_rms_norm = fused_norm
    paddle.seed(0)
    model = IMPLEMENTATIONS[config.model_type].model_class.from_config(config, dtype="float32")
    compute_as_trained(model, config.model_type)
    parameters = {p.data_ptr() for p in model.parameters()}
    saved = {}

    def pack(tensor):
        if tensor.data_ptr() not in parameters:
            saved.setdefault(tensor.data_ptr(), tensor.numel().item() * tensor.element_size())
        return tensor

    ids = paddle.randint(0, config.vocab_size, [2, 64 + depth])
    with paddle.autograd.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(input_ids=ids, labels=ids)
    return sum(saved.values()), config


def test_mtp_saves_a_second_head_and_loss():
    """DeepSeek-V3's MTP module (D = 1) saves, beside its decoder layer, hnorm, enorm, eh_proj's input and a
    second pass through the final norm, head and float32 softmax: measured as the 2-layer model with MTP minus
    the 3-layer model without (its third layer a MoE layer as the MTP's), within the criterion's per-token loss and
    mask the planner leaves out. Before, the planner counted one head: 35 of these 41 KB per token missing.
    (Measured: 16.2 bytes per token more than the model, the MTP criterion's per-token tensors and scalars.)"""
    with_mtp, config = _saved_tensor_bytes("deepseek_v3-debug", 2, False, depth=1)
    one_more_layer, _ = _saved_tensor_bytes("deepseek_v3-debug", 3, False)
    plan = workload(config, world=1, micro_batch_size=2, seq_length=64, precision="fp32", use_flash_attention=False)
    plan = dataclasses.replace(plan, use_fused_rms_norm=False)
    dims = layer_dims(decoder_shape(config), config.model_type, plan)
    mtp = loss_bytes(dims, config.vocab_size, 1)[0] - loss_bytes(dims, config.vocab_size)[0]
    tokens = 2 * 64  # DeepSeek's criterion saves its float32 per-token loss and 0/1 mask: 8 bytes per token
    assert 0 <= (with_mtp - one_more_layer) - mtp * tokens <= 2 * 8 * tokens + 64


FUSED_LN_PROBLEM = fused_ln_problem()


@pytest.mark.parametrize(
    "fused_norm",
    [
        False,
        pytest.param(
            True, marks=pytest.mark.skipif(FUSED_LN_PROBLEM is not None, reason=f"fused_ln: {FUSED_LN_PROBLEM}")
        ),
    ],
    ids=["unfused_norm", "fused_norm"],
)
@pytest.mark.parametrize(
    "name",
    ["llama-debug", "baichuan-debug", "qwen-debug", "qwen2-debug", "qwen3-debug", "ernie-4.5-debug", "gpt3-debug"],
)
def test_layer_activations_equal_what_paddle_saves(name, fused_norm):
    # One layer's saved bytes = (2-layer model) - (1-layer model), measured on the real paddlenlp model
    # in float32 without flash attention (CPU): the formula must match it to the byte.
    one, config = _saved_tensor_bytes(name, 1, fused_norm)
    two, _ = _saved_tensor_bytes(name, 2, fused_norm)
    plan = workload(config, world=1, micro_batch_size=2, seq_length=64, precision="fp32", use_flash_attention=False)
    plan = dataclasses.replace(plan, use_fused_rms_norm=fused_norm)
    dims = layer_dims(decoder_shape(config), config.model_type, plan)
    tokens = 2 * 64
    assert sum(layer_saved_bytes(dims).values()) * tokens == two - one
    # the rest (token ids, final norm, head input, float32 softmax): all but the criterion's float32
    # per-token loss and mask and a few scalars, which the planner leaves out (<= 8 bytes per token)
    modelled = (loss_bytes(dims, config.vocab_size)[0] + embedding_bytes(dims)[0]) * tokens
    assert 0 <= one - (two - one) - modelled <= 8 * tokens + 64


def _saved_dispatch_masks(family: str) -> tuple:
    """``(bytes, [capacity per MoE layer], config)`` of the ``[tokens, experts, capacity]``-sized tensors (in any
    axis order) that a float32 forward of ``family``'s 2-layer demo model, 2 x 128 tokens, saves for backward
    (paddle's saved_tensors_hooks), built as a run builds it (pretrain.model.build_model)."""
    plan = resolve_plan(
        [f"config/{family}/pretrain_demo_cpu.json", "--num_hidden_layers", "2", "--max_seq_length", "128"]
    )
    model = build_model(plan)
    model.train()
    config, tokens = plan.model_config, 2 * 128
    experts = decoder_shape(config).experts
    saved, capacities = {}, []

    def pack(tensor):
        shape = tuple(tensor.shape)
        if len(shape) == 3 and (shape[:2] == (tokens, experts) or (shape[0], shape[2]) == (experts, tokens)):
            saved.setdefault(tensor.data_ptr(), tensor.numel().item() * tensor.element_size())
            if shape[:2] == (tokens, experts):
                capacities.append(shape[2])
        return tensor

    paddle.seed(0)
    ids = paddle.randint(0, config.vocab_size, [2, 128])
    with paddle.autograd.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(input_ids=ids, labels=ids)
    return sum(saved.values()), sorted(set(capacities)), config


@pytest.mark.parametrize("family", ["qwen2_moe", "qwen3_moe", "deepseek_v2", "mixtral", "ernie4_5_moe"])
def test_moe_dispatch_masks_equal_what_paddle_saves(family):
    """paddlenlp's dense dispatch and combine save 4 [tokens, experts, capacity] tensors per MoE layer (each
    einsum's operand and its transposed copy), tokens^2 x top-k x imbalance elements: measured to the byte,
    with each layer's imbalance read from the capacity it ran with. Mixtral's block saves none. Before, the
    planner left them out: 12 GiB of the Qwen1.5-MoE recipe's 69.5 at balanced routing."""
    measured, capacities, config = _saved_dispatch_masks(family)
    plan = workload(config, world=1, micro_batch_size=2, seq_length=128, precision="fp32", use_flash_attention=False)
    shape = decoder_shape(config)
    predicted = sum(
        dispatch_saved_bytes(
            dataclasses.replace(plan, routing_imbalance=shape.experts * capacity / (256 * shape.experts_per_token))
        )
        for capacity in capacities
    )
    assert predicted == pytest.approx(measured, rel=1e-12)
    assert (measured > 0) == (family != "mixtral")


def test_the_qwen_moe_recipe_counts_its_dispatch_masks_and_fits_up_to_an_imbalance():
    """The Qwen1.5-MoE recipe on 8 x A100-80GB (4,096 tokens a micro-batch, top-4, 24 MoE layers, bf16): 0.5 GiB
    of dispatch masks per layer at balanced routing, 12 GiB in all; it fits up to a routing imbalance of 1.5
    (the busiest expert taking 1.5 x its share), where the masks take 18 GiB."""
    path = os.path.join(REPO, "config", "qwen2_moe", "pretrain_argument.json")
    with simulated_launch(1, 8):
        model_args, data_args, training_args = parse_arguments([path])
        layout = ParallelLayout.from_arguments(training_args, 1)
    config = build_model_config(model_args, data_args, training_args, 151936)
    plan = Workload.from_arguments(config, layout, model_args, data_args, training_args, "A100-SXM4-80GB")
    terms = estimate(plan).memory_breakdown[0]
    assert terms[memory.MOE_DISPATCH] == 24 * 4 * 2 * 4 * 4096**2 / 2**30 == 12.0
    skewed = estimate(dataclasses.replace(plan, routing_imbalance=1.5))
    assert skewed.memory_breakdown[0][memory.MOE_DISPATCH] == 18.0 and skewed.fits


def test_llama_7b_layer_activations_by_hand():
    # FlagPerf's TP2 case: fp16, flash attention, fused RMSNorm, unfused RoPE; h 4096, per card q = kv = 2048,
    # f = 5504, 16 heads of 128. Bytes per token per layer:
    dims = layer_dims(decoder_shape(llama_7b()), "llama", workload(tp=2, degree=4, stage=1))
    assert layer_saved_bytes(dims) == {
        "attention norm": 2 * 4096 + 4,  # input + float32 inverse RMS
        "Q/K/V matmul inputs": 3 * 2 * 4096,  # one c_identity copy per column-parallel matmul
        "q/k head norms": 0,  # Qwen3's only
        "rotary embedding": 2 * 2 * (2048 + 2048) + 2 * 2 * 128,  # q, rot(q), k, rot(k); cos, sin
        "core attention": 2 * (2 * 2048 + 2 * 2048) + 4 * 16,  # q, k, v, out; float32 log-sum-exp
        "attention residual": 0,
        "MLP norm": 2 * 4096 + 4,
        "MLP matmul inputs": 2 * 2 * 4096,  # gate and up
        "MLP activation": 3 * 2 * 5504,  # SwiGLU x, y and product
        "MLP residual": 0,
    }
    assert sum(layer_saved_bytes(dims).values()) == 123_720
    assert recomputed_layer_bytes(dataclasses.replace(dims, recomputed=("layer",))) == (2 * 4096, 123_720)
    # the loss: float32 softmax over 16,000 vocabulary rows + head input + final norm; transient logits
    assert loss_bytes(dims, 32000) == (4 * 16000 + 2 * 4096 + 2 * 4096 + 4, (2 + 4) * 16000)


def test_unfused_norm_and_no_flash_cost_more_and_core_attn_recompute_removes_the_scores():
    fused = layer_dims(decoder_shape(llama_7b()), "llama", workload())
    unfused = dataclasses.replace(fused, fused_norm=False)
    # LlamaRMSNorm unfused: float32 copy for pow, float32 promoted copy, 16-bit normalized: 4h + 4h + 2h
    assert layer_saved_bytes(unfused)["attention norm"] == 10 * 4096 + 4
    no_flash = dataclasses.replace(fused, flash=False)
    scores = (4 + 2) * 32 * 2048  # float32 softmax + its fp16 cast, 32 heads x 2048 keys per token
    assert layer_saved_bytes(no_flash)["core attention"] == 4 * 2 * 4096 + scores
    saved, recomputed = recomputed_layer_bytes(dataclasses.replace(no_flash, recomputed=("core",)))
    assert saved == sum(layer_saved_bytes(no_flash).values()) - scores  # q, k, v and the output stay saved
    assert recomputed == scores + 2 * 4096  # rebuilt in backward: the scores and a new output


# -- parameters and model states --------------------------------------------------------------------


def _rope_table_bytes(model) -> int:
    """Bytes of the cos and sin tables (``cos_cached``, ``sin_cached``) held by the sublayers of ``model``."""
    tables = [getattr(layer, name, None) for layer in model.sublayers() for name in ("cos_cached", "sin_cached")]
    return sum(table.numel().item() * table.element_size() for table in tables if isinstance(table, paddle.Tensor))


@pytest.mark.parametrize("name", sorted(name for name in MODEL_SIZES if name.endswith("-debug")))
def test_rope_tables_are_what_the_built_model_keeps_after_a_forward(name):
    """The planner's RoPE cos/sin tables (every attention layer's, MTP's too) equal what the model built as a run
    builds it holds after a forward of 32 tokens, to the byte: the sequence's rows (LLaMA-style classes build every
    one of max_position_embeddings, trimmed by ``compat.rope_tables``; DeepSeek's at the first forward, on the
    host before it: ``device_guard("cpu")``, which a CPU cannot tell apart), twice it for QWen v1, none for GPT-3
    and Baichuan-13B's ALiBi. Before, the planner had none, and the tables held 4 GiB per card of Llama-3.1-8B
    (32 layers x 2 x 131,072 x 128 x 4 bytes)."""
    config = find_model_size(name).model_config()
    depth = getattr(config, "num_nextn_predict_layers", 0)  # DeepSeek-V3's MTP reads seq_length + depth tokens
    config.seq_length = 32 + depth
    paddle.seed(0)
    model = compute_as_trained(  # paddlenlp's MoE code as a run fixes it for this paddle
        IMPLEMENTATIONS[config.model_type].model_class.from_config(config, dtype="float32"), config.model_type
    )
    rope_tables.trim(model, config.seq_length)
    with paddle.no_grad():
        model(input_ids=paddle.randint(0, config.vocab_size, [1, 32 + depth]))
    plan = workload(config, world=1, micro_batch_size=1, seq_length=32, precision="fp32", use_flash_attention=False)
    layers = stage_parameters(decoder_shape(config), 1, 1, 1, False, False)[0].decoder_layers
    assert memory.rope_cache_bytes(plan) * layers == _rope_table_bytes(model)


def test_trimmed_rope_tables_give_the_same_logits():
    """``compat.rope_tables.trim`` keeps the rows a run reads: Llama 3.1's debug model (llama3 RoPE scaling,
    max_position_embeddings 1024) gives bit-identical logits on 64 tokens with its tables cut from 1024 rows to
    64, and Qwen2's regrows them for a longer sequence as it does past max_position_embeddings."""
    for name in ("llama-3.1-debug", "qwen2-debug"):
        config = find_model_size(name).model_config()
        paddle.seed(0)
        model = IMPLEMENTATIONS[config.model_type].model_class.from_config(config, dtype="float32")
        model.eval()
        ids = paddle.randint(0, config.vocab_size, [2, 64])
        before = _rope_table_bytes(model)
        with paddle.no_grad():
            whole = model(input_ids=ids)[0].numpy()
            freed = rope_tables.trim(model, 64)
            assert freed == before - _rope_table_bytes(model) > 0 and _rope_table_bytes(model) * 16 == before
            assert (model(input_ids=ids)[0].numpy() == whole).all(), name
    with paddle.no_grad():  # qwen2: a longer sequence rebuilds the tables
        longer = paddle.randint(0, config.vocab_size, [1, 128])
        model(input_ids=longer)
    assert _rope_table_bytes(model) * 8 == before


@pytest.mark.parametrize("name", sorted(MODEL_SIZES))
def test_stages_hold_every_parameter_once(name):
    config = MODEL_SIZES[name].model_config()
    stages = stage_parameters(decoder_shape(config), 1, 1, 1, False, False)
    assert sum(stage.numel for stage in stages) == count_config_parameters(config)[0]


@pytest.mark.parametrize(
    "name", ["llama-debug", "qwen-debug", "qwen2-debug", "qwen3-debug", "ernie-4.5-debug", "gpt3-debug"]
)
def test_layer_shapes_are_the_built_models(name):
    """One decoder layer's parameter shapes (TP 1) equal paddlenlp's built layer, as multisets."""
    config = find_model_size(name).model_config()
    paddle.seed(0)
    model = IMPLEMENTATIONS[config.model_type].model_class.from_config(config)
    built = [tuple(p.shape) for n, p in model.named_parameters() if ".layers.0." in n or ".h.0." in n]
    fused_qkv = implementation_for(config.model_type).fused_qkv(False)  # QWen v1's c_attn
    assert sorted(built) == sorted(dims for _, dims in layer_shapes(decoder_shape(config), 1, fused_qkv, False))


@pytest.mark.parametrize("name", sorted(name for name in MODEL_SIZES if name.endswith("-debug")))
def test_the_planners_tensors_are_the_built_models_in_their_order(name):
    """Every parameter of the built model (TP 1, PP 1; DeepSeek-V3's MTP bias dropped as ``build_model`` does) in
    the order it registers them: paddle's sharding stage2 partitions greedily in that order, so the planner's
    busiest rank is exact only with it. Measured 2026-11-28 before the planner followed it (norms first, biases
    after the weights, routers before the experts, dense layers first, MTP after the head): 13 of the 14 debug
    sizes differed, and Qwen2-MoE's SH2 stage2 run held 8,521,728 optimizer elements on rank 0 where the planner
    said at most 8,520,704 (support matrix, ``parallel_golden.held_mismatches``)."""
    config = find_model_size(name).model_config()
    paddle.seed(0)
    model = IMPLEMENTATIONS[config.model_type].model_class.from_config(config)
    drop_projection_bias(model)
    built = [int(parameter._numel()) for parameter in model.parameters()]
    fused_qkv = implementation_for(config.model_type).fused_qkv(False)
    assert built == list(stage_parameters(decoder_shape(config), 1, 1, 1, fused_qkv, False)[0].tensors)


def test_deepseek_layer_shapes_are_the_built_models_mla_and_experts():
    """DeepSeek-V2's MoE layer (MLA with query compression and biases, the router, experts, the shared expert)
    and its dense first layer equal paddlenlp's built layers (TP 1), as multisets."""
    config = find_model_size("deepseek_v2-debug").model_config()
    config.q_lora_rank, config.attention_bias, config.num_hidden_layers = 48, True, 2
    with paddle.LazyGuard():
        model = IMPLEMENTATIONS["deepseek_v2"].model_class(config)
    shape = decoder_shape(config)
    dense = dataclasses.replace(shape, experts=0, mlp_width=shape.dense_mlp_width)
    for index, layer_shape in ((0, dense), (1, shape)):
        built = [tuple(p.shape) for n, p in model.named_parameters() if f".layers.{index}." in n]
        assert sorted(built) == sorted(dims for _, dims in layer_shapes(layer_shape, 1, False, False)), index


def test_qwen3_moe_layer_shapes_are_the_built_models_experts_and_dense():
    """Qwen3-MoE's MoE layer (Qwen3's attention with its head norms, the router, the experts, no shared expert)
    and its dense layer (mlp_only_layers: layer 1 of the debug size) equal the built layers (TP 1), as
    multisets."""
    config = find_model_size("qwen3_moe-debug").model_config()
    config.num_hidden_layers = 2
    with paddle.LazyGuard():
        model = IMPLEMENTATIONS["qwen3_moe"].model_class(config)
    shape = decoder_shape(config)
    assert shape.dense_layers == 1
    dense = dataclasses.replace(shape, experts=0, mlp_width=shape.dense_mlp_width)
    for index, layer_shape in ((0, shape), (1, dense)):
        built = [tuple(p.shape) for n, p in model.named_parameters() if f".layers.{index}." in n]
        assert sorted(built) == sorted(dims for _, dims in layer_shapes(layer_shape, 1, False, False)), index


def test_llama_tensor_parallel_splits_follow_paddlenlps_own_table():
    """paddlenlp's checkpoint splitter (``_get_tensor_parallel_mappings``) says which weights are split by
    output columns and which by input rows; the per-rank shapes split the same dimensions."""
    config = llama_7b()
    config.tensor_parallel_degree = 4
    mappings = IMPLEMENTATIONS["llama"].model_class._get_tensor_parallel_mappings(config, is_split=True)
    full = dict(layer_shapes(decoder_shape(config), 1, False, False))
    split = dict(layer_shapes(decoder_shape(config), 4, False, False))
    modules = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn"}
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        action = mappings[f"layers.0.{modules.get(name, 'mlp')}.{name}.weight"]
        axis = 1 if action.keywords["is_column"] else 0
        expected = list(full[f"{name}.weight"])
        expected[axis] //= 4
        assert split[f"{name}.weight"] == tuple(expected), name


def test_llama_7b_pipeline_stages_by_hand():
    # TP2: a layer is 4 x 4096 x 2048 + 3 x 4096 x 5504 + 2 x 4096 = 101,195,776; the embedding and head
    # 16,000 x 4096 = 65,536,000; 8 layers per stage; embedding first, final norm + head last.
    stages = stage_parameters(decoder_shape(llama_7b()), 2, 4, 1, False, False)
    assert [s.numel for s in stages] == [875_102_208, 809_566_208, 809_566_208, 875_106_304]
    assert [(s.has_embedding, s.has_head, s.decoder_layers) for s in stages] == [
        (True, False, 8),
        (False, False, 8),
        (False, False, 8),
        (False, True, 8),
    ]
    # 2 virtual chunks: stage s runs chunks s and s + 4 (4 layers each); same totals
    interleaved = stage_parameters(decoder_shape(llama_7b()), 2, 4, 2, False, False)
    assert [s.numel for s in interleaved] == [s.numel for s in stages]


def test_tied_embedding_is_held_by_the_first_and_last_pipeline_stage():
    config = find_model_size("qwen2-0.5b").model_config()  # tie_word_embeddings
    embedding = config.vocab_size * config.hidden_size
    one = stage_parameters(decoder_shape(config), 1, 1, 1, False, False)
    two = stage_parameters(decoder_shape(config), 1, 2, 1, False, False)
    assert sum(s.numel for s in two) == sum(s.numel for s in one) + embedding


def test_sharding_partitions_whole_tensors_greedily():
    # stage 1 sorts by size (3 -> r0, 2 -> r1, 2 -> r1: max 4); stage 2 keeps model order (2, 2, then 3: max 5)
    assert sharded_numel((2, 2, 3), 2, sort_by_size=True) == 4
    assert sharded_numel((2, 2, 3), 2, sort_by_size=False) == 5
    assert sharded_numel((2, 2, 3), 1, sort_by_size=False) == 7


def test_sharding_stage3_slices_the_tensors_above_its_segment_and_keeps_the_smaller_ones_whole():
    """paddle 3.3.1's GroupShardedStage3 slices a tensor of more than 2**20 elements (its buffer padded to the
    alignment, then to the degree) and keeps the smaller ones, and their optimizer states, whole on every rank.
    The llama debug model (embedding and head 32000 x 64, the rest 1,623,296 elements in small tensors) measured
    2026-11-28 on 2 CPU processes: 3,671,296 parameter and 7,342,592 moment elements on each rank, this count.
    Before, the planner divided whole tensors greedily: LLaMA-7B's busiest card of stage3 x 64 owned 215.0M
    elements by that rule, 105.5M by paddle's slices."""
    tensors = (2_048_000, 1_000_000, 623_296)  # one sliced tensor (the embedding), two whole
    assert owned_numel(tensors, 2, 3, element_bytes=4, alignment=4096) == 1_024_000 + 1_623_296
    over_segment = (2**20 + 1,)  # padded to 2**20 + 1024 elements of 4 bytes (4096-byte alignment), halved
    assert owned_numel(over_segment, 2, 3, element_bytes=4, alignment=4096) == 2**19 + 512
    assert held_elements(tensors, 2, 3, 4, 4096, master=False) == {"parameters": 2_647_296, "optimizer": 5_294_592}
    assert held_elements(tensors, 2, 3, 2, 256, master=True)["optimizer"] == 3 * 2_647_296  # two moments + master
    assert held_elements(tensors, 2, 1, 4, 4096, master=False) == {"parameters": 3_671_296, "optimizer": 4_096_000}
    assert held_elements(tensors, 1, 3, 4, 4096, master=False)["optimizer"] == 2 * 3_671_296  # degree 1: all
    seven_b = stage_parameters(decoder_shape(llama_7b()), 1, 1, 1, False, False)[0].tensors
    assert owned_numel(seven_b, 64, 3, element_bytes=2, alignment=256) == 105_549_824  # 1/64: 105,287,744


def test_llama_7b_model_states_under_stage2_over_8_cards():
    plan = workload(stage=2, degree=8)
    states = memory.model_states_bytes(plan, stage_parameters(decoder_shape(llama_7b()), 1, 1, 1, False, False)[0])
    assert states[memory.PARAMETERS] == 2 * LLAMA_7B_PARAMS == 13_476_831_232  # fp16, every parameter
    owned = states[memory.MOMENTS] // 8  # two float32 moments per owned parameter
    even = LLAMA_7B_PARAMS // 8  # 842,301,952
    assert even <= owned <= even + 131_072_000  # whole tensors: at most one embedding over an even share
    assert states[memory.MASTER_WEIGHTS] == 4 * owned
    assert states[memory.GRADIENTS] == 2 * (owned + LLAMA_7B_LAYER)  # owned + one layer in flight
    optimizer_gib = (states[memory.MASTER_WEIGHTS] + states[memory.MOMENTS]) / 2**30
    assert 9.41 < optimizer_gib < 10.9  # 12 bytes x 842M = 9.41 GiB, + at most one tensor


def test_stage2_gradient_buffers_are_bounded_by_the_tensors_not_the_ranks():
    """paddle's GroupShardedStage2 allocates one gradient buffer per sharding rank that owns a tensor, of the
    largest rank's padded size capped at 2**23 elements. Before issue 42 item 11 the planner counted 2**23
    elements for every rank: degree x 16 MiB in fp16, 15,625 GiB per card at 10**6 cards, 64 GiB at 4,096."""
    # 2 ranks: both own a tensor, the larger rank (2**24 elements) over the cap: 2 buffers of 2**23
    assert stage2_gradient_storage_numel((1000, 3000, 2**24), 2, 2, 256) == 2 * 2**23
    # 10**6 ranks: 3 own one tensor each, the rest nothing; the buffer is the largest tensor's, capped
    assert stage2_gradient_storage_numel((1000, 3000, 2**24), 10**6, 2, 256) == 3 * 2**23
    assert stage2_gradient_storage_numel((1000, 3000), 10**6, 2, 256) == 2 * 3072  # 3000 padded to 256 bytes
    llama = workload(stage=2, degree=8)  # 291 tensors, each rank over 2**23 elements: 8 buffers of 2**23, as before
    assert estimate(llama).memory_breakdown[0][memory.COMM_BUFFERS] == 8 * 2**23 * 2 / 2**30
    config = llama_7b()
    config.num_hidden_layers, config.hidden_size, config.intermediate_size = 2, 256, 512
    config.num_attention_heads = config.num_key_value_heads = 4
    tiny = workload(config, stage=2, degree=4096, world=4096)
    tensors = stage_parameters(decoder_shape(config), 1, 1, 1, False, False)[0].tensors
    largest = max(tensors) + (-max(tensors) * 2) % 256 // 2  # padded to 256 bytes
    buffers_gib = estimate(tiny).memory_breakdown[0][memory.COMM_BUFFERS]
    assert buffers_gib == len(tensors) * largest * 2 / 2**30 < 0.5  # 21 buffers of the embedding; was 64 GiB


def test_amp_master_grad_and_fp32_hold_float32_gradients():
    stage = stage_parameters(decoder_shape(llama_7b()), 1, 1, 1, False, False)[0]
    fp16 = memory.model_states_bytes(workload(), stage)
    master = memory.model_states_bytes(workload(amp_master_grad=True), stage)
    fp32 = memory.model_states_bytes(workload(precision="fp32", use_flash_attention=False), stage)
    assert master[memory.GRADIENTS] == 2 * fp16[memory.GRADIENTS] == 4 * LLAMA_7B_PARAMS
    assert fp32[memory.PARAMETERS] == 4 * LLAMA_7B_PARAMS and fp32[memory.MASTER_WEIGHTS] == 0
    assert sum(fp16.values()) == sum(fp32.values()) == 16 * LLAMA_7B_PARAMS  # 2+2+4+8 = 4+4+0+8 bytes


# -- invariants ------------------------------------------------------------------------------------


def test_memory_falls_with_more_sharding():
    peaks = [
        estimate(workload(stage=stage, degree=degree, micro_batch_size=1)).allocated_gib[0]
        for stage, degree in ((0, 1), (1, 2), (1, 4), (1, 8), (2, 8), (3, 8))
    ]
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == len(peaks)


def test_recompute_trades_memory_for_flops():
    plain = workload(tp=2, pp=4, micro_batch_size=2)
    redo = dataclasses.replace(plain, recompute=True)
    before, after = estimate(plain), estimate(redo)
    assert after.memory_breakdown[0][memory.ACTIVATIONS] < before.memory_breakdown[0][memory.ACTIVATIONS] / 10
    assert after.step_seconds > before.step_seconds
    # a middle stage (no head): full recompute repeats each layer's forward: matmul FLOPs 8N instead of 6N
    middle = stage_parameters(decoder_shape(llama_7b()), 2, 4, 1, False, False)[1]
    matmul = {
        plan.recompute: throughput.micro_batch_seconds(
            plan, layer_dims(decoder_shape(llama_7b()), "llama", plan), middle, DEFAULT_CONSTANTS
        )[throughput.MATMUL]
        for plan in (plain, redo)
    }
    ratio = matmul[True] / matmul[False]
    assert ratio == pytest.approx(8 / 6)
    assert after.mfu < before.mfu  # MFU counts model FLOPs only


def test_recompute_granularity_follows_each_models_code():
    # LLaMA: full = layer, full_attn = attention; GPT without pipeline: full_attn recomputes whole layers
    # (GPTDecoder) and ignores full; QWen v1 has no full_attn.
    gpt = find_model_size("gpt3-6.7b").model_config()
    qwen = find_model_size("qwen-7b").model_config()

    def units(config, granularity, pp=1):
        plan = workload(config, pp=pp, recompute=True, recompute_granularity=granularity)
        return layer_dims(decoder_shape(config), config.model_type, plan).recomputed

    assert units(llama_7b(), "full") == ("layer",) and units(llama_7b(), "full_attn") == ("attention",)
    assert units(gpt, "full_attn") == ("layer", "attention") and units(gpt, "full") == ()
    assert units(gpt, "full", pp=2) == ("layer",)
    assert units(qwen, "full_attn") == () and units(qwen, "core_attn") == ("core",)
    plain = estimate(workload(gpt, stage=2, degree=8, micro_batch_size=2))
    full_attn = estimate(workload(gpt, stage=2, degree=8, micro_batch_size=2, recompute=True,
                                  recompute_granularity="full_attn"))  # fmt: skip
    # each layer keeps only its input (2h bytes per token); the head's float32 softmax stays in both
    assert full_attn.memory_breakdown[0][memory.ACTIVATIONS] < plain.memory_breakdown[0][memory.ACTIVATIONS] / 5
    assert full_attn.step_seconds > plain.step_seconds


def test_first_pipeline_stage_holds_the_most_activations():
    result = estimate(workload(tp=2, pp=4, micro_batch_size=4, gradient_accumulation_steps=512))
    activations = [stage[memory.ACTIVATIONS] for stage in result.memory_breakdown]
    assert activations == sorted(activations, reverse=True)
    # 1F1B: stage s holds p - s micro-batches of equal layers; the first also keeps the token ids and
    # the last the loss's softmax, so compare the middle two: 3 : 2
    assert activations[1] / activations[2] == pytest.approx(3 / 2)


def test_in_flight_micro_batches():
    assert [memory.in_flight_chunks(s, 4, 1, 512) for s in range(4)] == [4, 3, 2, 1]
    assert [memory.in_flight_chunks(s, 4, 1, 2) for s in range(4)] == [2, 2, 2, 1]
    # interleaved, v = 2: the first stage holds p (1 + (p - 1) / (p v)) = 5.5 stage-micro-batches
    assert memory.in_flight_chunks(0, 4, 2, 8) == 4 * (1 + 3 / 8) == 5.5
    assert memory.in_flight_chunks(3, 4, 2, 8) == 2.5


def test_pipeline_bubble_is_p_minus_1_over_v_micro_batches():
    for virtual in (1, 2):
        result = estimate(workload(tp=2, pp=4, virtual=virtual, micro_batch_size=1, gradient_accumulation_steps=8))
        per_step = result.time_breakdown
        micro_total = sum(per_step[name] for name in (throughput.MATMUL, throughput.ATTENTION, throughput.ELEMENTWISE,
                                                      throughput.TENSOR_PARALLEL, throughput.PIPELINE_P2P,
                                                      throughput.SHARDING_MICRO))  # fmt: skip
        assert per_step[throughput.BUBBLE] == pytest.approx(micro_total / 8 * 3 / virtual)


def test_sequence_parallel_and_tensor_parallel_shrink_activations():
    base = estimate(workload(tp=2, stage=1, degree=4)).memory_breakdown[0][memory.ACTIVATIONS]
    wider = estimate(workload(tp=4, stage=1, degree=2)).memory_breakdown[0][memory.ACTIVATIONS]
    plan = workload(tp=2, stage=1, degree=4)
    sequence = dataclasses.replace(plan, layout=dataclasses.replace(plan.layout, sequence_parallel=True))
    assert wider < base
    assert estimate(sequence).memory_breakdown[0][memory.ACTIVATIONS] < base


def test_breakdowns_sum_to_the_totals():
    result = estimate(workload(tp=2, pp=4, micro_batch_size=2, gradient_accumulation_steps=32))
    for total, allocated, terms in zip(result.memory_gib, result.allocated_gib, result.memory_breakdown):
        assert sum(terms.values()) == pytest.approx(total)
        assert total - allocated == pytest.approx(terms[memory.DEVICE])
    assert sum(result.time_breakdown.values()) == pytest.approx(result.step_seconds)
    tokens_per_card = 2 * 2048 * 32 / 8  # one data replica: all 8 cards (2 tensor x 4 pipeline) share each sample
    assert result.tokens_per_card_per_sec == pytest.approx(tokens_per_card / result.step_seconds)


# -- arguments, hardware, validity -----------------------------------------------------------------


def test_workload_from_a_published_config():
    path = os.path.join(REPO, "config", "benchmarks", "llama-7b_TP2PP4SH1SP1_A100-40Gx1x8.json")
    with simulated_launch(1, 8):
        model_args, data_args, training_args = parse_arguments([path])
        layout = ParallelLayout.from_arguments(training_args, nnodes=1)
    config = build_model_config(model_args, data_args, training_args, 32000)  # the flags reach the config
    plan = Workload.from_arguments(config, layout, model_args, data_args, training_args, "A100-SXM4-40GB")
    assert (plan.micro_batch_size, plan.gradient_accumulation_steps, plan.seq_length) == (2, 1024, 2048)
    assert (plan.precision, plan.amp_level, plan.recompute, plan.recompute_granularity) == ("fp16", "O2", True, "full")
    assert (plan.use_flash_attention, plan.use_fused_rms_norm, plan.amp_master_grad) == (True, False, False)
    assert plan.gpu == A100_40G and plan.layout.pipeline_parallel_degree == 4
    assert plan.global_batch_samples == 2048


def test_gpu_lookup():
    assert (A100_40G.memory_gib, A100_40G.hbm_bytes_per_sec, A100_40G.nvlink_bytes_per_sec) == (40.0, 1555e9, 300e9)
    assert find_gpu("NVIDIA A100-SXM4-80GB").hbm_bytes_per_sec == 2039e9
    assert find_gpu("NVIDIA H100 80GB HBM3").memory_gib == 81559 / 1024
    assert find_gpu("NVIDIA H100 PCIe").intranode_bytes_per_sec == 64e9  # no NVLink across 8 cards
    assert find_gpu("H200").peak_flops_per_sec == 989e12
    assert find_gpu("V100") is None


def test_what_paddlenlp_refuses():
    assert any("stage2" in p for p in problems(workload(tp=2, pp=2, stage=2, degree=2)))
    qwen2 = find_model_size("qwen2-0.5b").model_config()  # 14 heads, 2 key/value heads
    assert any("divide num_attention_heads 14" in p for p in problems(workload(qwen2, tp=4, degree=2, stage=1)))
    with pytest.raises(UserError, match="cannot run"):
        estimate(workload(tp=2, pp=2, stage=2, degree=2))
    assert problems(workload(tp=2, pp=4)) == []


# -- every model and config ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MODEL_SIZES))
def test_every_registry_architecture_estimates(name):
    config = MODEL_SIZES[name].model_config()
    result = estimate(workload(config, stage=1, degree=8, micro_batch_size=1, seq_length=1024))
    assert result.tokens_per_card_per_sec > 0 and 0 < result.mfu < 1
    assert min(result.memory_gib) > 0


# Pretraining configs: run_finetune.py's (lora_*.json) train an adapter, which the planner does not model.
CONFIGS = sorted(
    path
    for path in glob.glob(os.path.join(REPO, "config", "*", "*.json"))
    if not os.path.basename(path).startswith("lora_")
)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.relpath(p, REPO))
def test_every_shipped_config_estimates(path):
    cards = 1 if "demo_cpu" in path else 8
    with simulated_launch(1, cards):
        model_args, data_args, training_args = parse_arguments([path])
        layout = ParallelLayout.from_arguments(training_args, nnodes=1)
    vocab_size = find_model_size(model_args.model_name_or_path).model_config().vocab_size
    config = build_model_config(model_args, data_args, training_args, vocab_size)
    plan = Workload.from_arguments(config, layout, model_args, data_args, training_args, "A100-SXM4-80GB")
    result = estimate(plan)
    assert result.tokens_per_card_per_sec > 0 and len(result.memory_gib) == layout.pipeline_parallel_degree


# -- search ----------------------------------------------------------------------------------------


def test_search_ranks_the_published_best_llama_7b_40g_strategy_above_the_worst():
    # FlagPerf LLaMA-7B on 8 x A100-40GB, global batch 2048 x 2048 tokens: TP1PP1SH2SP8 was fastest
    # (2744 tokens/card/s), TP2PP1SH2SP4 slowest (2160).
    run = dataclasses.replace(workload(use_fused_rms_norm=False), gpu=A100_40G, micro_batch_size=2)
    assert run.global_batch_samples == 2 * 64 * 8 == 1024
    candidates = search(run, 1, 8, global_batch_size=2048, top_k=1000)
    rates = [c.estimate.tokens_per_card_per_sec for c in candidates]
    assert rates == sorted(rates, reverse=True)
    assert all(c.estimate.fits and c.workload.global_batch_samples == 2048 for c in candidates)
    assert {c.workload.layout.sharding_stage for c in candidates} == {0, 1, 2, 3}
    names = [c.workload.layout.name for c in candidates]
    assert names.index("TP1PP1SH2SP8DP1") < names.index("TP2PP1SH2SP4DP1")
    top = search(run, 1, 8)  # the run's own global batch, 1024 samples
    assert len(top) == 10 and top[0].estimate.headroom_gib >= 0
    assert all(c.workload.global_batch_samples == 1024 and not c.workload.use_fused_rms_norm for c in top)


def test_search_refuses_what_cannot_fit():
    seventy = dataclasses.replace(workload(find_model_size("llama-2-70b").model_config()), gpu=A100_40G)
    with pytest.raises(UserError, match="fits"):
        search(seventy, 1, 2)


def test_a_dense_document_mask_adds_its_bool_and_float_copies_and_flashmask_nothing():
    """pretrain.document_mask: [micro batch, 1, seq, seq] bool from the collator, and paddlenlp's copy in
    the activation dtype (2 bytes in bf16): 3 bytes per element; FlashMask's O(seq) input is not counted."""
    from pretrain.planner.memory import document_mask_bytes
    from pretrain.planner.workload import Workload

    base = dict(model_config=None, layout=None, gpu=None, micro_batch_size=2, gradient_accumulation_steps=1)
    dense = Workload(**base, seq_length=4096, dense_document_mask=True)
    assert document_mask_bytes(dense) == 2 * 4096**2 * 3  # 96 MiB
    assert document_mask_bytes(Workload(**base, seq_length=4096)) == 0.0


def _llama_7b_estimate(*extra):
    """The planner's Estimate of config/llama/pretrain_argument.json (TP2, 8 x A100-80GB) with ``extra`` keys."""
    path = os.path.join(REPO, "config", "llama", "pretrain_argument.json")
    with simulated_launch(1, 8):
        model_args, data_args, training_args = parse_arguments([path, *extra])
        layout = ParallelLayout.from_arguments(training_args, nnodes=1)
    config = build_model_config(model_args, data_args, training_args, 32000)
    return estimate(Workload.from_arguments(config, layout, model_args, data_args, training_args, "A100-SXM4-80GB"))


@pytest.mark.parametrize("flash", ["false", "true"])
def test_a_document_mask_changes_the_plans_memory_only_on_the_dense_path_and_never_its_time_or_mfu(flash):
    """reset_attention_mask from a run's arguments: eager attention (the dense mask) adds micro batch x
    seq^2 x 3 bytes (4096 tokens: 48 MiB) and FlashMask nothing; the step time and MFU stay those of
    the same run without the mask (the FLOPs are counted for the full causal square either way)."""
    plain = _llama_7b_estimate("--use_flash_attention", flash)
    masked = _llama_7b_estimate("--use_flash_attention", flash, "--reset_attention_mask", "true")
    (terms,) = masked.memory_breakdown
    assert terms[memory.DOCUMENT_MASK] == (4096**2 * 3 / 2**30 if flash == "false" else 0.0)
    assert masked.memory_gib[0] - plain.memory_gib[0] == pytest.approx(terms[memory.DOCUMENT_MASK])
    assert (masked.step_seconds, masked.mfu) == (plain.step_seconds, plain.mfu)


# -- mixture of experts: expert parallelism's memory and all-to-all ------------------------------------


def _moe_estimates(name: str, *degrees: int, **knobs) -> dict:
    """``{ep: Estimate}`` of ``name`` under data parallelism alone on ``ep`` H200 cards, expert parallel over them
    (ep 1: one card, every expert)."""
    config = find_model_size(name).model_config()
    found = {}
    for ep in degrees:
        base = workload(config, world=ep, micro_batch_size=1, gradient_accumulation_steps=8, seq_length=4096, **knobs)
        found[ep] = estimate(dataclasses.replace(base, gpu=find_gpu("H200"), expert_parallel=ep > 1))
    return found


def test_expert_parallelism_divides_the_experts_states_and_adds_four_all_to_alls_per_layer():
    """Qwen1.5-MoE-A2.7B (24 layers of 60 experts of 3 x 2048 x 1408, top-4) at EP 1, 2 and 4: every model-state
    term is (the non-expert parameters + the experts / ep) x its bytes; the all-to-all is 4 per layer per micro
    batch of tokens x top-k x hidden x 2 bytes, (ep - 1)/ep of it over NVLink; the data-parallel all-reduce
    moves the non-expert gradients only."""
    config = find_model_size("Qwen1.5-MoE-A2.7B").model_config()
    shape = decoder_shape(config)
    experts = shape.num_hidden_layers * shape.experts * 3 * shape.hidden_size * shape.expert_width
    total, _ = count_config_parameters(config)
    found = _moe_estimates("Qwen1.5-MoE-A2.7B", 1, 2, 4, precision="bf16", amp_master_grad=True)
    for ep, result in found.items():
        (terms,) = result.memory_breakdown
        held = total - experts + experts // ep
        assert terms[memory.PARAMETERS] * 2**30 == pytest.approx(held * 2)  # bf16
        assert terms[memory.MOMENTS] * 2**30 == pytest.approx(held * 8)  # two float32 moments
        assert terms[memory.MASTER_WEIGHTS] * 2**30 == pytest.approx(held * 4)
        a2a = result.time_breakdown[throughput.ALL_TO_ALL]
        if ep == 1:
            assert a2a == 0.0 and not any("all-to-all:" in line for line in result.assumptions)
            continue
        calls = 8 * 4 * shape.num_hidden_layers  # 8 micro batches
        sent = calls * 4096 * shape.experts_per_token * shape.hidden_size * 2 * (ep - 1) / ep
        gpu, constants = find_gpu("H200"), DEFAULT_CONSTANTS
        expected = sent / (gpu.intranode_bytes_per_sec * constants.collective_efficiency)
        assert a2a == pytest.approx(expected + calls * constants.collective_latency_sec)
        reduced = (total - experts) * 4 * 2 * (ep - 1) / ep  # float32 master gradients, all-reduce factor
        assert result.time_breakdown[throughput.DATA_PARALLEL] == pytest.approx(
            reduced / (gpu.intranode_bytes_per_sec * constants.collective_efficiency) + constants.collective_latency_sec
        )
        assert f"expert parallel over the {ep} data-parallel ranks" in result.assumptions[0]
    assert found[1].memory_gib[0] > found[2].memory_gib[0] > found[4].memory_gib[0]
    # a router that sends twice the balanced share to its busiest expert doubles the dropless all-to-all
    imbalanced = _moe_estimates("Qwen1.5-MoE-A2.7B", 4, precision="bf16", routing_imbalance=2.0)[4]
    balanced = _moe_estimates("Qwen1.5-MoE-A2.7B", 4, precision="bf16")[4]
    latency = 8 * 4 * shape.num_hidden_layers * DEFAULT_CONSTANTS.collective_latency_sec
    assert imbalanced.time_breakdown[throughput.ALL_TO_ALL] - latency == pytest.approx(
        2 * (balanced.time_breakdown[throughput.ALL_TO_ALL] - latency)
    )


def test_one_expert_is_one_expert_in_the_messages():
    """The debug Qwen2-MoE's 4 experts over 4 expert-parallel ranks, and a 1-expert model over 2: before issue 42
    item 11 the assumption read "each card holds 1 experts per layer" and the refusal "the 1 experts do not
    divide over the 2 data-parallel ranks"."""
    config = find_model_size("qwen2_moe-debug").model_config()
    result = estimate(workload(config, world=4, expert_parallel=True, seq_length=256))
    assert "each card holds 1 expert per layer (their weights" in result.assumptions[0]
    config.num_experts, config.num_experts_per_tok = 1, 1
    assert problems(workload(config, world=2, expert_parallel=True))[0].startswith(
        "use_expert_parallel: the 1 expert does not divide over the 2 data-parallel ranks"
    )


def test_expert_parallelism_the_planner_refuses():
    """What paddlenlp or this app cannot run is refused as the preflight refuses it (layout_rules)."""
    qwen = find_model_size("Qwen1.5-MoE-A2.7B").model_config()  # 60 experts
    assert problems(workload(qwen, world=8, expert_parallel=True)) == [
        "use_expert_parallel: the 60 experts do not divide over the 8 data-parallel ranks (paddlenlp's "
        "expert-parallel degree is the data-parallel degree); launch a number of ranks that divides 60"
    ]
    (sharded,) = problems(workload(qwen, world=4, stage=2, degree=4, expert_parallel=True))
    assert sharded.startswith("use_expert_parallel: verified beside data parallelism and sharding stage1, not with")
    assert problems(workload(qwen, world=4, stage=1, degree=2, expert_parallel=True)) == []
    (mixtral,) = problems(workload(find_model_size("mixtral-debug").model_config(), world=2, expert_parallel=True))
    assert "MixtralSparseMoeBlock" in mixtral
    assert problems(workload(world=2, expert_parallel=True)) == [
        "use_expert_parallel: the model has no experts; set it false"
    ]
