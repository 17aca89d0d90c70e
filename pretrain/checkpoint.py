"""Atomic, verified checkpoints: a ``checkpoint-<step>`` folder counts only once its completion marker
exists and its files still match it.

paddlenlp's Trainer writes ``output_dir/checkpoint-<step>/`` in place, file by file and from several
ranks (model shards, optimizer shards, scheduler, RNG states, trainer state). A process killed
mid-save leaves a folder that looks like a checkpoint but is not one, and paddlenlp's
``get_last_checkpoint`` would pick it (it only checks a marker under ``FLAG_LLM_PDC``). Here:

- every rank finishes its writes, a barrier, then one process per output_dir (each node's local
  rank 0, or global rank 0 alone when the nodes share the folder) flushes every file of
  the folder to disk and writes ``checkpoint_complete.json`` (atomically, see ``pretrain.atomic``)
  listing each file with its size in bytes and its CRC-32C (``mark_complete``); a second barrier,
  and only then are old checkpoints deleted (``rotate``), so no node deletes a checkpoint that
  another node has not replaced yet;
- on restart the ranks agree on the newest checkpoint that is complete on every node; each node's
  local rank 0 checks its sizes and checksums, and a folder that is incomplete, altered or
  unreadable anywhere is skipped with a one-line warning for the next older one
  (``resolve_resume_checkpoint``);
- a folder is deleted marker first (``remove_checkpoint``), so a deletion cut short never leaves
  a folder that counts as complete;
- ``overwrite_output_dir`` moves the previous run (checkpoints and final model) aside before the new
  run writes any checkpoint (``retire_previous_run``, a planned move that the next run finishes if a
  kill interrupts it), so neither rotation nor a restart can mistake it for the new run;
- a run that takes ``output_dir`` first deletes the ``*.partial.<pid>`` files of killed processes
  (``tidy_output_dir``).

Cost: CRC-32C is computed in hardware (the ``crc32c`` package), 6-15 GB/s on one core from the
page cache (docs/reliability.md); marking reads the files back from the page cache right after
they are written, resuming reads them from disk once more before paddlenlp loads them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from typing import Optional

import paddle.distributed as dist
from paddlenlp.trainer.trainer import TRAINER_STATE_NAME

from pretrain.atomic import file_crc32c, fsync_path, is_stale_partial, write_json
from pretrain.enums import plain
from pretrain.errors import UserError
from pretrain.log import logger
from pretrain.precision import Precision

MARKER = "checkpoint_complete.json"
# Bytes per parameter a checkpoint holds besides the weights: AdamW's two fp32 moments, and the
# fp32 master copy of the weights under AMP O2 (low-precision weights).
ADAM_MOMENT_BYTES = 2 * 4
FP32_MASTER_BYTES = 4
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")  # paddlenlp's PREFIX_CHECKPOINT_DIR + "-<global_step>"


def checkpoint_bytes(num_parameters: int, training_args) -> int:
    """Estimated bytes of one checkpoint: parameters x (weight bytes + 2 fp32 Adam moments + fp32 master under O2)."""
    weight_bytes = DTYPE_BYTES[Precision.from_arguments(training_args).param_dtype]
    master = FP32_MASTER_BYTES if weight_bytes < DTYPE_BYTES["float32"] else 0
    return num_parameters * (weight_bytes + ADAM_MOMENT_BYTES + master)


def checkpoints_on_disk(training_args) -> int:
    """The most checkpoints ``output_dir`` holds at once during the run (at least 1, for the final model).

    With ``save_total_limit`` L that is L + 1: the newest is complete before the oldest is
    deleted. Without a limit every checkpoint of the run (max_steps // save_steps) is kept; with
    ``save_strategy`` other than steps, one.
    """
    by_steps = str(plain(training_args.save_strategy)) == "steps"
    saved = training_args.max_steps // training_args.save_steps if by_steps and training_args.save_steps > 0 else 0
    limit = training_args.save_total_limit
    if limit is not None and limit > 0:
        saved = min(saved, limit + 1)
    return max(saved, 1)


def reused_checkpoint_bytes(training_args) -> int:
    """Bytes of the ``checkpoint-<step>`` folders in ``output_dir`` that this run replaces or rotates away
    (all of them when resuming; none with ``overwrite_output_dir``, which moves them aside)."""
    if training_args.overwrite_output_dir:
        return 0
    return sum(
        os.path.getsize(os.path.join(root, name))
        for _, path in list_checkpoints(training_args.output_dir)
        for root, _, names in os.walk(path)
        for name in names
    )


def step_of(folder: str) -> int:
    """The global step of a ``checkpoint-<step>`` folder (-1 for another name)."""
    match = CHECKPOINT_NAME.match(os.path.basename(os.path.normpath(folder)))
    return int(match.group(1)) if match else -1


def saved_max_steps(folder: str) -> Optional[int]:
    """``max_steps`` of the run that wrote checkpoint ``folder`` (paddlenlp's ``trainer_state.json``);
    None when the file is missing or unreadable (the resume checks report that)."""
    try:
        with open(os.path.join(folder, TRAINER_STATE_NAME), encoding="utf-8") as f:
            max_steps = json.load(f).get("max_steps")
    except (OSError, ValueError, AttributeError):
        return None
    return max_steps if isinstance(max_steps, int) else None


def list_checkpoints(output_dir: str) -> list:
    """``[(global_step, path)]`` of the ``checkpoint-<step>`` folders in ``output_dir``, oldest step first."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        match = CHECKPOINT_NAME.match(name)
        path = os.path.join(output_dir, name)
        if match and os.path.isdir(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def _checkpoint_files(folder: str) -> list:
    """Relative paths of every file under ``folder`` except the marker and files still being written."""
    files = []
    for root, _, names in os.walk(folder):
        for name in names:
            relative = os.path.relpath(os.path.join(root, name), folder)
            if relative != MARKER and ".partial." not in name:
                files.append(relative)
    return sorted(files)


def mark_complete(folder: str, global_step: int) -> None:
    """Flush every file of ``folder`` to disk, then write ``folder/checkpoint_complete.json``: the step and
    each file's size (bytes) and CRC-32C. Call it last, once every rank has written its files.

    Raises:
        OSError: a file cannot be read or flushed, or the marker cannot be written.
    """
    files = {}
    for relative in _checkpoint_files(folder):
        path = os.path.join(folder, relative)
        fsync_path(path)
        files[relative] = {"bytes": os.path.getsize(path), "crc32c": file_crc32c(path)}
    for root, _, _ in os.walk(folder):
        fsync_path(root)
    write_json(os.path.join(folder, MARKER), {"global_step": global_step, "files": files}, indent=1)


def checkpoint_problem(folder: str, verify_checksums: bool = True) -> Optional[str]:
    """None when ``folder`` is a complete checkpoint, else why not (one phrase).

    Complete means: the marker exists and parses, every file it lists exists with the listed size
    and, with ``verify_checksums``, is readable and has the listed CRC-32C (every byte is read).
    Markers written before checksums were recorded list sizes only; their sizes are checked.
    """
    marker = os.path.join(folder, MARKER)
    if not os.path.isdir(folder):
        return "it does not exist"
    if not os.path.isfile(marker):
        return f"it has no {MARKER} (the run stopped while writing it)"
    try:
        with open(marker, encoding="utf-8") as f:
            listed = json.load(f)["files"]
        expected = {
            relative: (entry, None) if isinstance(entry, int) else (int(entry["bytes"]), str(entry["crc32c"]))
            for relative, entry in listed.items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"its {MARKER} is unreadable ({e})"
    for relative, (size, _) in expected.items():
        try:
            actual_size = os.path.getsize(os.path.join(folder, relative))
        except OSError:  # absent, or deleted meanwhile by another writer's rotation
            return f"{relative} is missing"
        if actual_size != size:
            return f"{relative} is {actual_size} bytes, the marker says {size}"
    if not verify_checksums:
        return None
    for relative, (_, checksum) in expected.items():
        try:
            actual = file_crc32c(os.path.join(folder, relative))
        except OSError as e:
            return f"{relative} is unreadable ({e.strerror})"
        if checksum is not None and actual != checksum:
            return f"{relative} has CRC-32C {actual}, the marker says {checksum} (it changed after it was written)"
    return None


def latest_complete_checkpoint(output_dir: str) -> Optional[str]:
    """The newest checkpoint of ``output_dir`` whose marker and sizes are intact (checksums not read), or None."""
    for _, path in reversed(list_checkpoints(output_dir)):
        if checkpoint_problem(path, verify_checksums=False) is None:
            return path
    return None


def _gather(value) -> list:
    """``value`` of every rank, by global rank (``[value]`` in a single process)."""
    if dist.ParallelEnv().world_size == 1:  # the launcher's world, also when a forecast simulates a larger one
        return [value]
    values = []
    dist.all_gather_object(values, value)
    return values


def _problems_everywhere(path: str, local_zero: bool) -> list:
    """``["<problem> (rank r)", ...]``: ``checkpoint_problem(path)`` as each node's local rank 0 sees it."""
    problem = checkpoint_problem(path) if local_zero else None
    found = [(rank, p) for rank, p in enumerate(_gather(problem)) if p is not None]
    if dist.ParallelEnv().world_size == 1:
        return [p for _, p in found]
    return [f"{p} (rank {rank})" for rank, p in found]


def resolve_resume_checkpoint(training_args) -> Optional[str]:
    """The checkpoint this run resumes from, the same on every rank, or None for a fresh start.

    - ``resume_from_checkpoint`` given: that folder, which must be complete on every node;
    - else ``overwrite_output_dir``: None (start from scratch);
    - else the newest checkpoint of ``output_dir`` that is complete on every node: its marker,
      sizes and checksums are checked by each node's local rank 0 (a collective call under a
      launcher: every rank must call it). Newer folders that are incomplete, altered, unreadable
      or missing on some node are skipped with a warning naming why.

    Raises:
        UserError: ``resume_from_checkpoint`` names a folder that is not a complete checkpoint.
    """
    local_zero = training_args.local_process_index == 0
    explicit = training_args.resume_from_checkpoint
    if explicit:
        problems = _problems_everywhere(explicit, local_zero)
        if problems:
            raise UserError(
                f"resume_from_checkpoint: {explicit} is not a complete checkpoint: {'; '.join(problems)}; "
                f"point it at a checkpoint-<step> folder holding {MARKER} or leave it unset to use the latest"
            )
        return explicit
    if training_args.overwrite_output_dir:
        return None
    output_dir = training_args.output_dir
    steps_per_rank = [set(steps) for steps in _gather([step for step, _ in list_checkpoints(output_dir)])]
    everywhere = set.intersection(*steps_per_rank)
    for step in sorted(set.union(*steps_per_rank), reverse=True):
        path = os.path.join(output_dir, f"checkpoint-{step}")
        if step in everywhere:
            problems = _problems_everywhere(path, local_zero)
        else:
            problems = [f"it is missing on ranks {[r for r, steps in enumerate(steps_per_rank) if step not in steps]}"]
        if not problems:
            return path
        logger.warning("skipping checkpoint %s: %s; falling back to the previous one", path, "; ".join(problems))
    return None


def move_aside(output_dir: str, after_step: int, name: str) -> Optional[str]:
    """Move the ``checkpoint-<step>`` folders of ``output_dir`` with a step above ``after_step`` into
    ``output_dir/<name>/`` (kept, no longer resumed from); return that folder, or None when none was moved."""
    later = [path for step, path in list_checkpoints(output_dir) if step > after_step]
    if not later:
        return None
    target = os.path.join(output_dir, name)
    os.makedirs(target, exist_ok=True)
    for path in later:
        os.rename(path, os.path.join(target, os.path.basename(path)))
    fsync_path(output_dir)
    logger.warning("moved %s to %s: they are not resumed from", ", ".join(map(os.path.basename, later)), target)
    return target


def remove_checkpoint(folder: str) -> None:
    """Delete a checkpoint folder, its marker first: a deletion cut short leaves a folder that never counts.
    Idempotent: a folder (or marker) already gone, or going, counts as deleted."""
    try:
        os.remove(os.path.join(folder, MARKER))
    except FileNotFoundError:  # never marked, or another writer on a shared output_dir deleted it first
        pass
    shutil.rmtree(folder, ignore_errors=True)


def discard_before_save(folder: str) -> None:
    """Delete ``folder`` if it exists: an earlier attempt at the step about to be saved (interrupted, or
    newer than the checkpoint this run resumed from), which must not mix with the new files."""
    if os.path.isdir(folder):
        logger.warning("removing %s, left by an earlier attempt at this step, before saving it again", folder)
        remove_checkpoint(folder)


def rotate(output_dir: str, save_total_limit: Optional[int], saved_step: int, keep: tuple = ()) -> None:
    """After checkpoint ``saved_step`` is marked: keep the newest ``save_total_limit`` complete checkpoints
    up to it (plus the folders in ``keep``: the best model, the last healthy checkpoint while later ones
    are not known to be healthy) and delete the other folders up to it.

    Folders of later steps are left alone: an earlier attempt's, which this run skipped when it
    resumed (altered, or missing on a node) and will replace when it gets there; counting them
    could delete the only good checkpoint. Nothing is deleted when ``save_total_limit`` is None or
    <= 0. Completeness is judged by markers and sizes (checksums are checked when resuming).
    """
    if not save_total_limit or save_total_limit <= 0:
        return
    checkpoints = [(step, path) for step, path in list_checkpoints(output_dir) if step <= saved_step]
    complete = [path for _, path in checkpoints if checkpoint_problem(path, verify_checksums=False) is None]
    kept = set(complete[-save_total_limit:]) | {os.path.normpath(path) for path in keep if path}
    for _, path in checkpoints:
        if path not in kept and os.path.normpath(path) not in kept:
            logger.info("deleting checkpoint %s (save_total_limit %d)", path, save_total_limit)
            remove_checkpoint(path)


# What a new run keeps when it moves an earlier run aside: its own lock files, settings and data-build
# logs (written before training starts), folders of earlier overwrites, and the plan of the move.
RETIRE_PLAN = "overwrite_in_progress.json"
KEPT_ON_OVERWRITE = re.compile(r"^(\.run\.lock\.node\d+|run_config\.json|data_build\.rank\d+\.log|overwritten-.*)$")


def retire_previous_run(output_dir: str) -> Optional[str]:
    """Move an earlier run out of the way of a new one (``overwrite_output_dir``): its checkpoints, final
    model (weights, config, tokenizer, adapter, ``merged/``), loss history, summary, sample ids and board
    into ``output_dir/overwritten-<UTC time>/``, said in one warning. Everything at the top of ``output_dir``
    moves except ``KEPT_ON_OVERWRITE`` (this run's lock, settings and data-build logs).

    The move is planned first: the names and the target are written to ``output_dir/overwrite_in_progress.json``
    (atomically), then renamed one by one, then the plan is deleted. A kill in between leaves the plan,
    and the next run on ``output_dir`` finishes the move before it looks for a checkpoint
    (``finish_retiring``), so it never resumes the older run.

    Returns:
        The folder they were moved to, or None when there was nothing to move.
    """
    names = sorted(name for name in os.listdir(output_dir) if not KEPT_ON_OVERWRITE.match(name) and name != RETIRE_PLAN)
    if not names:
        return None
    target = os.path.join(output_dir, time.strftime("overwritten-%Y%m%d-%H%M%S", time.gmtime()))
    write_json(os.path.join(output_dir, RETIRE_PLAN), {"target": os.path.basename(target), "names": names})
    return finish_retiring(output_dir)


def finish_retiring(output_dir: str) -> Optional[str]:
    """Carry out the move ``retire_previous_run`` planned in ``output_dir`` (the rest of it, after a kill);
    return the folder moved to, or None when no move was planned."""
    plan_path = os.path.join(output_dir, RETIRE_PLAN)
    try:
        with open(plan_path, encoding="utf-8") as f:
            plan = json.load(f)
        target, names = os.path.join(output_dir, plan["target"]), list(plan["names"])
    except FileNotFoundError:  # nothing planned, or another node sharing output_dir finished it first
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(
            f"{plan_path} is unreadable ({e}): a move of an earlier run aside was interrupted; move or delete "
            "that run's files yourself, delete the file, and run again"
        ) from None
    os.makedirs(target, exist_ok=True)
    moved = []
    for name in names:
        try:
            os.rename(os.path.join(output_dir, name), os.path.join(target, name))
        except FileNotFoundError:  # moved before a kill, or by another node sharing output_dir
            continue
        moved.append(name)
    fsync_path(output_dir)
    try:
        os.remove(plan_path)
    except FileNotFoundError:
        pass
    fsync_path(output_dir)
    logger.warning(
        "overwrite_output_dir: moved the earlier run's %s to %s; delete that folder to free its space",
        ", ".join(moved) or "files",
        target,
    )
    return target


def remove_stale_partial_files(output_dir: str) -> list:
    """Delete the files ``pretrain.atomic`` was writing (``<name>.partial.<host>.<pid>``) for a process of this
    machine that no longer runs (killed with -9); return their paths. Files of live processes, and of other
    hosts sharing the folder, are left alone (``atomic.is_stale_partial``)."""
    removed = []
    for root, _, names in os.walk(output_dir):
        for name in names:
            if is_stale_partial(name):
                path = os.path.join(root, name)
                try:
                    os.remove(path)
                except FileNotFoundError:
                    continue
                removed.append(path)
    if removed:
        logger.info("removed %d file(s) left half-written by a killed run, e.g. %s", len(removed), removed[0])
    return removed


def tidy_output_dir(output_dir: str) -> None:
    """What a run does first, once it holds ``output_dir`` (``pretrain.run_lock``), before it looks for a
    checkpoint: finish an interrupted overwrite (``finish_retiring``) and delete the half-written files of
    killed processes (``remove_stale_partial_files``)."""
    if os.path.isdir(output_dir):
        finish_retiring(output_dir)
        remove_stale_partial_files(output_dir)
