"""Run arguments: three dataclasses, one JSON file, command-line overrides.

Every flag is defined once, here (or in paddlenlp's ``TrainingArguments``), and keeps its name
from the JSON file to the code that reads it. Nothing is rewritten after parsing: values derived
from several flags live in new, named fields or functions.

Usage::

    model_args, data_args, training_args = parse_arguments(["config/llama/pretrain_demo_cpu.json",
                                                            "--max_steps", "10"])
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import sys
from dataclasses import dataclass, field, fields
from typing import Optional

from paddlenlp.trainer import PdArgumentParser, TrainingArguments
from paddlenlp.transformers.configuration_utils import llmmetaclass

from pretrain.enums import plain
from pretrain.errors import UserError, raise_problems
from pretrain.layout import accumulation_for_global_batch, check_degrees_divide_the_cards
from pretrain.log import logger
from pretrain.lr_schedule import SCHEDULERS
from pretrain.nan_guard import NAN_POLICIES
from pretrain.recovery import LOSS_SPIKE_POLICIES
from pretrain.registry import find_model_size
from pretrain.schema import (
    help_with_range,
    json_type_problem,
    range_problems,
    ranged,
    redeclared,
    relation_problems,
    repeated_keys,
)


@dataclass
class ModelArguments:
    """What model to build and how; config overrides default to None (= keep the config's value)."""

    model_name_or_path: str = field(
        metadata={
            "help": "Local directory holding config.json (and weights when continue_training), "
            "or a registry name or hub-style alias resolved offline (e.g. llama-2-7b, "
            "meta-llama/Llama-2-7b, qwen2-debug); see docs/models.md."
        }
    )
    tokenizer_name_or_path: Optional[str] = field(
        default=None, metadata={"help": "Local tokenizer directory; defaults to model_name_or_path."}
    )
    continue_training: bool = field(
        default=False,
        metadata={"help": "Load the weights in model_name_or_path instead of initialising from scratch."},
    )
    num_hidden_layers: Optional[int] = field(
        default=None, metadata={"help": "Override: transformer layers.", "range": "[1, inf)"}
    )
    hidden_size: Optional[int] = field(
        default=None, metadata={"help": "Override: model width (elements).", "range": "[1, inf)"}
    )
    intermediate_size: Optional[int] = field(
        default=None, metadata={"help": "Override: MLP width (elements).", "range": "[1, inf)"}
    )
    moe_intermediate_size: Optional[int] = field(
        default=None,
        metadata={
            "help": "Override: hidden units of each routed expert, and of each DeepSeek shared expert (mixtures "
            "of experts with the key: Qwen2-MoE, DeepSeek).",
            "range": "[1, inf)",
        },
    )
    shared_expert_intermediate_size: Optional[int] = field(
        default=None,
        metadata={"help": "Override: hidden units of Qwen2-MoE's shared expert.", "range": "[1, inf)"},
    )
    n_routed_experts: Optional[int] = field(
        default=None,
        metadata={"help": "Override: routed experts per layer of a DeepSeek model.", "range": "[1, inf)"},
    )
    q_lora_rank: Optional[int] = field(
        default=None,
        metadata={
            "help": "Override: rank of DeepSeek's compressed queries (multi-head latent attention).",
            "range": "[1, inf)",
        },
    )
    kv_lora_rank: Optional[int] = field(
        default=None,
        metadata={
            "help": "Override: rank of DeepSeek's compressed keys and values (multi-head latent attention).",
            "range": "[1, inf)",
        },
    )
    num_nextn_predict_layers: Optional[int] = field(
        default=None,
        metadata={
            "help": "Override: DeepSeek's multi-token-prediction modules (0: none; DeepSeek-V3 has 1).",
            "range": "[0, inf)",
        },
    )
    num_nextn_predict_lambda: Optional[float] = field(
        default=None,
        metadata={
            "help": "Override: weight of DeepSeek's multi-token-prediction loss (DeepSeek-V3: 0.3 for its first "
            "10T tokens, 0.1 after).",
            "range": "[0, inf)",
        },
    )
    num_attention_heads: Optional[int] = field(
        default=None, metadata={"help": "Override: query heads.", "range": "[1, inf)"}
    )
    num_key_value_heads: Optional[int] = field(
        default=None,
        metadata={"help": "Override: key/value heads (grouped-query attention when < heads).", "range": "[1, inf)"},
    )
    max_position_embeddings: Optional[int] = field(
        default=None,
        metadata={"help": "Override: longest sequence the position scheme supports (tokens).", "range": "[1, inf)"},
    )
    vocab_size: Optional[int] = field(
        default=None,
        metadata={
            "help": "Override: embedding rows. From scratch, the default is the tokenizer's vocabulary "
            "padded up to a multiple of 128.",
            "range": "[1, inf)",
        },
    )
    fuse_attention_qkv: Optional[bool] = field(
        default=None, metadata={"help": "One matmul for Q, K and V (None keeps the model config's value)."}
    )
    fuse_attention_ffn: Optional[bool] = field(
        default=None,
        metadata={"help": "One matmul for the MLP gate and up projections (None keeps the model config's value)."},
    )


@dataclass
class DataArguments:
    """Where the tokenized corpus is and how it is cut into samples."""

    input_dir: str = field(
        metadata={
            "help": "A folder of <prefix>.bin/.idx (or <name>_ids.npy/_idx.npz) pairs, one prefix, "
            'or a weighted list "w1 prefix1 w2 prefix2 ...".'
        }
    )
    split: str = field(default="949,50,1", metadata={"help": "Train,validation,test proportions of the documents."})
    max_seq_length: int = field(default=1024, metadata={"help": "Tokens per training sample.", "range": "[1, inf)"})
    share_folder: bool = field(
        default=False,
        metadata={
            "help": "The data folder is on storage shared by all nodes: only global rank 0 builds the index cache."
        },
    )
    data_cache: Optional[str] = field(
        default=None,
        metadata={
            "help": "Folder for the index cache (default: <data folder>/index-cache); each version of the data "
            "gets its own subfolder, named by a fingerprint of the data files."
        },
    )
    data_impl: str = field(
        default="mmap",
        metadata={
            "help": "Indexed dataset implementation: mmap (the only one that reads .bin/.idx; kept so PaddleNLP "
            "configs parse unchanged).",
            "choices": ["mmap"],
        },
    )
    skip_warmup: bool = field(default=True, metadata={"help": "Do not pre-read the mmap files at start."})
    reset_position_ids: bool = field(
        default=False,
        metadata={"help": "Positions restart at 0 after each EOS of a sample (Megatron's --reset-position-ids)."},
    )
    reset_attention_mask: bool = field(
        default=False,
        metadata={
            "help": "Tokens attend only within their own document of a sample: block-diagonal causal attention "
            "(FlashMask under use_flash_attention, else a dense [batch, 1, seq, seq] mask; docs/dataset.md)."
        },
    )
    eod_mask_loss: bool = field(
        default=False,
        metadata={"help": "Leave the prediction made at each EOS (the next document's first token) out of the loss."},
    )
    log_sample_ids: bool = field(
        default=False,
        metadata={
            "help": "Also write every optimizer step's sample ids (dataset indices, all ranks) to "
            "<output_dir>/sample_ids.jsonl; the per-step hash in loss_history.json is always kept."
        },
    )
    allow_tokenizer_mismatch: bool = field(
        default=False,
        metadata={
            "help": "Train although a data prefix's .stats.json records another tokenizer (class, vocabulary "
            "size or EOS id) than this run's; only when the token ids are known to mean the same."
        },
    )


@dataclass
@llmmetaclass
class PreTrainingArguments(TrainingArguments):
    """paddlenlp's TrainingArguments plus the pretraining schedule, measurement and model-path flags.

    ``llmmetaclass`` adds every field of paddlenlp's ``LlmMetaConfig`` that TrainingArguments lacks
    (``use_fused_linear``, ``virtual_pp_degree``, ``refined_recompute``, ``no_recompute_layers``,
    ...), as upstream PaddleNLP's run_pretrain.py does; ``pretrain.model_config`` copies them all
    onto the model config with ``LlmMetaConfig.set_llm_config``. Those documented here replace
    paddlenlp's one-word help.
    """

    use_flash_attention: bool = field(
        default=False, metadata={"help": "Flash attention: no [seq, seq] score matrix is stored (GPU only)."}
    )
    use_fused_rms_norm: bool = field(
        default=False, metadata={"help": "RMSNorm through the fused_ln custom op (build it with `make ops`)."}
    )
    use_fused_rope: bool = field(default=False, metadata={"help": "Fused rotary position embedding (GPU only)."})
    recompute_granularity: str = field(
        default="full",
        metadata={
            "help": "What to recompute in backward when --recompute is on: a whole layer (full), its attention "
            "block (full_attn) or the attention core (core_attn).",
            "choices": ["full", "full_attn", "core_attn"],
        },
    )
    virtual_pp_degree: int = field(
        default=1,
        metadata={
            "help": "Virtual pipeline stages per pipeline rank (interleaved 1F1B schedule).",
            "range": "[1, inf)",
        },
    )

    min_learning_rate: float = field(
        default=1e-5,
        metadata={
            "help": "Learning rate at the end of the decay (linear or cosine schedule); <= learning_rate.",
            "range": "[0, inf)",
        },
    )
    decay_steps: Optional[int] = field(
        default=None,
        metadata={"help": "Optimizer steps over which the LR decays; default max_steps.", "range": "[1, inf)"},
    )
    eval_iters: int = field(
        default=10,
        metadata={
            "help": "Validation global batches at each evaluation: eval_iters x the training global batch samples "
            "(Megatron-LM's count), the same samples on any layout, read in per_device_eval_batch_size batches "
            "split over the data-parallel ranks.",
            "range": "[0, inf)",
        },
    )
    peak_flops_per_card: Optional[float] = field(
        default=None,
        metadata={
            "help": "Peak dense FLOP/s of one card for MFU (e.g. 312e12 for A100 bf16). "
            "Unset: the datasheet figure of a known GPU (A100, A800, H100, H800, H200; bf16/fp16 under AMP, "
            "else TF32; "
            "see pretrain/metrics/hardware.py), "
            "else on CPU the physical peak (cores x FMA width x 2 x clock, from /proc/cpuinfo), "
            "else MFU is reported as null. Set, it wins over a detected GPU's figure (one warning line when they "
            "differ): leave it unset to divide by the card the run is on.",
            "range": "(0, inf)",
        },
    )
    measure_peak_flops: bool = field(
        default=False,
        metadata={
            "help": "Measure the achievable FLOP/s per card with a float32 matmul microbenchmark (best of several "
            "sizes and repeats, about 3 s) before training, reported beside the peak as achievable_flops_per_card; "
            "MFU always divides by the peak (peak_flops_per_card, datasheet or physical), never by this."
        },
    )
    nominal_params: Optional[float] = field(
        default=None,
        metadata={
            "help": "Nominal parameter count of the model's name for the nominal MFU form, 6 x this FLOPs "
            "per token (4 x when only a LoRA adapter is trained; e.g. 7e9 for Llama-2-7B, as FlagPerf); "
            "unset: mfu_nominal is null.",
            "range": "(0, inf)",
        },
    )
    throughput_warmup_steps: int = field(
        default=1,
        metadata={
            "help": "Optimizer steps (>= 1) at the start of this process left out of tokens/card/s, "
            "samples/s and MFU (graph building, allocator growth).",
            "range": "[1, inf)",
        },
    )

    rehearse: bool = field(
        default=False,
        metadata={
            "help": "Command line only, without a launcher: rehearse this GPU recipe on CPU processes (its layout, "
            "the model shrunk, a few steps; save, resume, export) and print what it checked "
            "(pretrain.rehearsal, docs/gpu.md)."
        },
    )
    dry_run: bool = field(
        default=False,
        metadata={
            "help": "Run the preflight checks, print the resolved config, model size and data summary, "
            "and exit (status 0) without indexing data or building the model."
        },
    )
    nan_policy: str = field(
        default="stop",
        metadata={
            "help": "On a nan/inf loss or gradient: stop (keep the last complete checkpoint) or skip that optimizer "
            "step (no checkpoint until a later step is applied; a skipped last step stops the run).",
            "choices": list(NAN_POLICIES),
        },
    )
    max_skipped_nan_steps: int = field(
        default=10,
        metadata={
            "help": "With nan_policy skip: optimizer steps skipped before the run stops anyway (steps).",
            "range": "[0, inf)",
        },
    )
    global_batch_size: Optional[int] = field(
        default=None,
        metadata={
            "help": "Samples per optimizer step over all cards (x max_seq_length tokens), pinned: "
            "gradient_accumulation_steps (leave it unset) is derived from the card count as global batch / "
            "(per_device_train_batch_size x data-parallel ranks), so the run trains the same tokens on any "
            "number of nodes; a card count that cannot reach it is refused. Unset: gradient_accumulation_steps "
            "as given, and the global batch grows with the cards.",
            "range": "[1, inf)",
        },
    )
    max_wall_time: Optional[float] = field(
        default=None,
        metadata={
            "help": "Seconds after the start of the run (its main function, after the imports) at which it stops "
            "as on SIGTERM: checkpoint at the next step boundary, exit status 75 (requeue; docs/distributed.md). "
            "Leave the imports, one step and one checkpoint save below the scheduler's limit. Unset: no limit.",
            "range": "(0, inf)",
        },
    )

    moe_bias_update_rate: Optional[float] = field(
        default=None,
        metadata={
            "help": "DeepSeek-V3's auxiliary-loss-free balancing: after each optimizer step every routing bias "
            "(e_score_correction_bias) moves by this much toward balance, b += rate x sign(mean load - load) "
            "(technical report arXiv:2412.19437, 2.1.2). Unset: 0.001 (the report's) for a model with routing "
            "biases (topk_method noaux_tc); 0 turns it off. Other models have no bias to move. At most 0.1 (100 x "
            "the report's): the biases are added to sigmoid scores in (0, 1), which a few steps of a larger rate "
            "outweigh, so the routing would follow the last steps' loads alone.",
            "range": "[0, 0.1]",
        },
    )
    loss_spike_policy: str = field(
        default="none",
        metadata={
            "help": "On a loss spike (loss above spike_factor x its moving average, or the gradient norm above "
            "or below its own by that factor; see spike_warmup_steps) or a nan/inf step: none (log it; nan_policy "
            "decides for nan/inf), skip (do not apply that optimizer step) or rollback (go back to the last "
            "healthy checkpoint and skip rollback_skip_batches batches). See docs/reliability.md.",
            "choices": list(LOSS_SPIKE_POLICIES),
        },
    )
    spike_factor: float = field(
        default=10.0,
        metadata={
            "help": "A step spikes when its loss, or its gradient norm, exceeds this multiple of its exponential "
            "moving average over the healthy steps (10: Megatron-LM's threshold for spiky loss and large grads).",
            "range": "(1, inf)",
        },
    )
    spike_warmup_steps: int = field(
        default=10,
        metadata={
            "help": "Healthy optimizer steps before the moving-average rules apply (until then a step spikes only "
            "when its gradient norm is spike_factor x above the largest or below the smallest so far); also the "
            "healthy steps in a row after a spike left alone before checkpoints count as healthy again.",
            "range": "[1, inf)",
        },
    )
    max_skipped_steps: int = field(
        default=5,
        metadata={
            "help": "With loss_spike_policy skip: spiking steps skipped in a row before the run stops (steps).",
            "range": "[0, inf)",
        },
    )
    rollback_skip_batches: int = field(
        default=200,
        metadata={
            "help": "With loss_spike_policy rollback: global batches skipped after the checkpoint rolled back to "
            "(at least up to the spiking one; PaLM skipped 200-500 batches, arXiv:2204.02311 section 5.1).",
            "range": "[1, inf)",
        },
    )
    rollback_lr_factor: float = field(
        default=1.0,
        metadata={
            "help": "With loss_spike_policy rollback: the learning rate is multiplied by this at each rollback.",
            "range": "(0, 1]",
        },
    )
    max_rollbacks: int = field(
        default=3,
        metadata={
            "help": "With loss_spike_policy rollback: rollbacks before the run stops.",
            "range": "[0, inf)",
        },
    )
    debug_inject_spike_at_step: int = field(
        default=0,
        metadata={
            "help": "Fault injection for tests: multiply the loss of the batch of this global step (1-based) by "
            "1000 on every rank, a poisoned batch (0: off).",
            "range": "[0, inf)",
        },
    )
    # paddlenlp's keys, declared again only to add their range or choices (default and help stay paddlenlp's)
    learning_rate: float = ranged(TrainingArguments, "learning_rate", "[0, inf)")
    weight_decay: float = ranged(TrainingArguments, "weight_decay", "[0, inf)")
    adam_beta1: float = ranged(TrainingArguments, "adam_beta1", "[0, 1)")
    adam_beta2: float = ranged(TrainingArguments, "adam_beta2", "[0, 1)")
    adam_epsilon: float = ranged(TrainingArguments, "adam_epsilon", "[0, inf)")
    warmup_steps: int = ranged(TrainingArguments, "warmup_steps", "[0, inf)")
    warmup_ratio: float = ranged(TrainingArguments, "warmup_ratio", "[0, 1]")
    seed: int = ranged(TrainingArguments, "seed", "[0, 4294967295]")  # numpy's seeds are 32-bit
    dataloader_num_workers: int = ranged(TrainingArguments, "dataloader_num_workers", "[0, inf)")
    per_device_train_batch_size: int = ranged(TrainingArguments, "per_device_train_batch_size", "[1, inf)")
    per_device_eval_batch_size: int = ranged(TrainingArguments, "per_device_eval_batch_size", "[1, inf)")
    gradient_accumulation_steps: int = ranged(TrainingArguments, "gradient_accumulation_steps", "[1, inf)")
    logging_steps: int = ranged(TrainingArguments, "logging_steps", "[1, inf)")
    save_total_limit: Optional[int] = ranged(TrainingArguments, "save_total_limit", "[1, inf)")
    max_grad_norm: float = ranged(TrainingArguments, "max_grad_norm", "[0, inf)")
    lr_scheduler_type: str = redeclared(TrainingArguments, "lr_scheduler_type", choices=tuple(SCHEDULERS))
    hang_timeout: float = field(
        default=600.0,
        metadata={
            "help": "Under a launcher: seconds a rank may go without progress (a training phase: data, "
            "forward/backward, optimizer, collective, save, evaluate; or its verdict at a check all ranks make) "
            "before the whole job is ended with a report naming the rank, step and phase (exit status 124); "
            "raise it when one checkpoint save or evaluation takes longer. See docs/distributed.md.",
            "range": "(0, inf)",
        },
    )
    slow_rank_threshold: float = field(
        default=0.2,
        metadata={
            "help": "Under a launcher: at each log record, a warning names the slowest rank when its own time per "
            "step (data + forward) exceeds the median rank's by more than this fraction (0.2: a fifth).",
            "range": "[0, inf)",
        },
    )

    def __post_init__(self):
        # paddlenlp drops `sharding` when its degree is 1; the layout keeps the stage the config named.
        self.sharding_configured = self.sharding
        check_degrees_divide_the_cards(self)
        if self.global_batch_size is not None:
            # Before paddlenlp's own __post_init__, which hands the accumulation to the pipeline schedule;
            # an accumulation other than 1 given too is refused by pretrain.schema.relation_problems.
            self.gradient_accumulation_steps = accumulation_for_global_batch(
                self.global_batch_size, self.per_device_train_batch_size, self
            )
        super().__post_init__()

    def to_sanitized_dict(self) -> dict:
        """The hyperparameters VisualDL records, with booleans as 0/1.

        visualdl 2.5.3 stores a bool in an int protobuf field, which protobuf >= 7 rejects
        (TypeError at train begin with ``report_to visualdl``); PaddleFormers works around it the
        same way (PaddlePaddle/PaddleFormers#4013). paddlenlp calls this only for VisualDL's hparams.
        """
        return {
            key: int(value) if isinstance(value, bool) else value for key, value in super().to_sanitized_dict().items()
        }


ARGUMENT_CLASSES = (ModelArguments, DataArguments, PreTrainingArguments)


class _Parser(PdArgumentParser):
    """PdArgumentParser whose errors are UserError instead of SystemExit with usage text."""

    def error(self, message):
        raise UserError(f"command line: {message}")

    @staticmethod
    def _parse_dataclass_field(parser, field):
        """paddlenlp's, after moving a field's ``range`` (``pretrain.schema``) into its help: paddlenlp
        passes every metadata entry to ``add_argument``."""
        if "range" in field.metadata:
            field = copy.copy(field)
            field.metadata = {**field.metadata, "help": help_with_range(field)}
            del field.metadata["range"]
        PdArgumentParser._parse_dataclass_field(parser, field)


def _refuse_duplicate_keys(path: str):
    """A ``json.load`` object hook that refuses a key given twice (json keeps the last one silently)."""

    def hook(pairs: list) -> dict:
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise UserError(f"{path}: key '{key}' is given twice; keep one of them")
            seen.add(key)
        return dict(pairs)

    return hook


def _load_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f, object_pairs_hook=_refuse_duplicate_keys(path))
    except FileNotFoundError:
        raise UserError(
            f"config file {path} does not exist; pass a JSON file such as config/llama/pretrain_demo_cpu.json"
        ) from None
    except IsADirectoryError:
        raise UserError(
            f"config file {path} is a folder; pass a JSON file such as config/llama/pretrain_demo_cpu.json"
        ) from None
    except OSError as e:
        raise UserError(f"config file {path} cannot be read ({e.strerror}); fix its permissions") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = f" at line {e.lineno} column {e.colno}: {e.msg}" if isinstance(e, json.JSONDecodeError) else f" ({e})"
        raise UserError(f"{path}: invalid JSON{where}") from None
    if not isinstance(config, dict):
        raise UserError(f"{path}: the top level must be a JSON object of key: value pairs")
    return config


