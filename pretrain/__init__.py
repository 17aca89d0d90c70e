"""PaddleNLP-native LLM pretraining: the logic behind ``run_pretrain.py`` and ``tools/``.

``run_pretrain.py`` reads as parse -> lock -> resolve -> check -> build -> train -> report, one module each:

  arguments    -- parse: the three argument dataclasses and the JSON + command-line parser.
  schema       -- parse: each key's range as field metadata, one checker, the relations between keys.
  run_lock     -- lock: one run per output_dir (a per-node flock held for the run's life).
  resolve      -- resolve: the RunPlan (layout, tokenizer, model config, data sources, resume point).
  preflight    -- check: every problem of a RunPlan, one line each, before anything is built.
  data         -- build: data sources, causal datasets over .bin/.idx, the index cache, the shifting collator.
  document_mask -- build: document-aware packing (positions, block-diagonal mask, EOS loss) and its collator.
  sample_log   -- train: each optimizer step's sample ids, a rolling hash per step in loss_history.json.
  corpus       -- the tokenized corpus on disk (.bin/.idx/.stats.json): detect, read, write, verify, merge.
  model        -- build: the paddlenlp model class, dtype and weights.
  routing      -- train: mixture of experts: the load-balancing loss added to the loss, per-expert token shares.
  bias_balancing -- train: DeepSeek-V3's routing biases moved toward balance after each step.
  trainer      -- train: the PaddleNLP Trainer subclass used for pretraining: composition and one-line hooks.
  checkpoint_manager -- train: save, mark, rotate, roll back, reshard-on-load; the run states inside checkpoints.
  step_verdict -- train: each optimizer step applied, skipped or stopped, judged on the reduced gradients.
  optimizer_chain -- train: the optimizer as wrapped for a layout: own parameters, decay names, the EP clip.
  moe_training -- train: mixture of experts in the loop: load-balancing loss, routing figures, bias balancing.
  report       -- report: the dry-run text, the run's header and run_config.json.
  metrics      -- train, report: step timing, MFU, memory, progress lines, the VisualDL board, loss
                  history and the run summary (the ``pretrain.metrics`` package, its own module map).

``run_pretrain.py CONFIG --rehearse true`` instead launches the config's layout on CPU processes:

  rehearsal    -- a GPU recipe's layout on CPU processes, model shrunk: runs, saves, resumes, exports.

What runs in which parallel layout for which family (read by ``make matrix``, the tests and the docs):

  support_matrix -- features x layouts x families as data, each cell's verdict from the real preflight.

``run_finetune.py`` (LoRA fine-tuning) reads the same way on the same modules, plus:

  finetune     -- the fine-tuning package (its own module map): LoRA arguments, plan, pairs, adapter, generation, MMLU.

What they rest on:

  errors       -- UserError: a one-line, actionable message for bad input; run_cli.
  cluster      -- a multi-rank run fails together in bounded time and leaves no process behind: agreed
                  verdicts, the watchdog, child reaping, shared-folder probes, how an entry script's ranks end
                  (run_launched; the ``pretrain.cluster`` package).
  log          -- the application's logger (global rank 0 speaks); quieting known third-party noise.
  atomic       -- files written aside, flushed and renamed into place only when complete; CRC-32C of files.
  enums        -- paddlenlp's enum-valued arguments as plain values.
  upstream     -- the ledger of upstream patches: every replacement of paddle/paddlenlp code, its file:line,
                  the versions it was verified on and its guard on others.
  layout       -- the hybrid-parallel layout, as launched or on a simulated N x K cluster; a pinned global batch.
  layout_rules -- what paddle and paddlenlp require of a model, a layout and its flags.
  cpu_comm     -- paddle's GPU-only parallel code on CPU processes (gloo), for CPU runs only: what tensor,
                  sequence and pipeline parallelism need from NCCL, sharding stage2/3 (``pretrain.cpu_comm``).
  forecast     -- a config resolved, checked and estimated for its target GPU cluster (tools/plan.py).
  planner      -- predicted memory per card and tokens/card/s, from arithmetic (docs/planner.md).
  registry     -- published architectures as data: families, sizes, aliases, paddlenlp classes.
  families     -- the registry's data, one module per paddlenlp model type (``pretrain.families``).
  models       -- model code paddlenlp lacks, on its classes: Qwen3, Qwen3-MoE, ERNIE-4.5 dense and MoE.
  mtp          -- DeepSeek-V3's multi-token prediction as paddlenlp builds it: sample length, eh_proj fixes.
  model_config -- the model config: registry entry or config.json, overrides, runtime flags, vocabulary.
  tokenizer_folder -- what a tokenizer folder holds, read without paddlenlp.
  tokenizers   -- loading a tokenizer folder for training.
  tokenizer_json -- a tokenizer.json folder of a class paddlenlp lacks, through the Rust tokenizers library.
  param_count  -- parameter counts from a model config, without building the model.
  precision    -- the run's AMP dtype and level, derived once: model dtype, printed label, planner bytes.
  lr_schedule  -- warm-up then linear or cosine decay, or constant: the schedule table and its step arithmetic.
  checkpoint   -- verified checkpoints: completion marker with checksums, agreed resume point, rotation, sizes.
  resume_layout -- resuming on another layout: the layout a checkpoint's files show, refusals, merged optimizer shards.
  nan_guard    -- a non-finite loss or gradient stops the run or skips the step; non-finite weights are not saved.
  recovery     -- loss_spike_policy: spike detection, healthy checkpoints, skip and rollback decisions.
  finished     -- a finished run is left as it is (rerun or restarted after its last writes).
  preemption   -- SIGTERM/SIGUSR1/max_wall_time: all ranks checkpoint at the next step and exit 75; SIGINT: one line.
  fused_ops    -- is the fused_ln custom op installed, loadable and callable on the run's device.
  preprocess   -- corpus building (jsonl, Parquet, Arrow), tokenizer training and .bin/.idx writing (tools/preprocess/).
  hf_export    -- a saved model as a Hugging Face transformers folder (tools/export_hf.py).
  hf_import    -- continue_training from a Hugging Face transformers folder, converted as it loads.
  use          -- a saved model loaded outside a run computing what training computed (load_model: tools, your code).
  compat       -- fixes for upstream code on the pinned paddle, one module each (paddlenlp's MoE code: compat.moe;
                  its GPT tensor-parallel mapping: compat.gpt; DeepSeek's attention under tensor parallelism:
                  compat.deepseek_attention); every patch of paddle/paddlenlp is a row of upstream's ledger.
"""
