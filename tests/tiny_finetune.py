"""Tiny CPU fine-tuning runs for the tests: a pretrained tiny LLaMA and the demo's src/tgt pairs.

The base model is tests/tiny_run.py's (2 layers x 64 wide, 8064-row vocabulary) pretrained for a
few steps on the demo corpus and saved by run_pretrain.py; the pairs are a slice of the CPU
demo's "the Bible or Shakespeare?" set (pretrain.finetune.demo), built from the real corpus.
"""

import os
import sys

from conftest import REPO, load_script
from tiny_run import tiny_args, with_overrides

FINETUNE_CONFIG = os.path.join(REPO, "config", "llama", "lora_demo_cpu.json")
PYTHON = sys.executable


def pretrain_tiny_model(output_dir: str, steps: int = 30) -> str:
    """Pretrain tests/tiny_run.py's model for ``steps`` steps (in this process) and return its folder."""
    argv = tiny_args(output_dir, os.path.join(output_dir, "cache"), steps=steps, save_steps=1000)
    load_script("run_pretrain.py").main(argv + ["--report_to", "none", "--measure_peak_flops", "false"])
    return output_dir


def write_demo_pairs(folder: str, train: int, dev: int) -> str:
    """The first ``train`` training and ``dev`` held-out demo pairs as train.json/dev.json in ``folder``."""
    from pretrain.finetune.demo import build_pairs, write_pairs

    train_pairs, dev_pairs = build_pairs(os.path.join(REPO, "data", "demo", "corpus.jsonl"))
    write_pairs(train_pairs[:train], os.path.join(folder, "train.json"))
    write_pairs(dev_pairs[:dev], os.path.join(folder, "dev.json"))
    return folder


def finetune_args(model_dir: str, data_dir: str, output_dir: str, *extra: str, steps: int = 20) -> list:
    """run_finetune.py arguments: the CPU demo config on the tiny model, 64-token packed sequences,
    4 per step, loss logged every step, no VisualDL, no peak-FLOP/s benchmark."""
    argv = [
        FINETUNE_CONFIG,
        "--model_name_or_path",
        model_dir,
        "--dataset_name_or_path",
        data_dir,
        "--output_dir",
        output_dir,
        "--max_seq_length",
        "64",
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "4",
        "--max_steps",
        str(steps),
        "--warmup_steps",
        "2",
        "--learning_rate",
        "0.01",
        "--logging_steps",
        "1",
        "--eval_steps",
        "1000",
        "--save_steps",
        "5",
        "--report_to",
        "none",
        "--measure_peak_flops",
        "false",
    ]
    return with_overrides(argv, *extra)


def save_random_model(folder: str, hidden_size: int = 64) -> str:
    """An untrained 2-layer LLaMA ``hidden_size`` wide (demo tokenizer's vocabulary, 64 positions) saved
    with that tokenizer in ``folder``: a base model in seconds, for the checks that need no training."""
    from paddlenlp.transformers import LlamaForCausalLM
    from tiny_models import tiny_llama_config

    from pretrain.tokenizers import load_tokenizer_from

    tokenizer = load_tokenizer_from(os.path.join(REPO, "data", "demo", "tokenizer"))
    config = tiny_llama_config(hidden_size, vocab_size=len(tokenizer))
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def save_random_adapter(base_dir: str, folder: str) -> str:
    """A rank-4 adapter on q_proj and v_proj of the model in ``base_dir``, with random A and B (B is not
    left at 0, so merging it changes the weights), saved as run_finetune.py saves one: ``folder``."""
    import paddle
    from paddlenlp.peft import LoRAConfig, LoRAModel
    from paddlenlp.transformers import AutoModelForCausalLM

    config = LoRAConfig(target_modules=[".*q_proj", ".*v_proj"], r=4, lora_alpha=8, base_model_name_or_path=base_dir)
    model = LoRAModel(AutoModelForCausalLM.from_pretrained(base_dir), config)
    paddle.seed(0)
    for value in model.get_trainable_state_dict().values():
        value.set_value(paddle.randn(value.shape, dtype=value.dtype) * 0.1)
    model.save_pretrained(folder)
    return folder