def _unknown_key_message(key: str, valid: set, where: str, program: str = "run_pretrain.py") -> str:
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else f"; see `python {program} --help` for valid keys"
    return f"{where}: unknown key '{key}'{hint}"


def _check_json_value(path: str, key: str, value, action: argparse.Action) -> None:
    """Check one JSON value against the argparse action that will parse it; raise UserError if wrong."""
    takes_list = action.nargs in ("+", "*")
    if isinstance(value, list) and not takes_list:
        raise UserError(f"{path}: key '{key}' takes one value, got the list {value}")
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, dict):
            item = json.dumps(item)
        try:
            converted = action.type(str(item)) if action.type is not None else str(item)  # type: ignore[operator]
        except (TypeError, ValueError):
            type_name = getattr(action.type, "__name__", str(action.type))
            raise UserError(f"{path}: key '{key}' = {item!r} is not a valid {type_name}") from None
        if action.choices is not None and converted not in action.choices:
            raise UserError(f"{path}: key '{key}' = {item!r} must be one of {list(action.choices)}")
        problem = json_type_problem(key, item, action.type)
        if problem:
            raise UserError(f"{path}: {problem}")


def _json_to_argv(config: dict) -> list:
    argv = []
    for key, value in config.items():
        if value is None:  # null means "keep the default"
            continue
        if isinstance(value, list):
            argv.extend([f"--{key}", *[str(v) for v in value]])
        elif isinstance(value, dict):
            argv.extend([f"--{key}", json.dumps(value)])
        else:
            argv.extend([f"--{key}", str(value)])
    return argv


