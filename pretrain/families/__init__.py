"""Every model family as data, one module per paddlenlp ``model_type``; ``pretrain.registry`` is their lookup face.

Each family module defines ``IMPLEMENTATION`` (its ``records.Implementation``), ``FAMILIES`` (the published
families on it, ``records.Family``), ``MODEL_SIZES`` (their named sizes, ``records.ModelSize``, a
``<family>-debug`` size each) and ``PUBLISHED`` (their tokenizers, ``records.PublishedTokenizer``). Adding a
model type is one new module here and its name in ``MODULES`` (docs/models.md, "Adding a model family").

  records     -- the record types: Implementation, DecoderShape, LatentAttention, Routing, HFFormat, Family, ...
  common      -- what several family modules share: the LLaMA-style decoder's shape and config checks.
  llama       -- ``llama``: LLaMA 1 to 3, Baichuan, Mistral.
  qwen        -- ``qwen``: Qwen (v1).
  qwen2       -- ``qwen2``: Qwen2.
  qwen3       -- ``qwen3``: Qwen3 (dense), on pretrain.models.qwen3.
  gpt         -- ``gpt``: GPT-3.
  qwen2_moe   -- ``qwen2_moe``: Qwen1.5-MoE, Qwen2-MoE.
  qwen3_moe   -- ``qwen3_moe``: Qwen3-MoE, on pretrain.models.qwen3_moe.
  mixtral     -- ``mixtral``: Mixtral.
  deepseek_v2 -- ``deepseek_v2``: DeepSeek-V2, DeepSeek-V2-Lite.
  deepseek_v3 -- ``deepseek_v3``: DeepSeek-V3.
  ernie4_5    -- ``ernie4_5``: ERNIE-4.5 (dense), on pretrain.models.ernie4_5.
  ernie4_5_moe -- ``ernie4_5_moe``: ERNIE-4.5 MoE (21B-A3B, 300B-A47B), on pretrain.models.ernie4_5_moe.
"""

from pretrain.families import (
    deepseek_v2,
    deepseek_v3,
    ernie4_5,
    ernie4_5_moe,
    gpt,
    llama,
    mixtral,
    qwen,
    qwen2,
    qwen2_moe,
    qwen3,
    qwen3_moe,
)

# The family modules, in the order the registry lists their families and sizes.
MODULES = (
    llama,
    qwen,
    qwen2,
    qwen3,
    gpt,
    qwen2_moe,
    qwen3_moe,
    mixtral,
    deepseek_v2,
    deepseek_v3,
    ernie4_5,
    ernie4_5_moe,
)
