"""Atomic checkpoints: a ``checkpoint-<step>`` folder counts only once its completion marker exists.

paddlenlp's Trainer writes ``output_dir/checkpoint-<step>/`` in place, file by file and from several
ranks (model shards, optimizer shards, scheduler, RNG states, trainer state). A process killed
mid-save leaves a folder that looks like a checkpoint but is not one, and paddlenlp's
``get_last_checkpoint`` would pick it (it only checks a marker under ``FLAG_LLM_PDC``). Here:

- every rank finishes its writes, a barrier, then each node's local rank 0 writes
  ``checkpoint_complete.json`` (written aside and renamed, see ``pretrain.atomic``) listing every
  file of the folder with its size in bytes (``mark_complete``);
- on restart the newest folder whose marker exists and whose files still match it is used; newer
  folders that are incomplete or corrupt are skipped with a warning naming why
  (``latest_complete_checkpoint``);
- old checkpoints are deleted only after the new one is marked complete (``rotate``), so
  ``save_total_limit`` never leaves a run without a complete checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Optional

from pretrain.atomic import atomic_outputs
from pretrain.errors import UserError
from pretrain.log import logger
from pretrain.model import model_dtype

MARKER = "checkpoint_complete.json"
# Bytes per parameter a checkpoint holds besides the weights: AdamW's two fp32 moments, and the
# fp32 master copy of the weights under AMP O2 (low-precision weights).
ADAM_MOMENT_BYTES = 2 * 4
FP32_MASTER_BYTES = 4
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")  # paddlenlp's PREFIX_CHECKPOINT_DIR + "-<global_step>"


def checkpoint_bytes(num_parameters: int, training_args) -> int:
    """Estimated bytes of one checkpoint: parameters x (weight bytes + 2 fp32 Adam moments + fp32 master under O2)."""
    weight_bytes = DTYPE_BYTES[model_dtype(training_args)]
    master = FP32_MASTER_BYTES if weight_bytes < DTYPE_BYTES["float32"] else 0
    return num_parameters * (weight_bytes + ADAM_MOMENT_BYTES + master)


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


def _file_sizes(folder: str) -> dict:
    """``{relative path: size in bytes}`` of every file under ``folder`` except the marker."""
    sizes = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, folder)
            if relative != MARKER and ".partial." not in name:
                sizes[relative] = os.path.getsize(path)
    return sizes


def mark_complete(folder: str, global_step: int) -> None:
    """Write ``folder/checkpoint_complete.json``: the step and every file's size (bytes). Call it last."""
    marker = os.path.join(folder, MARKER)
    with atomic_outputs(marker) as (tmp,):
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"global_step": global_step, "files": _file_sizes(folder)}, f, indent=1)


def checkpoint_problem(folder: str) -> Optional[str]:
    """None when ``folder`` is a complete checkpoint, else why not (one phrase).

    Complete means: the marker exists, parses, and every file it lists exists with the listed size.
    """
    marker = os.path.join(folder, MARKER)
    if not os.path.isfile(marker):
        return f"it has no {MARKER} (the run stopped while writing it)"
    try:
        with open(marker, encoding="utf-8") as f:
            listed = json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its {MARKER} is unreadable ({e})"
    for relative, size in listed.items():
        path = os.path.join(folder, relative)
        if not os.path.isfile(path):
            return f"{relative} is missing"
        if os.path.getsize(path) != size:
            return f"{relative} is {os.path.getsize(path)} bytes, the marker says {size}"
    return None


def latest_complete_checkpoint(output_dir: str) -> Optional[str]:
    """The newest complete checkpoint in ``output_dir`` (by step), or None; warns about newer bad ones."""
    for _, path in reversed(list_checkpoints(output_dir)):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        logger.warning("skipping checkpoint %s: %s; falling back to the previous one", path, problem)
    return None


def resolve_resume_checkpoint(training_args) -> Optional[str]:
    """The checkpoint this run resumes from, or None for a fresh start.

    - ``resume_from_checkpoint`` given: that folder, which must be complete;
    - else ``overwrite_output_dir``: None (start from scratch);
    - else the latest complete checkpoint in ``output_dir`` (None if there is none).

    Raises:
        UserError: ``resume_from_checkpoint`` names a folder that is not a complete checkpoint.
    """
    explicit = training_args.resume_from_checkpoint
    if explicit:
        problem = checkpoint_problem(explicit) if os.path.isdir(explicit) else "it does not exist"
        if problem is not None:
            raise UserError(
                f"resume_from_checkpoint: {explicit} is not a complete checkpoint: {problem}; "
                "point it at a checkpoint-<step> folder holding " + MARKER + " or leave it unset to use the latest"
            )
        return explicit
    if training_args.overwrite_output_dir:
        return None
    return latest_complete_checkpoint(training_args.output_dir)


def discard_incomplete(folder: str) -> None:
    """Delete ``folder`` if it exists without a valid marker: leftovers of a save that was interrupted."""
    if os.path.isdir(folder) and checkpoint_problem(folder) is not None:
        logger.warning("removing incomplete checkpoint %s before saving the same step again", folder)
        shutil.rmtree(folder, ignore_errors=True)


def rotate(output_dir: str, save_total_limit: Optional[int], keep: Optional[str] = None) -> None:
    """Keep the newest ``save_total_limit`` complete checkpoints (plus ``keep``, e.g. the best model).

    Incomplete folders older than the newest complete checkpoint are deleted too: no run can resume
    from them. Nothing is deleted when ``save_total_limit`` is None or <= 0.
    """
    if not save_total_limit or save_total_limit <= 0:
        return
    checkpoints = list_checkpoints(output_dir)
    complete = [(step, path) for step, path in checkpoints if checkpoint_problem(path) is None]
    if not complete:
        return
    newest_step = complete[-1][0]
    kept = {path for _, path in complete[-save_total_limit:]} | {keep}
    for step, path in checkpoints:
        if path not in kept and step <= newest_step:
            logger.info("deleting checkpoint %s (save_total_limit %d)", path, save_total_limit)
            shutil.rmtree(path, ignore_errors=True)
