"""How the ranks of a launch fail together, never hang and leave nothing behind (docs/distributed.md,
"When something fails").

  agreement     -- verdicts agreed by every rank through the launcher's store, in bounded time (lock, preflight).
  watchdog      -- each rank's step and phase, heartbeats, the hang_timeout report, the sidecar, the slow rank.
  process_end   -- a rank's children (DataLoader workers) shut and reaped before it exits.
  shared_folder -- is a folder shared by every rank: a probe file written by rank 0, looked for by all.
  launched      -- run_launched: an entry script's ranks end together, with its status, no child left.
  ranks         -- this process's rank, world size and node under the launcher; how messages name a rank.
"""
