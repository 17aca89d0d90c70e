"""Document-aware packing: positions, attention and loss that respect the documents inside a sample.

A pretraining sample is ``max_seq_length + 1`` consecutive tokens of the concatenated corpus, so
it usually holds the end of one document, its EOS, and the start of the next. By default every
token attends to every earlier token of the sample and positions run on across the EOS. The three
opt-in keys of ``DataArguments`` change that, as Megatron-LM's ``get_ltor_masks_and_position_ids``
does (``--reset-position-ids``, ``--reset-attention-mask``, ``--eod-mask-loss``):

- ``reset_position_ids``: positions restart at 0 after each EOS;
- ``reset_attention_mask``: a token attends only to earlier tokens of its own document
  (block-diagonal causal attention), so a document's logits do not depend on what precedes it;
- ``eod_mask_loss``: the prediction made at an EOS (the next document's first token, which nothing
  in the document can predict) is left out of the loss (its label becomes ``IGNORE_INDEX``).

An EOS belongs to the document it ends. The attention mask reaches the model in one of two forms
(``MASK_FORMS``), chosen by ``mask_form``:

- ``dense``: ``attention_mask`` bool ``[batch, 1, seq, seq]``; paddlenlp's LLaMA, Qwen2, GPT,
  Qwen2-MoE and Mixtral add it (as 0 / dtype-min) to the attention scores of their eager attention. The scores are
  ``[batch, heads, seq, seq]`` anyway there, so the FLOPs are unchanged; the mask costs
  ``batch x seq^2`` bytes, and paddlenlp turns it into a float mask of the compute dtype.
- ``flashmask``: ``attn_mask_startend_row_indices`` int32 ``[batch, 1, seq]``, paddlenlp's
  FlashMask input for LLaMA, Qwen2 and Qwen2-MoE under ``use_flash_attention`` (``fusion_ops.fusion_flash_attention``
  passes it to ``paddle.nn.functional.flashmask_attention`` with ``causal=True``): for each key
  column, the first query row that may not see it, i.e. the end (exclusive) of the column's
  document. Masked blocks are skipped; memory is O(seq).

Which model types honour which form is ``pretrain.registry.Implementation.document_mask_forms``.
A mixture of experts (Qwen2-MoE, Mixtral) routes each token on its own hidden state and dispatches
dropless (no capacity shared between tokens), so a document's logits and its language-model loss do
not depend on the other documents of the sample either; the load-balancing loss
(``pretrain.routing``) is, by its definition, a statistic of all the batch's tokens together.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pretrain.corpus import current_stats
from pretrain.data import collate_causal_lm
from pretrain.errors import UserError
from pretrain.registry import implementation_for

IGNORE_INDEX = -100  # the label paddlenlp's pretraining criteria leave out of the loss (ignore_index)
MASK_FORMS = ("dense", "flashmask")
DOCUMENT_KEYS = ("reset_position_ids", "reset_attention_mask", "eod_mask_loss")  # DataArguments


def document_ids(input_ids: np.ndarray, eos_id: int) -> np.ndarray:
    """The document each position belongs to: the number of EOS tokens strictly before it.

    Args:
        input_ids: int ``[batch, seq]``.
    Returns:
        int64 ``[batch, seq]``, 0 for the first (partial) document of each row.
    """
    is_eos = (input_ids == eos_id).astype(np.int64)
    return np.cumsum(is_eos, axis=1) - is_eos


def restarted_positions(documents: np.ndarray) -> np.ndarray:
    """int64 ``[batch, seq]`` position ids that restart at 0 where ``documents`` (``document_ids``) changes."""
    seq = documents.shape[1]
    index = np.broadcast_to(np.arange(seq, dtype=np.int64), documents.shape)
    starts = np.concatenate([np.ones_like(documents[:, :1], dtype=bool), documents[:, 1:] != documents[:, :-1]], 1)
    first_of_document = np.maximum.accumulate(np.where(starts, index, 0), axis=1)
    return index - first_of_document


def dense_mask(documents: np.ndarray) -> np.ndarray:
    """bool ``[batch, 1, seq, seq]``: query row i may attend key column j (j <= i, same document)."""
    seq = documents.shape[1]
    same = documents[:, :, None] == documents[:, None, :]
    return (same & np.tril(np.ones((seq, seq), dtype=bool)))[:, None]


def startend_row_indices(documents: np.ndarray) -> np.ndarray:
    """int32 ``[batch, 1, seq]`` FlashMask lower-triangle start rows: for key column j, the end
    (exclusive) of j's document; rows from there on may not attend to j."""
    batch, seq = documents.shape
    ends = np.empty((batch, seq), dtype=np.int32)
    for row in range(batch):
        # documents[row] is non-decreasing: the end of document d is where d + 1 would be inserted
        ends[row] = np.searchsorted(documents[row], documents[row], side="right")
    return ends[:, None, :]


