"""Each rule of ``pretrain.layout_rules`` on its own: a layout that breaks that rule only gets that
rule's lines, from ``problems`` as from the rule itself, and a layout that keeps every rule gets none."""

from types import SimpleNamespace

import pytest

from pretrain import layout_rules
from pretrain.layout import ParallelLayout
from pretrain.layout_rules import RULES, RunFlags, problems
from pretrain.planner import validity
from pretrain.planner.workload import Workload
from pretrain.precision import Precision
from pretrain.preflight import check_layout
from pretrain.registry import find_model_size

FLAGS = RunFlags(
    seq_length=256, use_flash_attention=True, fuse_attention_qkv=False, amp_master_grad=False, half_precision=True
)


def _config(name: str = "llama-debug", **changes):
    """A registry debug config (llama-debug: 4 layers, 4 heads, MLP 704, vocabulary 8064) with ``changes``."""
    config = find_model_size(name).model_config()
    for key, value in changes.items():
        setattr(config, key, value)
    return config


# (rule, config, layout, flags, the start of each line it gives)
CASES = [
    (
        layout_rules._degrees_multiply_to_the_cards,
        _config(),
        ParallelLayout(8, 1, tensor_parallel_degree=2),
        FLAGS,
        ["sharding_parallel_degree: the parallel degrees multiply to 2, not the 8 cards"],
    ),
    (
        layout_rules._tensor_parallel_divides_heads_and_mlp,
        _config(),
        ParallelLayout(3, 1, tensor_parallel_degree=3),
        FLAGS,
        [
            "tensor_parallel_degree: 3 does not divide num_attention_heads 4",
            "tensor_parallel_degree: 3 does not divide intermediate_size",
        ],
    ),
    (
        layout_rules._vocabulary_divides_where_always_split,
        _config("gpt3-debug", vocab_size=8065),
        ParallelLayout(2, 1, tensor_parallel_degree=2),
        FLAGS,
        ["vocab_size: 8065 is not divisible by tensor_parallel_degree 2"],
    ),
    (
        layout_rules._fused_qkv_divides_key_value_heads,
        _config("qwen2-debug"),
        ParallelLayout(4, 1, tensor_parallel_degree=4),
        FLAGS._replace(fuse_attention_qkv=True),
        ["fuse_attention_qkv: 2 key/value heads do not divide"],
    ),
    (
        layout_rules._pipeline_stages_fit_the_layers,
        _config(),
        ParallelLayout(8, 1, pipeline_parallel_degree=8),
        FLAGS,
        ["pipeline_parallel_degree: 8 stages x 1 virtual stages exceed the 4 layers"],
    ),
    (
        layout_rules._pipeline_stages_fit_the_layers,
        _config(),
        ParallelLayout(1, 1, virtual_pp_degree=3),
        FLAGS,
        ["virtual_pp_degree: 4 layers do not divide into 1 pipeline stages x 3 virtual stages"],
    ),
    (
        layout_rules._pipeline_needs_a_pipe_class,
        _config("mixtral-debug"),
        ParallelLayout(2, 1, pipeline_parallel_degree=2),
        FLAGS,
        ["pipeline_parallel_degree: 2, but paddlenlp has no pipeline-parallel class for model_type 'mixtral'"],
    ),
    (
        layout_rules._pipeline_needs_a_pipe_class,
        _config("qwen3-debug"),
        ParallelLayout(2, 1, pipeline_parallel_degree=2),
        FLAGS,
        ["pipeline_parallel_degree: 2, but paddlenlp has no pipeline-parallel class for model_type 'qwen3'"],
    ),
    (
        layout_rules._pipeline_needs_a_pipe_class,
        _config("qwen3_moe-debug"),
        ParallelLayout(2, 1, pipeline_parallel_degree=2),
        FLAGS,
        ["pipeline_parallel_degree: 2, but paddlenlp has no pipeline-parallel class for model_type 'qwen3_moe'"],
    ),
    (
        layout_rules._pipeline_needs_a_pipe_class,
        _config("ernie-4.5-debug"),
        ParallelLayout(2, 1, pipeline_parallel_degree=2),
        FLAGS,
        ["pipeline_parallel_degree: 2, but paddlenlp has no pipeline-parallel class for model_type 'ernie4_5'"],
    ),
    (
        layout_rules._pipeline_needs_a_pipe_class,
        _config("qwen2_moe-debug"),
        ParallelLayout(2, 1, pipeline_parallel_degree=2),
        FLAGS,
        ["pipeline_parallel_degree: 2, but a mixture of experts (qwen2_moe) adds its load-balancing loss"],
    ),
    (
        layout_rules._pipeline_with_sharding_stage1_only,
        _config(),
        ParallelLayout(4, 1, pipeline_parallel_degree=2, sharding_stage=2, sharding_parallel_degree=2),
        FLAGS,
        ["sharding: pipeline parallelism works with sharding stage1 only, not stage2"],
    ),
    (
        layout_rules._sharding_stage3_without_tensor_parallel,
        _config(),
        ParallelLayout(4, 1, tensor_parallel_degree=2, sharding_stage=3, sharding_parallel_degree=2),
        FLAGS,
        ["sharding: stage3 does not combine with tensor parallelism"],
    ),
    (
        layout_rules._master_grad_sharding_without_data_parallel,
        _config(),
        ParallelLayout(4, 1, sharding_stage=2, sharding_parallel_degree=2, data_parallel_degree=2),
        FLAGS._replace(amp_master_grad=True),
        ["sharding_parallel_degree: sharding stage2 with amp_master_grad does not support 2"],
    ),
    (
        layout_rules._sep_divides_heads,
        _config(),
        ParallelLayout(3, 1, sep_parallel_degree=3),
        FLAGS,
        ["sep_parallel_degree: 3 does not divide num_attention_heads 4"],
    ),
    (
        layout_rules._context_parallel_divides_the_sequence,
        _config(),
        ParallelLayout(2, 1, context_parallel_degree=2),
        FLAGS._replace(seq_length=255),
        ["context_parallel_degree: 2 does not divide max_seq_length 255"],
    ),
    (
        layout_rules._flash_attention_in_half_precision,
        _config(),
        ParallelLayout(1, 1),
        FLAGS._replace(half_precision=False),
        ["use_flash_attention: flash attention runs in fp16 or bf16 only"],
    ),
    (
        layout_rules._context_parallel_needs_flash_attention,
        _config(),
        ParallelLayout(2, 1, context_parallel_degree=2),
        FLAGS._replace(use_flash_attention=False),
        ["context_parallel_degree: context parallelism needs use_flash_attention true"],
    ),
    (
        layout_rules._sequence_parallel_needs_tensor_parallel,
        _config(),
        ParallelLayout(1, 1, sequence_parallel=True),
        FLAGS,
        ["sequence_parallel: needs tensor_parallel_degree > 1"],
    ),
    (  # before: passed preflight, then moe_layer.py:244 failed to unpack the 2-D shard at the first forward
        layout_rules._experts_without_sequence_parallel,
        _config("qwen2_moe-debug"),
        ParallelLayout(2, 1, tensor_parallel_degree=2, sequence_parallel=True),
        FLAGS,
        ["sequence_parallel: qwen2_moe's MoE layers take [batch, seq, hidden] inputs"],
    ),
    (
        layout_rules._experts_without_sequence_parallel,
        _config("qwen3_moe-debug"),
        ParallelLayout(2, 1, tensor_parallel_degree=2, sequence_parallel=True),
        FLAGS,
        ["sequence_parallel: qwen3_moe's MoE layers take [batch, seq, hidden] inputs"],
    ),
    (  # before: passed preflight; the support matrix's Mixtral SH2 stage3 runs hung in the first backward (gloo
        # timeout, 4 of 4), MixtralSparseMoeBlock running on each rank only the experts its tokens chose
        layout_rules._skipped_experts_without_sharding_stage3,
        _config("mixtral-debug"),
        ParallelLayout(2, 1, sharding_stage=3, sharding_parallel_degree=2),
        FLAGS,
        ["sharding: stage3 hangs with mixtral: MixtralSparseMoeBlock skips the experts no token chose"],
    ),
    (  # before: passed preflight; paddlenlp would take each rank's last token of its piece for the MTP depth
        layout_rules._multi_token_prediction_without_sequence_splits,
        _config("deepseek_v3-debug"),
        ParallelLayout(2, 1, sep_parallel_degree=2),
        FLAGS,
        ["sep_parallel_degree: 2 splits each sample's sequence, but the multi-token prediction of deepseek_v3"],
    ),
]