def expert_argument_problems(values: dict) -> list:
    """paddlenlp's mixture-of-experts keys this app cannot honour, one line each naming the key, value and fix
    (``values``: every key's parsed value, before paddlenlp's ``__post_init__``).

    - ``expert_max_capacity`` / ``expert_min_capacity`` other than paddlenlp's defaults: no paddlenlp 3.0.0b4
      model reads them (every family dispatches dropless, ``registry.Routing.dropless``), so a capacity would
      be ignored;
    - ``expert_parallel_degree`` above 1: paddlenlp's expert parallelism inside the sharding group, which
      ``TrainingArguments.__post_init__`` refuses beside data parallelism ("Currently only support use
      expert_data_parallel strategy together with sharding_parallel strategy", training_args.py:1185) and
      this app does not run; here the experts spread over the data-parallel ranks with ``use_expert_parallel``
      (``layout_rules.expert_parallel_degree``)."""
    problems = []
    defaults = {spec.name: spec.default for spec in fields(TrainingArguments)}
    for key in ("expert_max_capacity", "expert_min_capacity"):
        if key in values and values[key] != defaults[key]:
            problems.append(
                f"{key}: {values[key]} is read by no model here (paddlenlp's mixtures of experts dispatch dropless: "
                "no expert has a capacity, no token is dropped); remove it"
            )
    degree = values.get("expert_parallel_degree")
    if degree is not None and degree > 1:
        problems.append(
            f"expert_parallel_degree: {degree} is paddlenlp's expert parallelism inside the sharding group, which "
            "this app does not run; expert parallelism here is use_expert_parallel true, which spreads the experts "
            "over the data-parallel ranks (its degree is the data-parallel degree): remove expert_parallel_degree "
            "and set use_expert_parallel true"
        )
    return problems


