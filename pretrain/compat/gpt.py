"""paddlenlp 3.0.0b4's GPT tensor-parallel mapping lacks the tied LM head; ``apply()`` adds it.

``GPTForCausalLM`` (paddlenlp/transformers/gpt/modeling.py line 1517) builds its ``GPTLMHead`` on the
word embedding's own parameter, which tensor parallelism splits by vocabulary rows
(``VocabParallelEmbedding``), so the model's state dict holds that one [vocab / tp, hidden] parameter
under two names: ``gpt.embeddings.word_embeddings.weight`` and ``lm_head.weight``.
``GPTPretrainedModel._get_tensor_parallel_mappings`` (line 840) gives a split/merge action to the first
name only. Measured under TP2 (tests/test_parallel_layouts.py, docs/gpu.md):

- loading merged single-model weights (``from_pretrained``: a continued run, a resume on another
  layout) splits the embedding but hands the whole [vocab, hidden] ``lm_head.weight`` to the
  [vocab / 2, hidden] parameter: "receives a shape [8064, 256], but the expected shape is [4032, 256]";
- a unified checkpoint saved by a TP run merges the embedding but stores ``lm_head.weight`` (and its
  Adam moments, which are saved under that name) as rank 0's half, and a resume loads that half into
  the shared parameter: the resumed run computes with a wrong embedding (the GPT-3 recipe's TP2 x
  sharding stage2 rehearsal resumed off the uninterrupted run, docs/gpu.md).

paddlenlp's Qwen2, the same tie, maps ``lm_head.weight`` as its embedding (qwen2/modeling.py line 928).
The fix does that for GPT: ``lm_head.weight`` gets ``word_embeddings.weight``'s action (rows,
``is_column=False``); a state dict without the name (the pipeline model's) is unaffected (paddlenlp
skips mapping names it does not find). Installed through the GPT record's ``Implementation.compat``
(``pretrain.families.gpt``) before anything reads the mapping: where the model is built
(``pretrain.model.build_model``: loading, then unified-checkpoint save and resume in the same process) and
where weights are converted (``pretrain.hf_export``'s merge of per-rank files, ``pretrain.hf_import``'s split
for a rank); importing a module installs nothing. To paddlenlp 3.0.0b4 only (``upstream.PADDLENLP_VERSION``): another
release is left unpatched with a warning.
"""

from __future__ import annotations

from paddlenlp.transformers.gpt.modeling import GPTPretrainedModel

from pretrain.upstream import verified

_UPSTREAM = GPTPretrainedModel._get_tensor_parallel_mappings.__func__  # the classmethod's function


def _get_tensor_parallel_mappings(cls, config, is_split: bool = True) -> dict:
    """paddlenlp's ``{name suffix: split or merge action}`` of GPT, plus ``lm_head.weight`` with the
    embedding's action (the tied head is the embedding's parameter)."""
    mappings = _UPSTREAM(cls, config, is_split=is_split)
    mappings.setdefault("lm_head.weight", mappings["word_embeddings.weight"])
    return mappings


def apply() -> None:
    """Give ``GPTPretrainedModel`` (and so GPTForCausalLM and GPTForCausalLMPipe) the fixed mapping;
    idempotent. Another paddlenlp than 3.0.0b4: left unpatched, with a warning."""
    if not verified("gpt-tied-head-mapping"):
        return
    GPTPretrainedModel._get_tensor_parallel_mappings = classmethod(_get_tensor_parallel_mappings)
