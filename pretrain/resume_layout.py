"""Resuming a checkpoint on another layout: which layout wrote its per-rank files, whether this run's layout
can load them, and the optimizer state of a checkpoint saved under another sharding degree.

paddlenlp 3.0.0b4 without ``unified_checkpoint`` (``Trainer._save_checkpoint``) writes the optimizer state
once per distinct part: ``optimizer.pdopt`` when every data-parallel replica holds the same (data-parallel
rank 0 writes it), else one file per part named with its variant (``TrainingArguments.optimizer_name_suffix``):
``tp{rank:02d}``, ``pp{stage:02d}``, ``shard{rank:02d}`` joined by "_", e.g. ``optimizer.tp00_shard01.pdopt``;
the weights likewise (``model_state.tp01.pdparams``; sharded too only with ``save_sharded_model``).
On resume each rank reads only the file of its own variant (``Trainer._load_optimizer_and_scheduler``), so
after a change of sharding degree it finds no file (sharding <-> plain data parallel) or a part of the state
(``ShardingIO``'s resharding needs ``save_sharded_model`` + ``load_sharded_model`` and sharding on both sides).

What makes a sharding change loadable: under sharding stage1 and stage2 a rank's optimizer file holds the
Adam moments (and fp32 master weights) of the parameters that rank updates, keyed by parameter name
(``DygraphShardingOptimizer`` / ``GroupShardedOptimizerStage2`` narrow their inner optimizer to their own
parameters), so the shards of one tensor x pipeline position are disjoint and their union is that position's
whole optimizer state, as data parallelism saves it; and a sharded optimizer takes its own parameters' entries
from a whole state (``DygraphShardingOptimizer.set_state_dict`` filters by parameter name; stage2 hands it to
its inner optimizer, which looks each accumulator up by name, but keeps every entry it is given). So
``optimizer_state`` loads the union of the saved shards whenever the sharding degree changed (to or from
none), or the stage between 1 and 2 (each stage assigns parameters to ranks its own way), narrowed to the
parameters this rank's optimizer updates: under stage2 the union itself would stay referenced, its other
ranks' master weights be saved again in this rank's next shard (shards that overlap cannot be merged for
the next change), and every rank hold every shard.

Tensor- and pipeline-parallel files split the tensors and layers themselves: a change of those degrees is
refused (``layout_change_problem``); paddlenlp's unified checkpoint (``unified_checkpoint true``) saves merged
files that it splits for the loading layout (docs/reliability.md); one process reads every file of them only
with ``install_single_process_unified_load`` (paddlenlp 3.0.0b4 reads the first).

The global batch must not change: paddlenlp moves the data to ``global_step x`` the resuming run's global batch
(``Trainer.train``), so another batch would read again, or skip, samples the checkpoint's run did not
(``global_batch_change_problem``), nor the sample length: the position is counted in samples of the sample
index, which ``max_seq_length`` shapes (``sample_length_change_problem``).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Optional

import paddle
from paddlenlp.trainer import TrainerState
from paddlenlp.trainer.trainer import TRAINER_STATE_NAME, TRAINING_ARGS_NAME
from paddlenlp.transformers.configuration_utils import CONFIG_NAME

from pretrain.errors import UserError
from pretrain.layout import ParallelLayout, sharding_stage
from pretrain.registry import implementation_for
from pretrain.upstream import verified

OPTIMIZER_BASE, WEIGHTS_BASE = "optimizer", "model_state"  # paddlenlp's OPTIMIZER_NAME / PADDLE_WEIGHTS_NAME stems
PER_RANK_FILE = re.compile(r"^(optimizer|model_state)\.([a-z0-9_]+)\.(pdopt|pdparams)$")
VARIANT_PART = re.compile(r"^(tp|pp|shard)(\d{2})$")


@dataclass(frozen=True)
class SavedLayout:
    """The tensor, pipeline and optimizer-sharding degrees a checkpoint's file names show (1: not split).

    ``optimizer_files``: ``{(tensor rank, pipeline stage, sharding rank): file name}`` of its ``.pdopt`` files;
    ``sharded_weights``: its weights are split over sharding ranks too (``save_sharded_model``).
    """

    tensor_parallel_degree: int
    pipeline_parallel_degree: int
    sharding_parallel_degree: int
    optimizer_files: dict
    sharded_weights: bool

    def describe(self) -> str:
        """E.g. "TP1 PP1, optimizer sharded over 2": the degrees that wrote the files."""
        shards = self.sharding_parallel_degree
        optimizer = f"optimizer sharded over {shards}" if shards > 1 else "optimizer not sharded"
        return f"TP{self.tensor_parallel_degree} PP{self.pipeline_parallel_degree}, {optimizer}"


def _variant_ranks(variant: str) -> Optional[dict]:
    """``{"tp": r, "pp": s, "shard": k}`` of a file variant ("": the whole), None for one not known here (moe)."""
    ranks = {}
    for part in variant.split("_") if variant else []:
        match = VARIANT_PART.match(part)
        if match is None:
            return None
        ranks[match.group(1)] = int(match.group(2))
    return ranks


def saved_layout(folder: str) -> Optional[SavedLayout]:
    """The layout that wrote checkpoint ``folder``, read from its weight and optimizer file names; None when it
    holds no per-rank ``.pdopt`` file (a unified checkpoint, or weights only) or a variant not listed here."""
    optimizer_files, positions, sharded_weights, sharded_optimizer = {}, [], False, False
    for name in sorted(os.listdir(folder)):
        match = PER_RANK_FILE.match(name)
        if name == f"{OPTIMIZER_BASE}.pdopt":
            ranks: Optional[dict] = {}
        elif match is not None:
            ranks = _variant_ranks(match.group(2))
        else:
            continue
        if ranks is None:
            return None
        sharded_weights |= name.startswith(WEIGHTS_BASE) and "shard" in ranks
        position = (ranks.get("tp", 0), ranks.get("pp", 0), ranks.get("shard", 0))
        positions.append(position)
        if name.endswith(".pdopt"):
            optimizer_files[position] = name
            sharded_optimizer |= "shard" in ranks
    if not optimizer_files:
        return None
    return SavedLayout(
        tensor_parallel_degree=1 + max(p[0] for p in positions),
        pipeline_parallel_degree=1 + max(p[1] for p in positions),
        # a "shard" variant means a degree of 2 or more, also when a node sees only its own shard00
        sharding_parallel_degree=max(1 + max(p[2] for p in optimizer_files), 2 if sharded_optimizer else 1),
        optimizer_files=optimizer_files,
        sharded_weights=sharded_weights,
    )


def layout_change_problem(folder: str, layout: ParallelLayout, load_sharded_model: bool = False) -> Optional[str]:
    """None when a run of ``layout`` can resume checkpoint ``folder`` (paddlenlp reads it as saved, or
    ``optimizer_state`` merges its optimizer shards), else why not and the supported way, in one line.

    Refused: another tensor or pipeline degree; a change to or from sharding stage3, or of its degree
    (``_stage3_change_problem``); weights saved per sharding rank (``save_sharded_model``) unless this run
    shards too and loads them with ``load_sharded_model`` (paddlenlp's ``ShardingIO`` reshards them).
    """
    saved = saved_layout(folder)
    if saved is None:
        return None
    stage = saved_sharding_stage(folder) if saved.sharding_parallel_degree > 1 else None
    return saved_layout_change_problem(folder, saved, stage, layout, load_sharded_model)


def saved_layout_change_problem(
    folder: str,
    saved: SavedLayout,
    saved_stage: Optional[int],
    layout: ParallelLayout,
    load_sharded_model: bool = False,
) -> Optional[str]:
    """``layout_change_problem`` of a checkpoint ``folder`` (named in the line) whose per-rank files ``saved``
    describes, saved at sharding stage ``saved_stage`` (0-3; None: not known): also for a checkpoint not yet
    written (``pretrain.support_matrix`` asks it of a layout's checkpoint before any run)."""
    tp, pp = layout.tensor_parallel_degree, layout.pipeline_parallel_degree
    if (saved.tensor_parallel_degree, saved.pipeline_parallel_degree) != (tp, pp):
        return (
            f"resume: {folder} was saved by {saved.describe()} (per-rank files), this run is TP{tp} PP{pp}; "
            "paddlenlp loads per-rank tensor/pipeline files only into the degrees that wrote them: resume with "
            f"tensor_parallel_degree {saved.tensor_parallel_degree} and pipeline_parallel_degree "
            f"{saved.pipeline_parallel_degree} (sharding and data-parallel degrees may change), or save with "
            "unified_checkpoint true, whose merged files paddlenlp splits for any layout"
        )
    stage3_problem = _stage3_change_problem(folder, saved, saved_stage, layout)
    if stage3_problem is not None:
        return stage3_problem
    if saved.sharded_weights and not (load_sharded_model and layout.sharding_parallel_degree > 1):
        return (
            f"resume: {folder} holds weights split over {saved.sharding_parallel_degree} sharding ranks "
            "(save_sharded_model); only a sharding stage1 run with load_sharded_model true reads them "
            "(paddlenlp reshards them over its sharding degree): resume that way"
        )
    return None


def global_batch_change_problem(folder: str, global_batch_samples: int, parts: str) -> Optional[str]:
    """None when checkpoint ``folder`` was trained with a global batch of ``global_batch_samples`` samples (or
    trained no step), else why it cannot be resumed, in one line.

    The checkpoint's global batch is paddlenlp's ``consumed_samples / global_step`` (its ``trainer_state.json``,
    both counted at every optimizer step). paddlenlp resumes the data at ``global_step x`` this run's global
    batch: with another one it would read samples already trained on again (a smaller batch) or never read
    some (a larger one), and the schedule, counted in steps, would no longer match the tokens seen.

    Args:
        global_batch_samples: samples per optimizer step of the resuming run, all ranks.
        parts: how this run's global batch is made, for the message (e.g.
            "per_device_train_batch_size 2 x gradient_accumulation_steps 1 x 1 data-parallel rank(s)").
    """
    path = os.path.join(folder, TRAINER_STATE_NAME)
    if not os.path.isfile(path):
        return None
    state = TrainerState.load_from_json(path)
    if not state.global_step or state.consumed_samples == global_batch_samples * state.global_step:
        return None
    saved = state.consumed_samples // state.global_step
    return (
        f"resume: {folder} was trained with a global batch of {saved} samples ({state.consumed_samples} samples "
        f"in {state.global_step} steps, its {TRAINER_STATE_NAME}), this run's is {global_batch_samples} ({parts}); "
        f"paddlenlp would resume the data at {state.global_step} x {global_batch_samples} samples, not at the "
        f"{state.consumed_samples} trained on: keep the global batch at {saved} (e.g. global_batch_size "
        f"{saved}), or start afresh with overwrite_output_dir true (the old run is moved aside)"
    )


def sample_length_change_problem(folder: str, seq_length: int) -> Optional[str]:
    """None when checkpoint ``folder`` was trained on samples of ``seq_length`` tokens (or its ``config.json`` does
    not say: ``seq_length``, which ``pretrain.model_config`` sets to ``max_seq_length`` plus the multi-token-prediction
    depths, ``pretrain.mtp``), else why it cannot be resumed, in one line.

    paddlenlp resumes the data at ``consumed_samples`` of the sample index, which ``max_seq_length`` shapes (a
    sample is ``max_seq_length + 1`` tokens of the shuffled documents, ``pretrain.data``): with another length
    that position points into another index (samples trained on read again, others never), and ``train_tokens``
    would count the checkpoint's steps at the new length (+33% after 64 -> 128 at half the steps).

    Args:
        seq_length: tokens per sample of the resuming run (``max_seq_length``).
    """
    try:
        with open(os.path.join(folder, CONFIG_NAME), encoding="utf-8") as f:
            config = json.load(f)
        saved = config.get("seq_length")
        saved = None if saved is None else saved - int(config.get("num_nextn_predict_layers") or 0)
    except (OSError, ValueError, AttributeError, TypeError):
        return None  # no config.json to read: the architecture check speaks for it
    if saved is None or saved == seq_length:
        return None
    return (
        f"resume: {folder} was trained on samples of {saved} tokens (max_seq_length {saved}, its {CONFIG_NAME} "
        f"seq_length), this run's are {seq_length}; paddlenlp would resume the data at its sample count in another "
        f"sample index, and train_tokens would count its steps at {seq_length} tokens: keep max_seq_length {saved} "
        f"to resume, or train on at {seq_length} from its weights in a new output_dir (model_name_or_path {folder}, "
        "continue_training true)"
    )


def _stage3_change_problem(
    folder: str, saved: SavedLayout, saved_stage: Optional[int], layout: ParallelLayout
) -> Optional[str]:
    """Why a sharding stage3 checkpoint cannot resume on another layout, or a stage3 run from another layout's
    checkpoint (None: neither side is stage3, or both are, over the same degree). paddle's ``GroupShardedStage3``
    hands its optimizer each sliced parameter as ``slice@<name>`` holding this rank's padded slice, so its
    optimizer files key those states by other names and shapes than every other layout's: the other side
    would train on with fresh Adam moments for them."""
    saved_stage3 = saved.sharding_parallel_degree > 1 and saved_stage == 3
    stage3 = layout.sharding_parallel_degree > 1 and layout.sharding_stage == 3
    if saved_stage3 == stage3 and (not stage3 or saved.sharding_parallel_degree == layout.sharding_parallel_degree):
        return None
    saved_text = f"sharding stage3 over {saved.sharding_parallel_degree}" if saved_stage3 else saved.describe()
    run_text = f"sharding stage3 over {layout.sharding_parallel_degree}" if stage3 else "not sharding stage3"
    return (
        f"resume: {folder} was saved by {saved_text} and this run is {run_text}; stage3's optimizer files hold "
        "each sliced parameter's state under another name and shape (slice@<name>), so it resumes only the "
        "layout that saved it: resume with that sharding stage and degree"
    )


def resume_layout_problems(plan) -> list:
    """Preflight: ``[why]`` when the ``RunPlan``'s resume checkpoint was saved by a layout it cannot load
    (``layout_change_problem``), with another global batch (``global_batch_change_problem``) or sample length
    (``sample_length_change_problem``), else ``[]``."""
    folder = plan.resume_checkpoint
    if folder is None or not os.path.isdir(folder):
        return []
    args = plan.training_args
    parts = (
        f"per_device_train_batch_size {args.per_device_train_batch_size} x gradient_accumulation_steps "
        f"{args.gradient_accumulation_steps} x {plan.layout.dataset_world_size} data-parallel rank(s)"
    )
    problems = [
        layout_change_problem(folder, plan.layout, bool(args.load_sharded_model)),
        global_batch_change_problem(folder, plan.global_batch_samples, parts),
        sample_length_change_problem(folder, plan.seq_length),
    ]
    if os.path.isfile(os.path.join(folder, UNIFIED_OPTIMIZER_INDEX)) and os.path.isfile(
        os.path.join(folder, TRAINING_ARGS_NAME)
    ):
        saved_args = paddle.load(os.path.join(folder, TRAINING_ARGS_NAME))
        saved_tp = getattr(saved_args, "tensor_parallel_degree", 1)
        saved_pp = getattr(saved_args, "pipeline_parallel_degree", 1)
        problems += unified_resume_problems(folder, saved_tp, saved_pp, plan.model_config, plan.layout)
    return [problem for problem in problems if problem is not None]


def unified_resume_problems(
    folder: str, saved_tensor_parallel_degree: int, saved_pipeline_parallel_degree: int, config, layout
) -> list:
    """``[why]`` a unified checkpoint ``folder`` of a model of ``config``, saved with those degrees, cannot be
    resumed by a run of ``layout`` (``tied_embedding_resume_problem``, ``pipeline_head_resume_problem``)."""
    ties = bool(getattr(config, "tie_word_embeddings", False))
    head_as_embedding = ties and implementation_for(config.model_type).pipeline_head_saved_as_embedding
    problems = [
        tied_embedding_resume_problem(folder, saved_tensor_parallel_degree, ties, layout),
        pipeline_head_resume_problem(folder, saved_pipeline_parallel_degree, head_as_embedding, layout),
    ]
    return [problem for problem in problems if problem is not None]


def pipeline_head_resume_problem(
    folder: str, saved_pipeline_parallel_degree: int, head_saved_as_embedding: bool, layout: ParallelLayout
) -> Optional[str]:
    """Why a unified checkpoint ``folder`` saved with pipelines by a model that names its tied head as the
    embedding there (``head_saved_as_embedding``: ``Implementation.pipeline_head_saved_as_embedding``) cannot be
    resumed by a run of ``layout`` without pipelines; None otherwise. Such a checkpoint holds no ``lm_head.weight``,
    which paddlenlp 3.0.0b4's unified loaders require of a model that ties it (``load_save_single_card.py:184``,
    ``load_local.py:82``): measured, GPT-3 debug from PP2 to one process: ``ValueError: Missing keys:
    {'lm_head.weight'}`` at start (the support matrix)."""
    if not head_saved_as_embedding or saved_pipeline_parallel_degree <= 1 or layout.pipeline_parallel_degree > 1:
        return None
    return (
        f"resume: {folder} was saved with pipeline_parallel_degree {saved_pipeline_parallel_degree} by a model "
        "whose pipeline stages name the tied output head as the embedding, so it holds no lm_head.weight, which "
        "paddlenlp 3.0.0b4's load without pipelines requires; resume it with pipeline parallelism, or export it "
        "(tools/export_hf.py) and continue_training from the export"
    )


UNIFIED_OPTIMIZER_INDEX = "optimizer.safetensors.index.json"


def tied_embedding_resume_problem(
    folder: str, saved_tensor_parallel_degree: int, ties: bool, layout: ParallelLayout
) -> Optional[str]:
    """Why a unified checkpoint ``folder`` of a model with tied embeddings (``ties``), saved without tensor
    parallelism, cannot be resumed by a run of ``layout`` with it; None otherwise.

    Saved on one tensor rank, the shared weight's optimizer state is under ``lm_head.weight/...`` alone (the last
    name of the tensor in the state dict); paddlenlp 3.0.0b4's unified optimizer load under tensor parallelism
    looks it up under the embedding's name (``unified_checkpoint/check_completion.py:207``, ``weight_map[type_key]``):
    measured, Qwen3 debug (tied) from one process to TP2: ``KeyError: 'qwen2.embed_tokens.weight/beta2_pow_acc_0'``
    at start. Saved under tensor parallelism the same run resumes on one process."""
    if not ties or saved_tensor_parallel_degree > 1 or layout.tensor_parallel_degree == 1:
        return None
    return (
        f"resume: {folder} was saved without tensor parallelism by a model with tied embeddings, whose unified "
        "optimizer holds the shared weight's state under lm_head.weight alone, where paddlenlp 3.0.0b4's load "
        f"under tensor_parallel_degree {layout.tensor_parallel_degree} looks it up under the embedding's name; "
        "resume it with tensor_parallel_degree 1, or continue_training from its weights (a new optimizer state)"
    )


def _merge(states: list, folder: str) -> dict:
    """One optimizer state from disjoint shards: every key once, ``master_weights`` merged too.

    Raises:
        UserError: two shards hold the same entry (they are not the disjoint parts of sharding stage1/2).
    """
    merged: dict = {}
    master_weights: dict = {}
    for state in states:
        for key, value in state.items():
            if key == "LR_Scheduler":  # the same in every shard
                merged[key] = value
                continue
            into, entries = (master_weights, value.items()) if key == "master_weights" else (merged, [(key, value)])
            for entry, tensor in entries:
                if entry in into:
                    raise UserError(
                        f"resume: the optimizer shards of {folder} overlap ({entry} is in two of them), so they "
                        "cannot be merged for another sharding degree; resume with the sharding degree that saved it"
                    )
                into[entry] = tensor
    if master_weights:
        merged["master_weights"] = master_weights
    return merged


def saved_sharding_stage(folder: str) -> Optional[int]:
    """The sharding stage (0-3) of the run that saved checkpoint ``folder``, read from paddlenlp's
    ``training_args.bin`` (its pickled arguments); None when the file is not there."""
    path = os.path.join(folder, TRAINING_ARGS_NAME)
    if not os.path.isfile(path):
        return None
    saved_args = paddle.load(path)
    return sharding_stage(getattr(saved_args, "sharding_configured", saved_args.sharding))


def _same_partition(folder: str, saved: SavedLayout, layout: ParallelLayout) -> bool:
    """Whether ``layout`` splits the optimizer state over its ranks as the run that saved ``folder`` did: the same
    sharding degree and, when sharded, the same stage. Stage1 (``DygraphShardingOptimizer``) and stage2
    (``GroupShardedOptimizerStage2._segment_params``) assign the parameters to ranks each its own way, so
    the stage2 file of sharding rank r holds the state of other parameters than stage1's rank r updates
    (a stage unknown, without ``training_args.bin``, counts as the same)."""
    if saved.sharding_parallel_degree != layout.sharding_parallel_degree:
        return False
    return saved.sharding_parallel_degree == 1 or saved_sharding_stage(folder) in (None, layout.sharding_stage)


def _entries_of(state: dict, parameters: list) -> dict:
    """The entries of an optimizer state (``paddle.load`` of a ``.pdopt``) that belong to ``parameters`` (names):
    their accumulators (``<name>_moment1_0``, ...), their ``master_weights`` and the ``LR_Scheduler``, as
    paddle's sharding stage1 ``DygraphShardingOptimizer.set_state_dict`` keeps them for its rank. paddle's
    stage2 optimizer hands what it is given to its inner optimizer, which keeps all of it (and saves its
    master weights again): the caller filters for it."""
    prefixes = tuple(f"{name}_" for name in parameters)
    kept = {key: value for key, value in state.items() if key == "LR_Scheduler" or key.startswith(prefixes)}
    if "master_weights" in state:
        wanted = set(parameters)
        kept["master_weights"] = {name: value for name, value in state["master_weights"].items() if name in wanted}
    return kept


def reshards_optimizer(folder: str, layout: ParallelLayout) -> bool:
    """Whether checkpoint ``folder``'s optimizer was saved over another sharding degree or stage than ``layout``'s
    (per-rank files that paddlenlp cannot read as saved: ``optimizer_state`` merges them). Reads file names only."""
    saved = saved_layout(folder)
    return saved is not None and not _same_partition(folder, saved, layout)


def optimizer_state(
    folder: str, layout: ParallelLayout, tensor_rank: int, pipeline_stage: int, parameters: list
) -> Optional[dict]:
    """The optimizer state of ``parameters`` at this rank's tensor x pipeline position in checkpoint ``folder``
    when it was saved over another sharding degree or stage than ``layout``'s (their entries in the union of
    that position's shards, as ``paddle.load`` returns them); None when paddlenlp can read it as saved (the
    same degree and stage, or no per-rank files: ``_same_partition``). The shards are read one at a time and
    narrowed to ``parameters`` at once: at most one whole shard is held besides the result.

    Args:
        parameters: names (``param.name``) of the trained parameters this rank's optimizer updates (under
            sharding its own part, ``pretrain.optimizer_chain.own_parameters``); each must have state in the union
            (entries named ``<param.name>_moment1_0``, ``<param.name>_fp32_master_0_moment1_0``, ...), or a
            shard is missing.

    Raises:
        UserError: the shards overlap (not the disjoint parts that sharding stage1/2 saves), or hold no state
            for some of ``parameters`` (a shard file is not there).
    """
    if not reshards_optimizer(folder, layout):
        return None
    saved = saved_layout(folder)
    assert saved is not None  # reshards_optimizer read it
    files = [name for (t, p, _), name in saved.optimizer_files.items() if (t, p) == (tensor_rank, pipeline_stage)]
    shards = [_entries_of(paddle.load(os.path.join(folder, name)), parameters) for name in sorted(files)]
    merged = _merge(shards, folder)
    missing = [name for name in parameters if not any(key.startswith(f"{name}_") for key in merged)]
    if missing:
        raise UserError(
            f"resume: the optimizer files of {folder} ({', '.join(sorted(files))}) hold no state for {len(missing)} "
            f"of this run's {len(parameters)} parameters (e.g. {missing[0]}): a shard is missing; resume with the "
            "sharding degree that saved it, or restore the missing optimizer file"
        )
    return merged


# paddlenlp 3.0.0b4's single-process unified-checkpoint loaders (``load_single_card_checkpoint`` and
# ``load_single_card_optimizer``) read ``resolved_archive_file[0]`` only: a checkpoint saved by several
# ranks (``model-00001-of-00002.safetensors``, ...; one file per tensor x pipeline position) loaded into one
# process kept its initial weights for every tensor of the other files and then stopped at the optimizer
# ("Optimizer set error, embedding_0.w_0_moment2_0 should in state dict"). The multi-process loaders
# read every file.
SHARD_FILE = re.compile(r"(?P<prefix>.+)-00001-of-(?P<count>\d{5})\.safetensors")


def load_every_shard(first_file: str, split_mapping=None, keys=None, **kwargs) -> dict:
    """paddlenlp's ``load_state_dict`` of ``first_file`` and, when it is the first of several shards
    (``<prefix>-00001-of-0000N.safetensors``), of the others; the same arguments."""
    from paddlenlp.transformers.model_utils import load_state_dict

    match = SHARD_FILE.fullmatch(os.path.basename(first_file))
    count = int(match["count"]) if match else 1
    state: dict = {}
    for number in range(1, count + 1):
        name = f"{match['prefix']}-{number:05d}-of-{match['count']}.safetensors" if match else first_file
        state.update(load_state_dict(os.path.join(os.path.dirname(first_file), name), split_mapping, keys, **kwargs))
    return state


def install_single_process_unified_load() -> None:
    """Make paddlenlp 3.0.0b4's single-process unified-checkpoint loaders read every shard file
    (``load_every_shard``): how one process resumes a checkpoint of a tensor- or pipeline-parallel run."""
    from paddlenlp.trainer.unified_checkpoint import load_save_single_card

    if verified("single-process-unified-load"):
        load_save_single_card.load_state_dict = load_every_shard
