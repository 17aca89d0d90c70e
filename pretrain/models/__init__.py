"""Model code paddlenlp 3.0.0b4 lacks, written in its style on its own classes, one module per model type.

Each module subclasses paddlenlp's nearest model and keeps its weight names, so paddlenlp's checkpoint,
tensor-parallel and Hugging Face name mappings apply; ``pretrain.families`` names the classes.

  qwen3 -- Qwen3 (dense), ``model_type`` "qwen3": paddlenlp's Qwen2 with per-head q/k RMSNorm, an explicit
           head_dim and no q/k/v bias.
  qwen3_moe -- Qwen3-MoE, ``model_type`` "qwen3_moe": paddlenlp's Qwen2-MoE on Qwen3's attention, without the
               shared expert, top-k weights renormalised, dense layers by mlp_only_layers / decoder_sparse_step.
"""