def make_parser(classes: tuple = ARGUMENT_CLASSES) -> PdArgumentParser:
    """The parser over ``classes``: by default ModelArguments, DataArguments and PreTrainingArguments;
    each key's help ends with its range (``pretrain.schema.help_with_range``)."""
    return _Parser(classes)


def config_values(argv: list, classes: tuple = ARGUMENT_CLASSES) -> dict:
    """``{key: value}`` of ``CONFIG.json [--key value ...]``: the file's values, the command line's over them,
    every other key at its default, typed by argparse (not yet checked or resolved by paddlenlp).

    Raises:
        UserError: the file is missing or not valid JSON (``parse_arguments`` names the other problems).
    """
    return vars(make_parser(classes).parse_args(_json_to_argv(_load_json(argv[0])) + list(argv[1:])))


def parse_arguments(
    argv: list,
    classes: tuple = ARGUMENT_CLASSES,
    program: str = "run_pretrain.py",
    example_config: str = "config/llama/pretrain_demo_cpu.json",
) -> tuple:
    """Parse ``CONFIG.json [--key value ...]`` into one instance of each of ``classes``, in order
    (by default (ModelArguments, DataArguments, PreTrainingArguments)).

    ``--help`` alone prints every key with its help text and exits.

    Command-line values override the JSON file's; a key given several times on the command line
    takes its last value (logged once). Every key, in the file or on the command line, must name a
    field of one of the dataclasses. An explicit ``do_eval false`` turns evaluation off: the
    ``evaluation_strategy`` becomes ``no`` (logged), which paddlenlp would otherwise read as do_eval true.

    Args:
        classes: the argument dataclasses of the entry point (run_finetune.py passes its own tuple).
        program, example_config: the entry script and a config of it, quoted in the error messages.

    Every value is checked against its key's range and the keys' relations (``pretrain.schema``)
    before the dataclasses are built: all the problems are listed at once.

    Raises:
        UserError: the file is missing or not valid JSON, a key is unknown (the message names the
            closest valid key), a value has the wrong type (a JSON string for a boolean or a number
            included) or is not an allowed choice, a value is out of its range or contradicts
            another (``pretrain.schema``), or paddlenlp's
            TrainingArguments rejects the combination.
    """
    if argv and argv[0] in ("-h", "--help"):
        make_parser(classes).print_help()
        sys.exit(0)
    if not argv or not argv[0].endswith(".json"):
        example = f"python {program} {example_config}"
        if argv and find_model_size(argv[0]) is not None:
            raise UserError(
                f"{argv[0]} is a model name, not a JSON config file; give a config and the model as a key, e.g. "
                f"`{example} --model_name_or_path {argv[0]}`"
            )
        raise UserError(f"the first argument must be a JSON config file, e.g. `{example} --max_steps 10`")
    path, cli = argv[0], list(argv[1:])
    config = _load_json(path)
    parser = make_parser(classes)
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}

    for key, value in config.items():
        if key not in actions:
            raise UserError(_unknown_key_message(key, set(actions), path, program))
        if value is not None:
            _check_json_value(path, key, value, actions[key])
    given = set(config)
    for token in cli:
        if token.startswith("--"):
            key = token[2:].split("=", 1)[0]
            if key not in actions:
                raise UserError(_unknown_key_message(key, set(actions), "command line", program))
            given.add(key)
    argv = _json_to_argv(config) + cli
    values = vars(parser.parse_args(argv))  # checked before paddlenlp's __post_init__ acts on any value
    for key in repeated_keys(cli):  # wrapper scripts append their overrides: the last one wins, as in argparse
        logger.info(f"command line: --{key} is given more than once; the last one wins: {key} {values[key]}")
    strategy = plain(values.get("evaluation_strategy", "no"))
    if "do_eval" in given and values.get("do_eval") is False and strategy != "no":
        # paddlenlp would turn do_eval back on for any evaluation_strategy that evaluates
        logger.info(f"do_eval false: no evaluation (evaluation_strategy {strategy} -> no)")
        argv += ["--evaluation_strategy", "no"]
        values["evaluation_strategy"] = "no"
    problems = range_problems(classes, values) + relation_problems(values, given) + expert_argument_problems(values)
    raise_problems(problems, "the argument check")
    try:
        return parser.parse_args_into_dataclasses(args=argv, look_for_args_file=False)
    except (ValueError, AssertionError) as e:  # paddlenlp asserts e.g. world_size % (tp x pp) == 0
        raise UserError(f"{path}: {e}") from e
