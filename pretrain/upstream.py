"""The ledger of upstream patches: every place this application replaces paddle or paddlenlp code, in one table,
with the versions they were verified on (the one version module: ``PADDLE_VERSION``, ``PADDLENLP_VERSION``).

Each ``Patch`` names what it replaces (``targets``: ``module:attribute`` paths, resolvable on the pinned stack),
the upstream file and line, the module and function of ours that installs it, why, and the versions it was
verified on. The CPU stack pins both versions (requirements-cpu.txt). ``tests/test_upstream_ledger.py`` keeps
the table whole: every assignment to a paddle/paddlenlp attribute anywhere under ``pretrain/`` is in a module
the table names, every target resolves, and the test suite restores every target after each test module
(``tests/conftest.py``).

On another version, ``verified`` decides: a fix of upstream behaviour (``on_other_versions="skip"``) warns once
and leaves the upstream code alone (a release may have fixed it; applied twice it would be wrong); a change
the run's results depend on (``"warn"``: the optimizer's decay names and clip) is applied with one warning; a
replacement the run cannot do without (``"refuse"``: the CPU stand-ins for NCCL) stops with one line naming
the versions to install.

Scope: ``process`` patches change a class or module for the whole process, once installed; ``instance``
patches change one object the run built (an optimizer, a scaler, a pipeline model) and end with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import paddle
import paddlenlp

from pretrain.errors import UserError
from pretrain.log import logger

PADDLENLP_VERSION = "3.0.0b4"  # paddlenlp's last release: every patch below was written against its code
PADDLE_VERSION = "3.3.1"  # the paddle the patches were measured on

PADDLE = "paddle/distributed"
FLEET = "paddle/distributed/fleet"


@dataclass(frozen=True)
class Patch:
    """One replacement of upstream code.

    ``site``: our module (dotted, under ``pretrain``) that installs it; ``installer``: its function.
    ``targets``: ``"module:Attr.attr"`` paths of what it replaces (``process`` scope; for ``instance``
    scope, the class whose instances it changes). ``upstream``: file:line of the replaced code in the pinned
    release. ``verified_on``: ``(paddle, paddlenlp)``. ``on_other_versions``: ``"skip"`` or ``"refuse"``.
    """

    name: str
    site: str
    installer: str
    targets: tuple
    upstream: str
    why: str
    scope: str = "process"
    on_other_versions: str = "skip"
    verified_on: tuple = (PADDLE_VERSION, PADDLENLP_VERSION)


PATCHES = (
    Patch(
        "moe-routing",
        "compat.moe",
        "apply",
        (
            "paddlenlp.transformers.moe_gate:PretrainedMoEGate._priority",
            "paddlenlp.transformers.moe_gate:PretrainedMoEGate.topkgating",
            "paddlenlp.transformers.mixtral.modeling:MixtralSparseMoeBlock.forward",
        ),
        "paddlenlp/transformers/moe_gate.py:213, :498; paddlenlp/transformers/mixtral/modeling.py:500",
        "the routing breaks on paddle >= 3.1 (int cumsum), and its dispatch mask passes no gradient to the gate",
    ),
    Patch(
        "deepseek-moe-forward",
        "compat.moe",
        "fix_deepseek_moe",
        ("paddlenlp.transformers.deepseek_v2.modeling:DeepseekV2MoE",),
        "paddlenlp/transformers/deepseek_v2/modeling.py:769; paddlenlp/transformers/moe_gate.py:132",
        "routed_scaling_factor left out in training; the sequence aux loss counts a choice once per sequence",
        scope="instance",
    ),
    Patch(
        "gpt-tied-head-mapping",
        "compat.gpt",
        "apply",
        ("paddlenlp.transformers.gpt.modeling:GPTPretrainedModel._get_tensor_parallel_mappings",),
        "paddlenlp/transformers/gpt/modeling.py:840",
        "the tensor-parallel mapping lacks the LM head tied to the embedding",
    ),
    Patch(
        "deepseek-rope-key-gradient",
        "compat.deepseek_attention",
        "sum_rotary_key_gradient",
        ("paddlenlp.transformers.deepseek_v2.modeling:DeepseekV2Attention",),
        "paddlenlp/transformers/deepseek_v2/modeling.py:860, :983",
        "under TP the shared rotary key's gradient covers only this rank's heads",
        scope="instance",
    ),
    Patch(
        "rope-tables",
        "compat.rope_tables",
        "trim",
        (
            "paddlenlp.transformers.llama.modeling:LlamaRotaryEmbedding",
            "paddlenlp.transformers.qwen2.modeling:Qwen2RotaryEmbedding",
            "paddlenlp.transformers.qwen2_moe.modeling:Qwen2MoeRotaryEmbedding",
            "paddlenlp.transformers.mixtral.modeling:MixtralRotaryEmbedding",
        ),
        "paddlenlp/transformers/llama/modeling.py:433; qwen2/modeling.py:339; qwen2_moe/modeling.py:376; "
        "mixtral/modeling.py:394",
        "each attention layer keeps float32 cos/sin tables for all max_position_embeddings positions (4 GiB on "
        "Llama-3.1-8B) where a run reads its sequence length's",
        scope="instance",
    ),
    Patch(
        "weight-init",
        "compat.weight_init",
        "redraw",
        (
            "paddlenlp.transformers.deepseek_v2.modeling:DeepseekV2PretrainedModel._init_weights",
            "paddlenlp.transformers.qwen.modeling:QWenPretrainedModel._init_weights",
        ),
        "paddlenlp/transformers/deepseek_v2/modeling.py:1395; paddlenlp/transformers/qwen/modeling.py:729",
        "DeepSeek-V2's initialiser returns at once (Xavier weights); QWen's draws only tensor-parallel slices, "
        "and its c_proj slices alike on every tensor-parallel rank",
        scope="instance",
    ),
    Patch(
        "mtp-projection-bias",
        "mtp",
        "drop_projection_bias",
        ("paddlenlp.transformers.deepseek_v2.modeling:DeepseekV2MTPLayer",),
        "paddlenlp/transformers/deepseek_v2/modeling.py:1184",
        "the multi-token-prediction projection eh_proj has a bias that DeepSeek-V3's M_k and checkpoint do not",
        scope="instance",
        on_other_versions="warn",
    ),
    Patch(
        "mtp-tensor-parallel-mapping",
        "mtp",
        "install_tensor_parallel_mapping",
        ("paddlenlp.transformers.deepseek_v2.modeling:DeepseekV2PretrainedModel._get_tensor_parallel_mappings",),
        "paddlenlp/transformers/deepseek_v2/modeling.py:1378",
        "the tensor-parallel mapping splits the multi-token-prediction eh_proj, which the training layer holds whole",
    ),
    Patch(
        "single-process-unified-load",
        "resume_layout",
        "install_single_process_unified_load",
        ("paddlenlp.trainer.unified_checkpoint.load_save_single_card:load_state_dict",),
        "paddlenlp/trainer/unified_checkpoint/load_save_single_card.py:186",
        "one process reads only the first shard file of a TP/PP run's unified checkpoint",
    ),
    Patch(
        "stage3-weight-decay-and-expert-parallel-clip",
        "optimizer_chain",
        "adapt_created_optimizer",
        ("paddle.optimizer:AdamW",),
        "paddlenlp/trainer/trainer.py:create_optimizer (decay_parameters); paddle/nn/clip.py ClipGradByGlobalNorm",
        "stage3's slice@ names miss the decay rule; expert parallelism needs the norm over every rank's experts",
        scope="instance",
        on_other_versions="warn",
    ),
    Patch(
        "stage2-views-after-unified-load",
        "optimizer_chain",
        "restore_stage2_views",
        ("paddle.distributed.fleet.meta_parallel.sharding.group_sharded_storage:ParamStorage",),
        "paddlenlp/trainer/unified_checkpoint/load_local.py:134; paddlenlp/transformers/model_utils.py:843",
        "a unified checkpoint's load re-points parameters at new memory: after a rollback, stage2's buffers no "
        "longer hold them",
        scope="instance",
        on_other_versions="warn",
    ),
    Patch(
        "fp16-unscale-verdict",
        "nan_guard",
        "ScalerSkip",
        ("paddle.amp.grad_scaler:AmpScaler",),
        "paddle/amp/grad_scaler.py:354",
        "the loss scaler's overflow check feeds the step verdict (one all-reduce, every rank agrees)",
        scope="instance",
        on_other_versions="warn",
    ),
    Patch(
        "pipeline-injected-spike",
        "recovery",
        "pipeline_spike",
        (f"{FLEET.replace('/', '.')}.meta_parallel.parallel_layers.pp_layers:PipelineLayer",),
        "paddle/distributed/fleet/meta_parallel/parallel_layers/pp_layers.py:454",
        "debug_inject_spike_at_step under pipeline parallelism (undone after the step)",
        scope="instance",
        on_other_versions="warn",
    ),
    Patch(
        "cpu-group-stores",
        "cpu_comm.groups",
        "install_group_stores",
        ("paddle.distributed.collective:_new_process_group_impl",),
        f"{PADDLE}/collective.py:154",
        "gloo groups of different members collide in the job's rendezvous store",
        on_other_versions="refuse",
    ),
    Patch(
        "cpu-collectives",
        "cpu_comm.collectives",
        "install_collectives",
        ("paddle.base.core:ProcessGroupGloo",),
        f"{PADDLE}/communication/stream/*.py (the *_on_calc_stream calls)",
        "gloo lacks the calc-stream variants, reduce_scatter and all_to_all",
        on_other_versions="refuse",
    ),
    Patch(
        "cpu-kernels",
        "cpu_comm.kernels",
        "install_kernels",
        ("paddle:_C_ops",),
        f"{FLEET}/layers/mpu/mp_ops.py:42",
        "c_identity, c_split, c_concat and the parallel cross-entropy have no CPU kernel",
        on_other_versions="refuse",
    ),
    Patch(
        "cpu-places",
        "cpu_comm.places",
        "install_places",
        (
            "paddle.distributed.fleet.meta_parallel.tensor_parallel:broadcast_input_data",
            "paddle.distributed.parallel:ParallelEnv._device_id",
        ),
        f"{FLEET}/utils/hybrid_parallel_util.py:202; {PADDLE}/parallel.py:757",
        "two GPU-place assumptions",
        on_other_versions="refuse",
    ),
    Patch(
        "cpu-pipeline-p2p",
        "cpu_comm.pipeline",
        "install_pipeline",
        (
            "paddle.distributed.fleet.meta_parallel.pp_utils.p2p_communication:batch_send_recv_on_calc_stream",
            "paddle.distributed.fleet.meta_parallel.pp_utils.p2p_communication:_is_valid_send_recv_partial",
            "paddle.distributed.fleet.meta_parallel.pp_utils.p2p_communication:SendRecvMeta",
        ),
        f"{FLEET}/meta_parallel/pp_utils/p2p_communication.py:56, :264, :357",
        "batched P2P relies on NCCL's non-blocking sends and one tag sequence per pair",
        on_other_versions="refuse",
    ),
    Patch(
        "cpu-pipeline-recompute",
        "cpu_comm.recompute",
        "install_recompute",
        (f"{FLEET.replace('/', '.')}.meta_parallel.parallel_layers.pp_layers:recompute_hybrid",),
        f"{FLEET}/recompute/recompute_hybrid.py:136; {FLEET}/meta_parallel/parallel_layers/pp_layers.py:1195",
        "the pipeline layer's recompute saves the random states only on GPU, XPU and custom devices",
        on_other_versions="refuse",
    ),
    Patch(
        "cpu-group-sharded",
        "cpu_comm.sharding",
        "install",
        (
            "paddle.distributed.sharding:group_sharded_parallel",
            "paddle.distributed.fleet.meta_parallel.sharding.group_sharded_storage:ParamStorage.add_rank_params",
            "paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage3:_device2cpu",
        ),
        f"{PADDLE}/sharding/group_sharded.py:50; {FLEET}/meta_parallel/sharding/group_sharded_storage.py:135",
        "the group-sharded stage2/stage3 wrappers accept only GPU, XPU and custom devices",
        on_other_versions="refuse",
    ),
    Patch(
        "collective-byte-counter",
        "metrics.comm_volume",
        "install_counter",
        ("paddle.base.core:ProcessGroupGloo",),
        f"{PADDLE}/communication/*.py (every data-moving ProcessGroupGloo method)",
        "counts the bytes and seconds of every gloo collective; installed after cpu-collectives, which it wraps",
        on_other_versions="skip",
    ),
)
BY_NAME = {patch.name: patch for patch in PATCHES}
_WARNED: set = set()  # patches whose warning was given (once per process)


def verified(name: str) -> bool:
    """Whether patch ``name`` may be installed on the installed paddle and paddlenlp: True on the versions it was
    verified on; else one warning, then False for ``on_other_versions="skip"`` (the upstream code stays) and True
    for ``"warn"``.

    Raises:
        UserError: ``on_other_versions="refuse"`` on other versions (one line: what to install).
    """
    patch = BY_NAME[name]
    installed = (paddle.__version__, paddlenlp.__version__)
    if installed == patch.verified_on:
        return True
    stack = f"paddlepaddle=={patch.verified_on[0]} paddlenlp=={patch.verified_on[1]}"
    if patch.on_other_versions == "refuse":
        raise UserError(
            f"{patch.name}: pretrain.{patch.site} replaces {patch.upstream} as paddle {paddle.__version__} / "
            f"paddlenlp {paddlenlp.__version__} may no longer have it; install {stack} for CPU runs of several "
            "processes"
        )
    applied = patch.on_other_versions == "warn"
    if name in _WARNED:
        return applied
    _WARNED.add(name)
    logger.warning(
        f"{patch.name}: paddle {paddle.__version__} / paddlenlp {paddlenlp.__version__} is not {stack}, whose "
        f"{patch.upstream} the patch was written for; {'applied unverified' if applied else 'left unpatched'}"
    )
    return applied


def installed() -> dict:
    """``{"paddle": version, "paddlenlp": version}`` as installed."""
    return {"paddle": paddle.__version__, "paddlenlp": paddlenlp.__version__}
