"""LoRA fine-tuning (``run_finetune.py``, ``tools/merge_lora.py``, ``tools/generate.py``, ``tools/eval_mmlu.py``).

It reads the same way as pretraining, on the same modules (``pretrain.arguments``, ``pretrain.resolve``,
``pretrain.preflight``, ``pretrain.trainer``), plus:

  lora_arguments -- parse: the fine-tuning data and LoRA dataclasses.
  run          -- resolve, check, report: the FinetunePlan, its LoRA and data checks, dry run, summary keys.
  pairs        -- build: src/tgt pairs tokenized, prompts masked, truncated, packed; the padding collator.
  lora         -- build: paddlenlp.peft's LoRAModel on the saved model, adapter size, merge.
  generate     -- greedy generation around paddlenlp 3.0.0b4's generate() pitfall.
  mmlu         -- few-shot MMLU accuracy (tools/eval_mmlu.py).
  demo         -- the CPU demo's pairs from the demo corpus (make finetune-demo).
"""
