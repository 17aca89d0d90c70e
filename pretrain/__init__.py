"""PaddleNLP-native LLM pretraining: the logic behind ``run_pretrain.py`` and ``tools/``.

``run_pretrain.py`` reads as parse -> lock -> resolve -> check -> build -> train -> report, one module each:

  arguments    -- parse: the three argument dataclasses and the JSON + command-line parser.
  run_lock     -- lock: one run per output_dir (a per-node flock held for the run's life).
  resolve      -- resolve: the RunPlan (layout, tokenizer, model config, data sources, resume point).
  preflight    -- check: every problem of a RunPlan, one line each, before anything is built.
  data         -- build: data sources, causal datasets over .bin/.idx, the index cache, the shifting collator.
  document_mask -- build: document-aware packing (positions, block-diagonal mask, EOS loss) and its collator.
  model        -- build: the paddlenlp model class, dtype and weights.
  trainer      -- train: the PaddleNLP Trainer subclass used for pretraining.
  report       -- report: the dry-run text, the run's header and run_config.json.
  progress     -- train: the progress bar and one line per log record, with the ETA.
  board        -- train: the VisualDL board (scalars, hyper-parameters, settings).
  summary      -- report: the end-of-run figures written to run_summary.json, and their few printed lines.

``run_finetune.py`` (LoRA fine-tuning) reads the same way on the same modules, plus:

  finetune_arguments -- parse: the fine-tuning data and LoRA dataclasses.
  finetune     -- resolve, check, report: the FinetunePlan, its LoRA and data checks, dry run, summary keys.
  finetune_data -- build: src/tgt pairs tokenized, prompts masked, truncated, packed; the padding collator.
  lora         -- build: paddlenlp.peft's LoRAModel on the saved model, adapter size, merge.
  generate     -- greedy generation around paddlenlp 3.0.0b4's generate() pitfall.
  mmlu         -- few-shot MMLU accuracy (tools/eval_mmlu.py).
  finetune_demo -- the CPU demo's pairs from the demo corpus (make finetune-demo).

What they rest on:

  errors       -- UserError: a one-line, actionable message for bad input; run_cli.
  log          -- the application's logger (global rank 0 speaks); quieting known third-party noise.
  atomic       -- files written aside, flushed and renamed into place only when complete; CRC-32C of files.
  layout       -- the hybrid-parallel layout, as launched or on a simulated N x K cluster.
  layout_rules -- what paddle and paddlenlp require of a model, a layout and its flags.
  plan_mode    -- a config resolved, checked and estimated for its target GPU cluster (tools/plan.py).
  planner      -- predicted memory per card and tokens/card/s, from arithmetic (docs/planner.md).
  registry     -- published architectures as data: families, sizes, aliases, paddlenlp classes.
  model_config -- the model config: registry entry or config.json, overrides, runtime flags, vocabulary.
  tokenizers   -- loading a tokenizer from a local folder.
  param_count  -- parameter counts from a model config, without building the model.
  flops        -- model FLOPs per token and MFU (PaLM definition).
  hardware     -- peak FLOP/s per card (datasheets, or a measured CPU peak: the best of several trials).
  lr_schedule  -- warm-up then linear or cosine decay, or constant: the schedule table and its step arithmetic.
  checkpoint   -- verified checkpoints: completion marker with checksums, agreed resume point, rotation, sizes.
  nan_guard    -- a non-finite loss or gradient stops the run or skips the step; non-finite weights are not saved.
  throughput   -- step timing: tokens/card/s and MFU, excluding warm-up, eval and checkpoint time.
  memory       -- peak memory of this process's card.
  loss_history -- the Trainer callback that keeps per-step losses in loss_history.json (and in each checkpoint).
  sample_log   -- each optimizer step's sample ids: a rolling hash per step in loss_history.json, ids to a file.
  loss_curves  -- reading loss curves, the loss-alignment rule, plots (no paddle import).
  fused_ops    -- is the fused_ln custom op installed, loadable and callable on the run's device.
  preprocess   -- corpus building (jsonl, Parquet, Arrow), tokenizer training and .bin/.idx writing (tools/preprocess/).
"""
