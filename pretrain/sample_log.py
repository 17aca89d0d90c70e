"""Which samples each optimizer step trained on: a rolling hash per step, and optionally every id.

A sample id is the sample's index in the run's training dataset (the order of paddlenlp's
``GPTDataset`` / ``BlendableDataset``, fixed by the data, ``split``, ``max_seq_length`` and ``seed``;
``pretrain.data.CheckedDataset`` adds it to each sample and ``collate_causal_lm`` to each batch as
``sample_ids``). The trainer takes the ids off each micro batch before the model sees it
(``SampleLog.add``); at the end of each optimizer step the ids of every rank are gathered and the
step's hash is chained onto the previous one:

    ids_k  = sorted ids of step k over all ranks and micro batches (a step is the set of samples it
             averages over, whichever rank or micro batch read them)
    hash_k = first 16 hex digits of sha256(hash_{k-1} + ":" + ",".join(ids_k)), hash_0 = ""

``[step, hash_k]`` is kept in ``loss_history.json`` under ``samples`` (and in each checkpoint's copy,
so a resumed run continues the chain of the run it resumes). Equal hashes at step k mean the two runs
trained on the same samples at every step up to k: 1 process with batch 8 and 2 with batch 4, an
uninterrupted run and a killed-and-resumed one. With ``log_sample_ids`` the ids themselves go to
``<output_dir>/sample_ids.jsonl``, one ``{"step": k, "ids": [...]}`` line per step.

Cost: one all-gather of ``micro batch x gradient accumulation`` int64 per step on multi-rank runs.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Optional

import numpy as np
import paddle
import paddle.distributed as dist
from paddlenlp.trainer import TrainerCallback

from pretrain.atomic import atomic_outputs
from pretrain.checkpoint import step_of

SAMPLE_IDS_FILE = "sample_ids.jsonl"


def chain_hash(previous: str, ids) -> str:
    """16 hex digits: sha256 of ``previous:ids`` with ``ids`` sorted and comma-joined."""
    text = previous + ":" + ",".join(str(int(i)) for i in sorted(ids))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class SampleLog(TrainerCallback):
    """Collects each optimizer step's sample ids and chains their hash into ``history.samples``.

    Args:
        history: the run's ``pretrain.metrics.loss_history.LossHistory`` (its ``samples`` list is appended to).
        ids_file: where to append every step's ids (None: hashes only).
    """

    def __init__(self, history, ids_file: Optional[str] = None, should_save: bool = True):
        self.history = history
        self.ids_file = ids_file
        self.should_save = should_save  # this process writes the ids file (paddlenlp's args.should_save)
        self._step_ids = []  # this rank's ids of the step in progress, one int64 array per micro batch

    def add(self, sample_ids) -> None:
        """Record a micro batch's ``sample_ids`` (int64 ``[batch]`` tensor or array; None: not known)."""
        if sample_ids is not None:
            values = sample_ids.numpy() if isinstance(sample_ids, paddle.Tensor) else np.asarray(sample_ids)
            self._step_ids.append(values.astype(np.int64).reshape([-1]))

    def current_step_ids(self) -> np.ndarray:
        """int64 ``[samples]``: this rank's sample ids of the optimizer step in progress, in reading order."""
        return np.concatenate(self._step_ids) if self._step_ids else np.zeros(0, dtype=np.int64)

    def restore(self, checkpoint_folder: Optional[str]) -> None:
        """Start a run: from scratch (None) the ids file is removed; resumed from ``checkpoint_folder``
        (``checkpoint-<step>``), the ids file keeps only the steps up to it (the hashes come back with the loss
        history)."""
        self._step_ids = []
        if not (self.should_save and self.ids_file and os.path.isfile(self.ids_file)):
            return
        if checkpoint_folder is None:
            os.remove(self.ids_file)
            return
        checkpoint_step = step_of(checkpoint_folder)
        with open(self.ids_file, encoding="utf-8") as f:
            kept = [line for line in f if line.strip() and json.loads(line)["step"] <= checkpoint_step]
        with atomic_outputs(self.ids_file) as (tmp_path,):
            with open(tmp_path, "w", encoding="utf-8") as f:
                f.writelines(kept)

    def write(self, folder: str) -> None:
        """Nothing of its own in a checkpoint: the step hashes are in the loss history, and the ids file is
        appended at each step and cut back to the checkpoint's step by ``restore``."""

    def _gathered(self, args) -> np.ndarray:
        """The step's ids of every rank (tensor and pipeline ranks read the same ones: each id once)."""
        mine = self.current_step_ids()
        if args.world_size <= 1:
            return mine
        every = []
        dist.all_gather(every, paddle.to_tensor(mine))
        return np.unique(np.concatenate([ids.numpy() for ids in every]))

    def on_step_end(self, args, state, control, **kwargs):
        if not self._step_ids:  # batches without ids (fine-tuning pairs): nothing to log, on every rank
            return
        ids = self._gathered(args)
        self._step_ids = []
        previous = self.history.samples[-1][1] if self.history.samples else ""
        self.history.samples.append((state.global_step, chain_hash(previous, ids)))
        if self.ids_file and args.should_save:
            with open(self.ids_file, "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": state.global_step, "ids": sorted(int(i) for i in ids)}) + "\n")
