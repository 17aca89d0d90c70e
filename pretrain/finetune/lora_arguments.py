"""Arguments of ``run_finetune.py``: the fine-tuning data and the LoRA adapter.

The model and training flags are pretraining's own (``ModelArguments`` and ``PreTrainingArguments``
in ``pretrain.arguments``), parsed by the same ``parse_arguments``: one JSON file, ``--key value``
overrides, unknown keys named with the closest valid one. What only fine-tuning needs is defined
here, once. Names follow PaddleNLP's ``llm/run_finetune.py`` where it has the flag
(``dataset_name_or_path``, ``zero_padding``, ``lora_rank``, ``lora_alpha``); ``max_seq_length``
keeps the name it has in pretraining (PaddleNLP calls it ``max_length``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from pretrain.arguments import ModelArguments, PreTrainingArguments


@dataclass
class FinetuneDataArguments:
    """Where the supervised pairs are and how they become training sequences."""

    dataset_name_or_path: str = field(
        metadata={
            "help": "Folder holding train.json and dev.json (or .jsonl): one JSON object per line with "
            '"src" (prompt) and "tgt" (response), each a string or an equal-length list of turns '
            "(PaddleNLP's fine-tuning format). The loss is taken on the response tokens only."
        }
    )
    max_seq_length: int = field(
        default=512,
        metadata={
            "help": "Tokens per training sequence: an example longer than this is cut at the end (counted as "
            "truncated in the run summary); shorter sequences are padded to it.",
            "range": "[1, inf)",
        },
    )
    zero_padding: bool = field(
        default=False,
        metadata={
            "help": "Pack consecutive examples into one max_seq_length sequence (paddlenlp's ZeroPaddingMapDataset): "
            "a block-diagonal attention mask keeps examples from attending to each other and positions restart "
            "at 0 for each example."
        },
    )


@dataclass
class LoRAArguments:
    """The LoRA adapter (paddlenlp.peft.LoRAConfig) and what to do with it at the end."""

    lora_rank: int = field(
        default=8,
        metadata={
            "help": "LoRA rank r: a weight W [in, out] gains A [in, r] and B [r, out] (elements); 8 in the "
            "published Llama-2-7B case.",
            "range": "[1, inf)",
        },
    )
    lora_alpha: int = field(
        default=32,
        metadata={
            "help": "LoRA scaling numerator: the update A @ B is scaled by lora_alpha / lora_rank.",
            "range": "(0, inf)",
        },
    )
    lora_dropout: float = field(
        default=0.05,
        metadata={"help": "Dropout probability on the input of the LoRA branch (fraction).", "range": "[0, 1)"},
    )
    lora_target_modules: List[str] = field(
        default_factory=lambda: [".*q_proj", ".*v_proj"],
        metadata={
            "help": "Regular expressions, each matched in full against sublayer names such as "
            "llama.layers.0.self_attn.q_proj; every matching linear layer gets an adapter."
        },
    )
    merge_lora: bool = field(
        default=False,
        metadata={
            "help": "After training, also write the base model with the adapter merged into its weights to "
            "<output_dir>/merged (loads with AutoModelForCausalLM.from_pretrained)."
        },
    )
    eval_base_model: bool = field(
        default=True,
        metadata={
            "help": "With do_eval, also evaluate the base model (adapter switched off) on the same pairs at the "
            "end: eval_loss_base in the run summary."
        },
    )


FINETUNE_ARGUMENT_CLASSES = (ModelArguments, FinetuneDataArguments, PreTrainingArguments, LoRAArguments)
