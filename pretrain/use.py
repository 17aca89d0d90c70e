"""A saved model used outside a run (generation, evaluation, your own code), computing what training computed.

    from pretrain.use import load_model

    model = load_model("output/qwen2_moe_demo_cpu")  # any folder save_pretrained wrote: a run's output_dir, ...

paddlenlp's ``AutoModelForCausalLM.from_pretrained`` alone loads the same weights, but paddlenlp 3.0.0b4's
mixture-of-experts forward fails on paddle 3.3.1 (Qwen2-MoE and DeepSeek: a type-promotion TypeError; Mixtral:
"Broadcast dimension mismatch" or "The add_value must be the same dimension as x"), and DeepSeek's training
forward differs from what its run trained (``pretrain.compat.moe``). ``load_model`` gives the loaded model the
fixes a run's model has (``pretrain.model.compute_as_trained``); tools/generate.py, tools/eval_mmlu.py and a LoRA
adapter's base (``pretrain.finetune.lora.load_lora_model``) load through it.
"""

from __future__ import annotations

from typing import Optional

import paddle

from pretrain.model import compute_as_trained


def load_model(path: str, dtype: Optional[str] = None) -> paddle.nn.Layer:
    """The causal LM saved in folder ``path`` (``AutoModelForCausalLM.from_pretrained``: config.json names the
    class), in ``dtype`` ("float32", "bfloat16", ...; None: paddlenlp's default, the saved config's), computing
    what its training computed (``compute_as_trained``). In training mode, as paddlenlp returns it: call
    ``model.eval()`` to generate or score.

    Raises:
        whatever paddlenlp's ``from_pretrained`` raises for a folder it cannot load (no config.json, weights
        that do not fit it).
    """
    from paddlenlp.transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, **({"dtype": dtype} if dtype else {}))
    return compute_as_trained(model, model.config.model_type)