def test_every_rule_has_a_case():
    assert {case[0] for case in CASES} == set(RULES)


@pytest.mark.parametrize(
    "rule, config, layout, flags, starts", CASES, ids=lambda value: getattr(value, "__name__", None)
)
def test_a_layout_breaking_one_rule_gets_its_lines_only(rule, config, layout, flags, starts):
    lines = rule(config, layout, flags)
    assert len(lines) == len(starts) and all(line.startswith(start) for line, start in zip(lines, starts))
    assert problems(config, layout, flags) == lines


def test_a_layout_keeping_every_rule_gets_none():
    layout = ParallelLayout(
        8,
        1,
        tensor_parallel_degree=2,
        pipeline_parallel_degree=2,
        sharding_stage=1,
        sharding_parallel_degree=2,
        sequence_parallel=True,
    )
    assert problems(_config(), layout, FLAGS._replace(amp_master_grad=True)) == []


@pytest.mark.parametrize(
    "precision, master, half",
    [
        # paddlenlp asserts "no plain data parallelism" for stage2 main grads at O1 as at O2 (_wrap_model)
        (Precision("bf16", "O1", True), True, True),
        (Precision("bf16", "O2", True), True, True),
        (Precision("fp16", "O2", False), False, True),
        (
            Precision.from_arguments(
                SimpleNamespace(bf16=False, fp16=False, fp16_opt_level="O2", amp_master_grad=True)
            ),
            False,
            False,
        ),
    ],
)
def test_run_flags_are_built_from_the_precision_and_the_kernel_flags(precision, master, half):
    flags = RunFlags.of(512, precision, None, 1)
    assert flags == RunFlags(
        seq_length=512, use_flash_attention=False, fuse_attention_qkv=True, amp_master_grad=master, half_precision=half
    )


def test_preflight_and_the_planner_build_the_same_flags_for_one_run():
    """One run, its two adapters: preflight (from the plan) and the planner (from its Workload)."""
    config = _config(use_flash_attention=True, fuse_attention_qkv=True)
    args = SimpleNamespace(
        bf16=True,
        fp16=False,
        fp16_opt_level="O1",
        amp_master_grad=True,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=1,
        recompute=False,
    )
    layout = ParallelLayout(4, 1, sharding_stage=2, sharding_parallel_degree=2, data_parallel_degree=2)
    plan = SimpleNamespace(model_config=config, layout=layout, training_args=args, seq_length=256)
    data_args = SimpleNamespace(max_seq_length=256, reset_attention_mask=False)
    workload = Workload.from_arguments(config, layout, None, data_args, args, "A100-SXM4-80GB")
    from_plan, from_workload = check_layout(plan), validity.problems(workload)
    assert from_plan == from_workload
    assert [line.split(":")[0] for line in from_plan] == ["sharding_parallel_degree"]
