"""Model code paddlenlp 3.0.0b4 lacks, written in its style on its own classes, one module per model type.

Each module subclasses paddlenlp's nearest model and keeps its weight names, so paddlenlp's checkpoint,
tensor-parallel and Hugging Face name mappings apply; ``pretrain.families`` names the classes.

  qwen2_head_dim -- paddlenlp's Qwen2 at an explicit head_dim without q/k/v bias, with hooks on the attention
           projections' outputs: the base of qwen3 and ernie4_5 (and of qwen3_moe's attention, qwen3's).
  qwen3 -- Qwen3 (dense), ``model_type`` "qwen3": paddlenlp's Qwen2 with per-head q/k RMSNorm, an explicit
           head_dim and no q/k/v bias.
  qwen3_moe -- Qwen3-MoE, ``model_type`` "qwen3_moe": paddlenlp's Qwen2-MoE on Qwen3's attention, without the
               shared expert, top-k weights renormalised, dense layers by mlp_only_layers / decoder_sparse_step.
  ernie4_5 -- ERNIE-4.5 (dense), ``model_type`` "ernie4_5": paddlenlp's Qwen2 at head_dim, no bias, with q and k
           heads reordered so paddlenlp's half-rotation RoPE computes ERNIE's interleaved-pair RoPE.
  ernie4_5_moe -- ERNIE-4.5 MoE, ``model_type`` "ernie4_5_moe": ERNIE-4.5's decoder with paddlenlp's DeepSeek-V2
           MoE block (softmax scores, noaux_tc with one group: a per-expert bias chooses, renormalised weights,
           shared experts) where moe_layer_start_index / end_index / interval place experts.
"""
