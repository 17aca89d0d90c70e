"""A run's data: its sources, what each holds, the causal-LM datasets, and the collator.

- ``resolve_data_sources``: ``input_dir`` as ``DataSource(weight, prefix)`` pairs (flattened for
  paddlenlp only by ``paddlenlp_data_prefix``);
- ``build_datasets``: samples from ``paddlenlp.data.causal_dataset.build_train_valid_test_datasets``,
  each ``max_seq_length + 1`` consecutive tokens of the shuffled, concatenated documents (several
  sources: blended per split, a source whose split is empty left out of that split's blend), D more for a
  model with D multi-token-prediction depths (``pretrain.mtp.sample_tokens``);
- ``data_mix``: the realized share of training tokens per source of a blend;
- ``index_cache_folder``: where paddlenlp keeps the sample index of this data (keyed on a
  fingerprint of the data itself, see below);
- ``CheckedDataset`` / ``ReadErrorCheck`` / ``raise_read_error``: a sample that cannot be read
  ends the run with an error instead of a silent hang;
- ``collate_causal_lm``: the shift into (input_ids, labels).

The index cache. paddlenlp names its cache files by a hash of the prefix, sample count, sequence
length, seed and split, not of the data: a corpus regenerated under the same name would reuse a
stale index (wrong samples, or an IndexError in the loader). Here the cache folder is
``<data_cache or <data folder>/index-cache>/<fingerprint>``, the fingerprint covering every
source's file sizes and index bytes, so changed data gets a new folder; it is the same on every
rank and node that sees the same files. Before paddlenlp looks, the rank that builds the cache
deletes what it cannot trust: index files a killed or disk-full run left half written (paddlenlp
would wait for them forever), index files whose CRC-32C is not the one recorded in their entry's
``.dsc`` after the build (changed in place), and unkeyed cache files in ``<data folder>/index-cache`` (paddlenlp
looks there first).
With ``share_folder`` (only global rank 0 builds, the others wait for its files), every rank first
checks that it sees a probe file rank 0 wrote in the cache folder (``check_shared_cache``, with
``pretrain.cluster.shared_folder``): a folder that is not shared would leave the other nodes waiting for ever.

Formats read (through paddlenlp's ``indexed_dataset``): ``<prefix>.bin`` + ``<prefix>.idx`` (mmap,
magic ``MMIDIDX``) and the older ``<prefix>_ids.npy`` + ``<prefix>_idx.npz`` pairs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import threading
from typing import NamedTuple, Optional

import numpy as np
import paddle
from paddle.io import Dataset, Subset
from paddlenlp.data.blendable_dataset import BlendableDataset
from paddlenlp.data.causal_dataset import (
    _build_train_valid_test_datasets,
    build_train_valid_test_datasets,
    get_datasets_weights_and_num_samples,
    get_train_valid_test_split_,
)
from paddlenlp.trainer import TrainerCallback

from pretrain.atomic import atomic_outputs, file_crc32c
from pretrain.cluster.ranks import describe_rank
from pretrain.cluster.shared_folder import folder_seen_by
from pretrain.corpus import FORMATS, index_counts, prefix_format
from pretrain.errors import UserError
from pretrain.log import logger
from pretrain.mtp import sample_tokens

SPLIT_NAMES = ("train", "validation", "test")
# paddlenlp's index cache files: <md5 of the description><suffix> (GPTDataset, BlendableDataset).
CACHE_FILE = re.compile(
    r"^([0-9a-f]{32})(\.dsc|_doc_idx\.npy|_sample_idx\.npy|_shuffle_idx\.npy|_index\.npy|_sample_index\.npy)$"
)
CHECKSUM_LINE = re.compile(r"^CRC-32C (\S+) ([0-9a-f]{8})$")  # appended to a cache entry's .dsc


def _prefixes_in_folder(folder: str) -> list:
    prefixes = []
    for name in sorted(os.listdir(folder)):
        for data_suffix, index_suffix in FORMATS:
            if name.endswith(index_suffix):
                prefix = os.path.join(folder, name[: -len(index_suffix)])
                if not os.path.isfile(prefix + data_suffix):
                    raise UserError(
                        f"input_dir: {prefix + index_suffix} has no matching {prefix + data_suffix}; "
                        "re-run tools/preprocess/create_pretraining_data.py for it or remove it"
                    )
                prefixes.append(prefix)
    return prefixes


class DataSource(NamedTuple):
    """One tokenized corpus of a run and its sampling weight (relative; paddlenlp normalises them)."""

    weight: float
    prefix: str  # path without the .bin/.idx (or _ids.npy/_idx.npz) suffix


def resolve_data_sources(input_dir: str) -> list:
    """The ``DataSource`` list ``input_dir`` names: a folder (every pair in it, equal weights), one
    prefix, or a weighted list ``"w1 prefix1 w2 prefix2 ..."``.

    Raises:
        UserError: a path does not exist, a folder holds no tokenized pair, a weight is not a
            positive number, or a prefix has no .bin/.idx (or _ids.npy/_idx.npz) pair.
    """
    path = input_dir.strip()
    if os.path.isdir(path) or prefix_format(path) is not None:  # one path, spaces and all
        return _single_source(path)
    tokens = input_dir.split()
    if len(tokens) > 1:
        if len(tokens) % 2:
            raise UserError(f'input_dir: "{input_dir}" must be "weight prefix" pairs, got an odd number of items')
        sources = []
        for weight_text, prefix in zip(tokens[::2], tokens[1::2]):
            try:
                weight = float(weight_text)
            except ValueError:
                raise UserError(f"input_dir: weight '{weight_text}' before {prefix} is not a number") from None
            if not (math.isfinite(weight) and weight > 0):
                raise UserError(f"input_dir: weight {weight_text} before {prefix} must be a positive number")
            if prefix_format(prefix) is None:
                raise UserError(f"input_dir: no {prefix}.bin/.idx (or _ids.npy/_idx.npz) pair exists")
            sources.append(DataSource(weight, prefix))
        return sources
    return _single_source(path)


def _single_source(path: str) -> list:
    """``[DataSource]`` of one folder (every pair in it) or one prefix."""
    if os.path.isdir(path):
        prefixes = _prefixes_in_folder(path)
        if not prefixes:
            raise UserError(
                f"input_dir: folder {path} holds no .bin/.idx or _ids.npy/_idx.npz pair; create one with "
                "tools/preprocess/create_pretraining_data.py (or `make data` for the demo corpus)"
            )
        return [DataSource(1.0, prefix) for prefix in prefixes]
    if prefix_format(path) is not None:
        return [DataSource(1.0, path)]
    raise UserError(
        f"input_dir: {path!r} is neither a folder nor a data prefix with .bin/.idx files; "
        "point it at the folder create_pretraining_data.py wrote to"
    )


def paddlenlp_data_prefix(sources: list) -> list:
    """``data_prefix`` as paddlenlp's dataset builder takes it: ``[prefix]`` for one source, else
    ``[w1, prefix1, w2, prefix2, ...]``."""
    if len(sources) == 1:
        return [sources[0].prefix]
    return [item for source in sources for item in source]


def num_samples_per_split(training_args, layout) -> list:
    """Samples the [train, valid, test] datasets must provide for this run.

    train = max_steps x global batch (micro batch x gradient accumulation x the layout's
    dataset_world_size); valid and test = eval_iters x that global batch (Megatron-LM's count), the same
    samples whatever the layout (the global batch is kept when the layout changes), read in batches of
    per_device_eval_batch_size split over the ranks. Evaluation reads the same samples each time, so
    curves are comparable across evaluations and layouts.
    """
    global_batch = layout.global_batch_samples(
        training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps
    )
    evaluation = training_args.eval_iters * global_batch
    return [training_args.max_steps * global_batch, evaluation, evaluation]


def data_fingerprint(sources: list) -> str:
    """16 hex digits that change whenever the data of ``sources`` does: per source (in order), the
    sizes of its two files and the CRC-32C of its index file (which holds every document's size);
    for a blend, also the normalised weights.

    Raises:
        OSError: a file cannot be read.
    """
    described = []
    for source in sources:
        data_suffix, index_suffix = prefix_format(source.prefix)
        data_path, index_path = source.prefix + data_suffix, source.prefix + index_suffix
        described.append([os.path.getsize(data_path), os.path.getsize(index_path), file_crc32c(index_path)])
    if len(sources) > 1:  # a blend's weights choose its samples: other weights, other index
        total = sum(source.weight for source in sources)
        described.append([source.weight / total for source in sources])
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]


def index_cache_root(data_args, sources: list) -> str:
    """The folder that holds the index caches: ``data_cache``, or ``index-cache`` next to the first source."""
    return data_args.data_cache or os.path.join(os.path.dirname(sources[0].prefix), "index-cache")


def index_cache_folder(data_args, sources: list) -> str:
    """Where paddlenlp keeps the sample index of ``sources``: ``<index_cache_root>/<data_fingerprint>``."""
    return os.path.join(index_cache_root(data_args, sources), data_fingerprint(sources))


def _cache_groups(folder: str) -> dict:
    """``{hash: [file names]}`` of paddlenlp's index cache files directly in ``folder``."""
    groups = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        match = CACHE_FILE.match(name)
        if match:
            groups.setdefault(match.group(1), []).append(name)
    return groups


def _recorded_checksums(descriptor: str) -> dict:
    """``{file name: CRC-32C}`` of the ``CHECKSUM_LINE`` lines of a cache entry's ``.dsc`` (empty: none yet)."""
    if not os.path.isfile(descriptor):
        return {}
    with open(descriptor, encoding="utf-8", errors="replace") as f:
        return {match[1]: match[2] for match in map(CHECKSUM_LINE.match, f.read().splitlines()) if match}


def _damage(folder: str, names: list) -> Optional[str]:
    """Why one cache entry cannot be trusted, or None: a .npy file that does not load (cut short by a kill
    or a full disk), or one whose CRC-32C differs from the one its ``.dsc`` records (changed in place,
    e.g. two shuffle entries swapped: every index still in range, the training silently different)."""
    npy = [name for name in names if name.endswith(".npy")]
    for name in npy:
        try:
            np.load(os.path.join(folder, name), mmap_mode="r")
        except (OSError, ValueError, EOFError) as e:  # EOFError: an empty file (killed before its first byte)
            return f"{name}: {e}"
    recorded = _recorded_checksums(os.path.join(folder, _descriptor_name(names)))
    for name in npy:
        if name in recorded and file_crc32c(os.path.join(folder, name)) != recorded[name]:
            return f"{name}: its CRC-32C is not the {recorded[name]} its .dsc records"
    return None


def _descriptor_name(names: list) -> str:
    match = CACHE_FILE.match(names[0])
    assert match is not None, names[0]  # _cache_groups lists CACHE_FILE names only
    return match.group(1) + ".dsc"


def record_index_checksums(cache: str) -> None:
    """Append the CRC-32C of each .npy file to its entry's ``.dsc`` (paddlenlp's description of the entry,
    which paddlenlp writes and never reads), for the entries of ``cache`` that have none yet; call on the
    rank that builds the cache, after paddlenlp has built it. The ``.dsc`` is replaced atomically."""
    for names in _cache_groups(cache).values():
        descriptor = os.path.join(cache, _descriptor_name(names))
        if not os.path.isfile(descriptor) or _recorded_checksums(descriptor):
            continue
        with open(descriptor, encoding="utf-8") as f:
            text = f.read()
        lines = [f"CRC-32C {name} {file_crc32c(os.path.join(cache, name))}" for name in names if name.endswith(".npy")]
        with atomic_outputs(descriptor) as (partial,), open(partial, "w", encoding="utf-8") as f:
            f.write(text + "\n".join(lines) + "\n")


def prepare_index_cache(cache: str, sources: list) -> None:
    """Delete what paddlenlp must not find before it looks for ``cache`` (call on the rank that builds it).

    - entries of ``cache`` whose .npy files do not load (paddlenlp would wait for them forever), or differ
      from the checksums their ``.dsc`` records (``record_index_checksums``), said on the console;
    - unkeyed cache files directly in ``<source folder>/index-cache`` (paddlenlp looks there first,
      whatever the data now holds).
    """
    for folder in sorted({os.path.join(os.path.dirname(source.prefix), "index-cache") for source in sources}):
        unkeyed = [name for names in _cache_groups(folder).values() for name in names]
        if unkeyed:
            logger.warning("removing %d index cache files from %s: they are not tied to the data", len(unkeyed), folder)
            for name in unkeyed:
                os.remove(os.path.join(folder, name))
    for digest, names in _cache_groups(cache).items():
        damage = _damage(cache, names)
        if damage:
            logger.warning("index cache %s in %s is damaged (%s): rebuilding it", digest, cache, damage)
            for name in names:
                os.remove(os.path.join(cache, name))


def _builds_cache(share_folder: bool) -> bool:
    """Whether this rank builds the index cache, as paddlenlp decides: local rank 0 of each node, or
    only global rank 0 when ``share_folder``."""
    if share_folder:
        return paddle.distributed.get_rank() == 0
    return int(os.environ.get("PADDLE_RANK_IN_NODE", "0") or 0) == 0


def check_shared_cache(cache: str, timeout_s: float) -> None:
    """With ``share_folder``, check that every rank sees the index cache folder global rank 0 writes to
    (``pretrain.cluster.shared_folder``); otherwise paddlenlp's ranks other than 0 would wait for rank 0's files
    for ever. A collective call (every rank).

    Raises:
        UserError: on every rank, naming the ranks that do not see rank 0's probe file.
    """
    blind = [describe_rank(rank, node, host) for rank, node, host, seen in folder_seen_by(cache, timeout_s) if not seen]
    if blind:
        raise UserError(
            f"{', '.join(blind)}: share_folder: true, but the index cache folder {cache} there is not the one global "
            "rank 0 writes to (rank 0's probe file is not there): it is not on storage all nodes share; set "
            "share_folder false (each node builds its own cache) or put data_cache on shared storage"
        )


def build_datasets(plan) -> tuple:
    """(train, valid, test) GPT-style datasets of a ``RunPlan``; valid/test are None when their split is empty.

    Each is a ``CheckedDataset`` of exactly the samples ``num_samples_per_split`` asks for. Run
    the preflight first (``pretrain.preflight.check_run``): it checks max_steps, that every
    prefix's file pair is sound and non-empty, and that the train (and, with do_eval, validation)
    split holds documents, so nothing here indexes data that cannot be trained on. The index cache
    is ``index_cache_folder`` (see the module docstring).

    Raises:
        UserError: the sample index cannot be written or read (a full or unwritable disk), or
            ``share_folder`` is set but the cache folder is not shared (``check_shared_cache``).
    """
    data_args, training_args = plan.data_args, plan.training_args
    num_samples = num_samples_per_split(training_args, plan.layout)
    cache = index_cache_folder(data_args, plan.data)
    if _builds_cache(data_args.share_folder):
        prepare_index_cache(cache, plan.data)
    if paddle.distributed.get_world_size() > 1 and data_args.share_folder:
        check_shared_cache(cache, training_args.hang_timeout)  # also the barrier below
    elif paddle.distributed.get_world_size() > 1:
        paddle.distributed.barrier()  # nobody looks for the cache before it is cleaned
    settings = {
        "data_impl": data_args.data_impl,
        "splits_string": data_args.split,
        "seq_length": sample_tokens(data_args.max_seq_length, plan.model_config) - 1,  # paddlenlp adds the 1
        "seed": training_args.seed,
        "skip_warmup": data_args.skip_warmup,
        "share_folder": data_args.share_folder,
        "data_cache_path": cache,
    }
    try:
        if len(plan.data) == 1:
            built = build_train_valid_test_datasets(
                data_prefix=[plan.data[0].prefix], train_val_test_num_samples=num_samples, **settings
            )
            members = [[plan.data[0].prefix]] * 3
        else:
            built, members = _build_blends(plan.data, num_samples, settings)
        if _builds_cache(data_args.share_folder):
            record_index_checksums(cache)
    except (OSError, ValueError) as e:  # paddlenlp prints a failed write and goes on to load the cut file
        raise UserError(
            f"data_cache: writing or reading the sample index in {cache} failed ({e}); free space there or point "
            "data_cache at another disk (the damaged files are rebuilt at the next start)"
        ) from e
    tokens = sample_tokens(data_args.max_seq_length, plan.model_config)
    return tuple(
        None if dataset is None else CheckedDataset(_first(dataset, samples), name, tokens, cache, sources)
        for name, dataset, samples, sources in zip(SPLIT_NAMES, built, num_samples, members)
    )


def _build_blends(sources: list, num_samples: list, settings: dict) -> tuple:
    """((train, valid, test) BlendableDatasets, [prefixes blended in each split]) of several sources.

    paddlenlp's ``build_train_valid_test_datasets`` drops a source whose split is empty but keeps its
    weight, and ``BlendableDataset`` then fails an assertion (3 sources of 300, 3,000 and 300 documents
    with split 949,50,1: the small ones have no test document). Here, as Megatron-LM's
    ``BlendedMegatronDatasetBuilder`` does, such a source is left out of that split's blend and the
    other weights renormalised (a warning names it). Each split's per-source sample counts are
    paddlenlp's rule over the sources it blends (``get_datasets_weights_and_num_samples``: share x
    1.005 + 20), and each source's datasets paddlenlp's (``_build_train_valid_test_datasets``).
    """
    splits = settings["splits_string"]
    prefixes = [source.prefix for source in sources]
    bounds = [get_train_valid_test_split_(splits, index_counts(prefix)[0]) for prefix in prefixes]
    counts = [[0, 0, 0] for _ in prefixes]  # [source][split] samples to build
    blends, members = [], []
    for split, name in enumerate(SPLIT_NAMES):
        kept = [i for i in range(len(sources)) if bounds[i][split + 1] > bounds[i][split]]
        left_out = [prefixes[i] for i in range(len(sources)) if i not in kept]
        if left_out and kept:
            logger.warning(
                "the %s split of %s holds no documents under split %s: left out of the %s blend, the other "
                "weights renormalised",
                name,
                ", ".join(left_out),
                splits,
                name,
            )
        weights = []
        if kept:
            weighted = [item for i in kept for item in sources[i]]  # [w1, prefix1, w2, prefix2, ...]
            _, weights, per_source = get_datasets_weights_and_num_samples(weighted, [num_samples[split]])
            for i, (count,) in zip(kept, per_source):
                counts[i][split] = count
        members.append((kept, weights))
    datasets = [
        _build_train_valid_test_datasets(prefix, train_val_test_num_samples=count, **settings)
        for prefix, count in zip(prefixes, counts)
    ]
    for split, (kept, weights) in enumerate(members):
        blend = [datasets[i][split] for i in kept]
        size, share, cache = num_samples[split], settings["share_folder"], settings["data_cache_path"]
        blends.append(BlendableDataset(blend, weights, size, share, data_cache_path=cache) if kept else None)
    return tuple(blends), [[prefixes[i] for i in kept] for kept, _ in members]


def data_mix(dataset, samples: int) -> Optional[dict]:
    """``{source prefix: share of the training tokens}`` in the first ``samples`` samples of a
    ``CheckedDataset`` (None for anything else: no dataset, fine-tuning pairs).

    Every sample is ``max_seq_length + 1`` tokens of one source (a GPTDataset sample never crosses
    sources), so the share of tokens is the share of samples; which source each sample comes from is
    the blend's ``dataset_index`` (paddlenlp's ``BlendableDataset``, built greedily so that every prefix
    of it tracks the weights: the realized share is fixed before training, and reading it here costs
    no step). A resumed run reports the whole run's mix.
    """
    if not isinstance(dataset, CheckedDataset) or not dataset.sources:  # none, or fine-tuning pairs
        return None
    if len(dataset.sources) == 1:
        return {dataset.sources[0]: 1.0}
    blend = dataset.dataset.dataset  # CheckedDataset -> Subset -> BlendableDataset
    samples = min(samples, len(dataset))
    counts = np.bincount(np.asarray(blend.dataset_index[:samples]), minlength=len(dataset.sources))
    return {prefix: float(count) / max(samples, 1) for prefix, count in zip(dataset.sources, counts)}


def _first(dataset, num_samples: int):
    """The first ``num_samples`` samples: GPTDataset holds whole epochs, a run reads only these (training
    exactly max_steps steps of them, so a run resumed at max_steps has nothing left to train)."""
    if dataset is None:
        return None
    return Subset(dataset, range(min(len(dataset), num_samples)))


class CheckedDataset(Dataset):
    """A causal dataset whose read failures end the run with an error instead of a silent hang.

    paddle's single-process DataLoader (``dataloader_num_workers`` 0) reads batches in a thread;
    an exception there (other than StopIteration) ends the thread without closing its queue, and
    the training loop waits forever (paddle 3.3). Here a failed or short read in such a thread is
    kept in ``error`` and raised as StopIteration, which closes the queue and ends the epoch;
    ``ReadErrorCheck`` (training) and ``raise_read_error`` then raise it in the main thread. In the
    main thread or a DataLoader worker process, where paddle passes exceptions on, it is raised as
    it is.

    Args:
        dataset: samples ``{"text": int64 [sample_tokens]}``.
        split: the split's name, for the message.
        sample_tokens: tokens every sample must hold (``pretrain.mtp.sample_tokens``: max_seq_length + 1).
        cache: the index cache folder the samples are read through, for the message.
        sources: the prefixes of the sources blended into ``dataset``, in blend order (``data_mix``).
    """

    def __init__(self, dataset, split: str, sample_tokens: int, cache: str, sources: Optional[list] = None):
        self.dataset = dataset
        self.split = split
        self.sample_tokens = sample_tokens
        self.cache = cache
        self.sources = sources or []
        self.error: Optional[str] = None  # what went wrong in the loader thread, once it has

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        """The sample's dict plus ``sample_id``: ``index`` (``pretrain.sample_log``)."""
        try:
            sample = self.dataset[index]
            if len(sample["text"]) != self.sample_tokens:
                raise ValueError(f"it holds {len(sample['text'])} tokens, not {self.sample_tokens}")
        except Exception as e:  # anything: in the loader thread it would be lost
            if threading.current_thread() is threading.main_thread():
                raise
            self.error = f"reading {self.split} sample {index} failed ({type(e).__name__}: {e})"
            raise StopIteration from e
        return {**sample, "sample_id": index}


class ReadErrorCheck(TrainerCallback):
    """Raises a training read failure (``raise_read_error``) as soon as the epoch it cut short ends,
    before paddlenlp goes on with an epoch that may hold no step at all."""

    def on_epoch_end(self, args, state, control, train_dataloader=None, **kwargs):
        raise_read_error(getattr(train_dataloader, "dataset", None))


def raise_read_error(dataset) -> None:
    """Raise what a ``CheckedDataset`` met in the loader thread, in one line; return if nothing.

    Raises:
        UserError: naming the sample, the error and how to rebuild the data or its index cache.
    """
    if isinstance(dataset, CheckedDataset) and dataset.error:
        raise UserError(
            f"input_dir: {dataset.error}; the data files or the index cache {dataset.cache} are inconsistent: "
            "check the data with tools/preprocess/inspect_data.py --verify, and delete that cache folder to rebuild it"
        )


def collate_causal_lm(samples: list) -> dict:
    """Stack samples and shift by one token for next-token prediction.

    Args:
        samples: dicts with ``"text"``: int64 array of ``seq_len + 1`` token ids, and maybe
            ``"sample_id"`` (``CheckedDataset``).

    Returns:
        ``{"input_ids": [batch, seq_len] int64, "labels": [batch, seq_len] int64}`` with
        ``labels[:, t] == input_ids[:, t + 1]`` (the model does not shift), plus ``"sample_ids"``
        int64 ``[batch]`` when the samples carry ids (the trainer takes them off before the model).
    """
    tokens = np.stack([sample["text"] for sample in samples]).astype(np.int64)  # [batch, seq_len + 1]
    batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}
    if "sample_id" in samples[0]:
        batch["sample_ids"] = np.array([sample["sample_id"] for sample in samples], dtype=np.int64)
    return batch
