"""PaddleNLP-native LLM pretraining: the logic behind ``run_pretrain.py`` and ``tools/``.

Modules, one job each:
  errors     -- UserError: a one-line, actionable message for bad input.
  arguments  -- the three argument dataclasses and the JSON + command-line parser.
  registry   -- published architectures as data: families, sizes, aliases, paddlenlp classes.
  param_count -- parameter counts from a model config, without building the model.
  modeling   -- model config resolution, overrides and model construction.
  data       -- causal datasets over mmap .bin/.idx and the shifting collator.
  trainer    -- the PaddleNLP Trainer subclass used for pretraining.
  throughput -- step timing: tokens/card/s, excluding warm-up, eval and checkpoint time.
  flops      -- model FLOPs per token and MFU (PaLM definition).
  summary    -- the end-of-run report written to run_summary.json.
  preprocess -- corpus building, tokenizer training and .bin/.idx writing.
"""
