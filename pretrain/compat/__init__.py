"""Fixes for upstream code that breaks on the paddle this application pins, each in one module, applied
only where the affected classes are used. Each is a row of the ledger of upstream patches (``pretrain.upstream``:
the upstream file and line, the versions it was verified on, and its guard on other versions).

  moe -- paddlenlp 3.0.0b4's mixture-of-experts code (``moe_gate``, Mixtral) on paddle >= 3.1.
  gpt -- paddlenlp 3.0.0b4's GPT tensor-parallel mapping, which lacks the LM head tied to the embedding.
  deepseek_attention -- paddlenlp 3.0.0b4's DeepSeek-V2/V3 attention under tensor parallelism, whose shared
      rotary key's gradient covers only each rank's heads.
  rope_tables -- paddlenlp 3.0.0b4's rotary embeddings, whose cos/sin tables in every layer cover all of
      max_position_embeddings where a run reads its sequence length's rows.
  weight_init -- paddlenlp 3.0.0b4's initialisers of DeepSeek-V2/V3 (none) and QWen v1 (tensor-parallel slices
      only), whose models built from scratch are drawn again.
"""