@dataclass(frozen=True)
class DocumentCollator:
    """``pretrain.data.collate_causal_lm`` plus the document-aware keys a run asked for.

    Args:
        eos_id: the tokenizer's EOS id (the one preprocessing appended to every document).
        reset_position_ids, reset_attention_mask, eod_mask_loss: the ``DataArguments`` keys.
        mask_form: one of ``MASK_FORMS`` (used with reset_attention_mask).
    """

    eos_id: int
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False
    mask_form: str = "dense"

    def __call__(self, samples: list) -> dict:
        """``collate_causal_lm(samples)`` plus, as asked, ``position_ids`` int64 ``[batch, seq]``,
        ``attention_mask`` bool ``[batch, 1, seq, seq]`` or ``attn_mask_startend_row_indices`` int32
        ``[batch, 1, seq]``, and labels ``IGNORE_INDEX`` where the input is EOS."""
        batch = collate_causal_lm(samples)
        input_ids = batch["input_ids"]
        documents = document_ids(input_ids, self.eos_id)
        if self.reset_position_ids:
            batch["position_ids"] = restarted_positions(documents)
        if self.reset_attention_mask:
            if self.mask_form == "flashmask":
                batch["attn_mask_startend_row_indices"] = startend_row_indices(documents)
            else:
                batch["attention_mask"] = dense_mask(documents)
        if self.eod_mask_loss:
            batch["labels"] = np.where(input_ids == self.eos_id, IGNORE_INDEX, batch["labels"])
        return batch


def document_masking(data_args) -> bool:
    """Whether any of the three document-aware keys is on (fine-tuning's data arguments have none)."""
    return any(getattr(data_args, key, False) for key in DOCUMENT_KEYS)


def mask_form(use_flash_attention: bool) -> str:
    """The attention mask form a run uses: FlashMask under flash attention, else dense."""
    return "flashmask" if use_flash_attention else "dense"


def collator(plan):
    """The data collator of a ``RunPlan``: ``collate_causal_lm``, or a ``DocumentCollator`` when a
    document-aware key is on (check the plan with ``document_masking_problems`` first)."""
    data_args = plan.data_args
    if not document_masking(data_args):
        return collate_causal_lm
    return DocumentCollator(
        eos_id=plan.tokenizer.eos_token_id,
        reset_position_ids=data_args.reset_position_ids,
        reset_attention_mask=data_args.reset_attention_mask,
        eod_mask_loss=data_args.eod_mask_loss,
        mask_form=mask_form(plan.training_args.use_flash_attention),
    )


def _eos_problems(sources: list, eos_id: int, keys: str) -> list:
    """Sources whose current stats sidecar says their documents end with no EOS (written with
    ``--append_eos false``): nothing to find documents by. (Another EOS id is the preflight's
    tokenizer agreement check; a source without a current sidecar is not checked.)"""
    problems = []
    for source in sources:
        try:
            stats = current_stats(source.prefix)
        except UserError:
            continue  # the data checks report an unreadable sidecar
        if stats is not None and "eos_token_id" in stats and stats["eos_token_id"] is None:
            problems.append(
                f"{keys}: {source.prefix}.stats.json says its documents end with no EOS, so documents cannot be "
                f"told apart; re-run create_pretraining_data.py with --append_eos (this tokenizer's EOS is "
                f"{eos_id}), or turn these keys off"
            )
    return problems


def describe(data_args, use_flash_attention: bool) -> str:
    """What the document-aware keys do in this run, for the header ("" when none is on)."""
    parts = []
    if data_args.reset_position_ids:
        parts.append("positions restart at each EOS")
    if data_args.reset_attention_mask:
        parts.append(f"attention within each document ({mask_form(use_flash_attention)} mask)")
    if data_args.eod_mask_loss:
        parts.append("no loss on the token after EOS")
    return "documents: " + ", ".join(parts) if parts else ""


def document_masking_problems(plan) -> list:
    """Why a ``RunPlan`` cannot honour its document-aware keys, one line each (empty when it can or
    none is on): no EOS id, data whose documents are not ended by it, a model type or kernel that ignores the mask
    (``Implementation.document_mask_forms``), ALiBi, or pipeline/sep/context parallelism."""
    data_args, config, layout = plan.data_args, plan.model_config, plan.layout
    if not document_masking(data_args):
        return []
    keys = "reset_position_ids/reset_attention_mask/eod_mask_loss"
    problems = []
    if plan.tokenizer is not None and plan.tokenizer.eos_token_id is None:
        problems.append(
            f"{keys}: the tokenizer has no EOS id to find documents by; set eos_token in its "
            "tokenizer_config.json (the one preprocessing appended) or turn these keys off"
        )
    if plan.tokenizer is not None and plan.tokenizer.eos_token_id is not None:
        problems += _eos_problems(plan.data, plan.tokenizer.eos_token_id, keys)
    implementation = implementation_for(config.model_type) if config is not None else None
    if implementation is not None and not implementation.document_mask_forms:
        problems.append(
            f"{keys}: paddlenlp's {implementation.model_type} model takes no per-document positions "
            "or mask; use a llama, qwen2, gpt3, qwen2_moe or mixtral model, or turn these keys off"
        )
    elif implementation is not None and data_args.reset_attention_mask:
        if mask_form(plan.training_args.use_flash_attention) not in implementation.document_mask_forms:
            problems.append(
                f"reset_attention_mask: paddlenlp's {implementation.model_type} takes no FlashMask "
                "(attn_mask_startend_row_indices), the mask form used under flash attention; set "
                "use_flash_attention false (dense mask) or reset_attention_mask false"
            )
    if data_args.reset_attention_mask and getattr(config, "alibi", False):
        problems.append(
            "reset_attention_mask: paddlenlp builds ALiBi biases from a 2-D padding mask, not a "
            "per-document one; turn reset_attention_mask off for ALiBi models (Baichuan-13B)"
        )
    if max(layout.pipeline_parallel_degree, layout.sep_parallel_degree, layout.context_parallel_degree) > 1:
        problems.append(
            f"{keys}: not wired through pipeline, sep or context parallelism here; use "
            "pipeline_parallel_degree 1 (and no sep/context parallelism) or turn these keys off"
        )
    return problems
