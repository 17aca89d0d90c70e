"""The reference outputs of paddlenlp's MoE models that tests/test_moe_compat.py holds paddle 3.3.1 to.

    python tools/moe_golden.py --output tests/golden/moe_paddle300.json   # under paddle 3.0.0

Builds a tiny Qwen2-MoE, Mixtral and DeepSeek-V2 (``TINY``: 2 layers, hidden 64, 4 experts, top-2) with weights
and input drawn from numpy's seeded generator (not paddle's, whose streams differ between versions), runs
one forward and backward in float32 on CPU, and writes per family the loss, a corner of the logits and
every parameter's gradient norm (``tiny_moe_outputs``): first with paddlenlp's MoE code unpatched
("unpatched"), then with ``pretrain.compat.moe`` applied ("patched"). Run under paddle 3.0.0 (the release
paddlenlp 3.0.0b4 was made with), where paddlenlp's MoE code runs unpatched, it is the reference: the
paddle-version fixes change nothing there, the detached dispatch mask (fix 3) only the gradients of the
top-k routed families. Under paddle 3.3.1 the unpatched forward fails, and the test calls
``tiny_moe_outputs`` with the fixes applied and compares.
"""

import os
import sys

import numpy as np
import paddle
import paddlenlp
from paddlenlp.transformers import (
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
)

from pretrain.atomic import write_json
from pretrain.compat import moe as moe_compat
from pretrain.errors import ArgumentParser, UserError, run_cli

_SHAPE = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_experts_per_tok": 2,
}
TINY = {
    "qwen2_moe": (
        Qwen2MoeForCausalLM,
        Qwen2MoeConfig(**_SHAPE, num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=64),
    ),
    "mixtral": (MixtralForCausalLM, MixtralConfig(**_SHAPE, num_local_experts=4)),
    # DeepSeek-V2-Lite's layout: MLA without a query LoRA, one dense layer first, 1 shared + routed experts,
    # greedy top-k (DeepseekV2Config's default "gready" matches no branch of moe_gate.topkgating) and YaRN
    # RoPE as published (with rope_scaling None the attention indexes a 4-D cos table as 2-D and fails).
    "deepseek_v2": (
        DeepseekV2ForCausalLM,
        DeepseekV2Config(
            **_SHAPE,
            moe_intermediate_size=32,
            n_shared_experts=1,
            n_routed_experts=4,
            first_k_dense_replace=1,
            kv_lora_rank=16,
            q_lora_rank=None,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            topk_method="greedy",
            n_group=1,
            topk_group=1,
            max_position_embeddings=163840,
            rope_scaling={
                "type": "yarn",
                "factor": 40,
                "original_max_position_embeddings": 4096,
                "mscale": 0.707,
                "mscale_all_dim": 0.707,
                "beta_fast": 32,
                "beta_slow": 1,
            },
        ),
    ),
}
BATCH, SEQ = 2, 32


def tiny_moe(family: str) -> tuple:
    """``TINY[family]`` with seeded weights, and seeded tokens (float32, CPU).

    Returns:
        (the model, [BATCH, SEQ + 1] int64 tokens: inputs ``[:, :-1]``, labels ``[:, 1:]``).
    """
    model_class, config = TINY[family]
    paddle.set_default_dtype("float32")
    model = model_class(config)
    rng = np.random.default_rng(0)
    weights = {}
    for name, param in sorted(model.state_dict().items()):
        values = rng.normal(0.0, 0.05, size=param.shape)
        weights[name] = (1.0 + values if name.endswith("norm.weight") else values).astype("float32")
    model.set_state_dict(weights)
    return model, paddle.to_tensor(rng.integers(0, config.vocab_size, size=(BATCH, SEQ + 1)), dtype="int64")


def tiny_moe_outputs(family: str) -> dict:
    """One forward and backward of ``tiny_moe(family)``.

    Returns:
        {"loss": float, "logits": [[float]] (sample 0, first 4 positions x first 4 vocabulary ids),
         "grad_norms": {parameter name: L2 norm of its gradient}}.
    """
    model, tokens = tiny_moe(family)
    # return_dict=False: DeepseekV2ForCausalLM reads the model's output tuple right, its dict wrong (hidden_states)
    loss, logits = model(input_ids=tokens[:, :-1], labels=tokens[:, 1:], return_dict=False)[:2]
    loss.backward()
    return {
        "loss": float(loss),
        "logits": logits[0, :4, :4].numpy().astype(float).tolist(),
        "grad_norms": {
            name: float(np.linalg.norm(param.grad.numpy()))
            for name, param in model.named_parameters()
            if param.grad is not None
        },
    }


def main(argv=None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    folder = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(folder):  # checked before the models run
        raise UserError(f"--output {args.output}: {folder} is not a folder; give a path in an existing folder")
    unpatched = {family: tiny_moe_outputs(family) for family in TINY}
    moe_compat.apply()
    golden = {
        "produced_by": "tools/moe_golden.py",
        "paddle": paddle.__version__,
        "paddlenlp": paddlenlp.__version__,
        "unpatched": unpatched,
        "patched": {family: tiny_moe_outputs(family) for family in TINY},
    }
    write_json(args.output, golden, indent=1, end="\n")  # atomically: no half-written golden file
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
