"""What a run measures and reports: speed, MFU, memory, losses, and where they are shown.

  flops        -- model FLOPs per token and MFU (PaLM definition).
  hardware     -- peak FLOP/s per card (datasheets, or the CPU's physical peak from /proc/cpuinfo); the
                  measured matmul rate reported beside it as achievable.
  step_timer   -- step timing: tokens/card/s and MFU, excluding warm-up, eval and checkpoint time.
  peak_memory  -- peak memory of this process's card.
  time_breakdown -- where the time goes: per-step phases on paddlenlp's timers, goodput over restarts.
  rank_figures -- every rank's peak memory and step time, gathered: the max over ranks and which rank.
  comm_volume  -- CPU processes: payload bytes of every collective and pipeline transfer per step, by group,
                  and the seconds inside them (the time breakdown's communication).
  progress     -- the progress bar and one line per log record, with the ETA.
  board        -- the VisualDL board (scalars, hyper-parameters, settings).
  loss_history -- the Trainer callback that keeps per-step losses in loss_history.json (and in each checkpoint).
  loss_curves  -- reading loss curves, the loss-alignment rule, plots (no paddle import).
  summary      -- the end-of-run figures written to run_summary.json, and their few printed lines.

The predicted figures (memory per card and tokens/card/s before a run) are ``pretrain.planner``'s.
"""
