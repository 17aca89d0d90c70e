"""Model FLOPs per token and model FLOPs utilization (MFU), in two forms.

PaLM form: Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways", Appendix B.
A decoder with N non-embedding parameters, L layers, H heads of dimension Q, trained on
sequences of T tokens, costs per token

    6 * N              forward (2N) + backward (4N) of every weight matmul
  + 12 * L * H * Q * T attention scores and weighted sum: 2 matmuls of [T, Q] x [Q, T] per head
                       and layer, 2 FLOPs per multiply-add, x3 for forward + backward,
                       counted without the causal mask's savings (as PaLM does), and
                       likewise without a document mask's (``reset_attention_mask``): the
                       dense path computes every score and masks it, so its FLOPs are these;
                       FlashMask skips masked blocks, but MFU still counts the full T, so runs
                       stay comparable whatever their documents' lengths

What N holds (``flops_parameters``): every parameter except the input embedding tables (token
and learned positions), plus the output projection. The input embeddings are row lookups and
cost no FLOPs; the output projection (``lm_head``) is a real [hidden] x [hidden, vocab] matmul
per token, whether its own weight (LLaMA) or the embedding's (tied: GPT, small Qwen2), and is
counted, as in nanoGPT's ``estimate_mfu`` (tied embedding counted once) and Megatron-LM's
FLOPs formula (its logit term 6·V·h per token). For LLaMA-7B that is N = 6,607,343,616 (the
131M-parameter lm_head included). N is the full model's, counted from the config
(``pretrain.param_count``), so it is the same on every tensor- or pipeline-parallel rank.

Mixture of experts: N counts the activated parameters, those one token's matmuls use: the router,
its top-k routed experts and the shared experts (``count_config_parameters(..., activated=True)``).
The experts a token is not routed to cost it nothing. This is Megatron-LM's basis
(``megatron/training/training.py``, ``num_floating_point_operations``: its ``moe_layer_flops`` counts
the top-k routed expert MLPs and the shared expert per token; the router's [hidden, experts] matmul,
which it leaves out, is counted here, 6·d·E per token and layer, under 0.1% for the published sizes),
and what the releases' "activated parameters" (Qwen1.5-MoE-A2.7B, Mixtral's "12.9B per token") measure.
Dispatch and combine (gathers, scatters, the all-to-all) are not matmuls and
are not counted. For Mixtral-8x7B N = 12.75B (12.88B activated, less the 131M input embedding).

Multi-head latent attention (DeepSeek-V2): the scores multiply queries and keys of the query/key head
width d_qk = qk_nope_head_dim + qk_rope_head_dim (192 in DeepSeek-V2) and weigh values of v_head_dim d_v (128),
so the attention term is 6 * L * H * (d_qk + d_v) * T, which is 12 * L * H * Q * T with Q the mean
(d_qk + d_v) / 2 (``model_flops_per_token`` passes that Q; for every other model d_qk = d_v = hidden / H).
Megatron-LM counts MLA's core attention the same way (``num_floating_point_operations``: its
``qk_head_dim + qk_pos_emb_head_dim + v_head_dim`` term). MLA's projections (q, the low-rank kv_a and kv_b, o)
are weight matmuls, in N.

Multi-token prediction (DeepSeek-V3, ``pretrain.mtp``): each of the D modules is one more layer per token (its
weights, with its eh_proj, in N; its attention in the 12 * L * H * Q * T term, L = layers + D) and one more pass
of the shared output head (V x d more in N per module). The tokens are still the main model's: a sample's D extra
tokens feed only the modules' embeddings. DeepSeek-V3 (D = 1): N = 38.24B, of which 0.69B are the
module's layer and 0.93B its head pass.

Nominal form: 6 x the nominal parameter count of the model's name, the one benchmark tables
quote; FlagPerf's Llama-2-7B case uses 7e9: MFU = tokens/card/s x 6 x 7e9 / 312e12.

Frozen weights (adapter fine-tuning, e.g. LoRA): a frozen weight matmul still costs its forward
(2 FLOPs per parameter and token) and the gradient of its input (2), but no weight gradient (the
other 2). So per token

    4 * N + 6 * A + 12 * L * H * Q * T     N frozen (non-embedding) parameters, A adapter parameters

and the nominal form is 4 x the nominal count: FlagPerf's Llama-2-7B LoRA case
(training/nvidia/llama2_7b_finetune-pytorch/README.md) counts 4 x 7e9 FLOPs per token, so 4017
tokens/s on an A100 (312e12 FLOP/s) is MFU 36.1%.

MFU = achieved tokens/s per card x FLOPs per token / peak dense FLOP/s per card.
Recomputation is not counted (that would be hardware FLOPs utilization, HFU).

Credibility: the model cannot run faster than the card's peak, so an MFU above ``MFU_CREDIBLE_MAX``
(1.0) means the peak is wrong (a ``peak_flops_per_card`` set too low; a peak measured on a busy
machine was one, which is why MFU now divides by datasheet or physical peaks only), not that the
run is fast. Such a value is never reported: ``mfu_or_none`` gives None and
``mfu_null_reason`` says why.
"""

from __future__ import annotations

from typing import Optional

from paddlenlp.transformers import PretrainedConfig

from pretrain.param_count import count_shape_parameters, decoder_shape

MFU_CREDIBLE_MAX = 1.0  # an MFU above this is a wrong peak FLOP/s, never a result


def flops_per_token(
    num_non_embedding_params: int, num_layers: int, num_heads: int, head_dim: float, seq_len: int
) -> float:
    """Training FLOPs per token, PaLM Appendix B: 6N + 12·L·H·Q·T.

    Args:
        num_non_embedding_params: N, parameters excluding the input embedding table
            (the output projection is a real matmul and is counted).
        num_layers: L, transformer layers.
        num_heads: H, attention (query) heads.
        head_dim: Q, elements per head (hidden_size / H).
        seq_len: T, tokens per training sequence.

    Returns:
        FLOPs per token (float).
    """
    return 6.0 * num_non_embedding_params + 12.0 * num_layers * num_heads * head_dim * seq_len


def flops_parameters(model_config: PretrainedConfig) -> int:
    """N of the PaLM formula for the full model ``model_config`` describes (see the module docstring).

    = all parameters (mixture of experts: activated ones) - token embedding - learned position table + the
    output projection when it is tied to the token embedding + one more output projection per multi-token-prediction
    module, which passes its hidden states through the shared head (elements).

    Raises:
        UserError: the config's model_type is not supported by pretrain.param_count.
    """
    shape = decoder_shape(model_config)
    total, token_embedding = count_shape_parameters(shape, activated=True)
    head = shape.vocab_size * shape.hidden_size
    output_projection = (head if shape.tie_word_embeddings else 0) + shape.prediction_layers * head
    return total - token_embedding - shape.position_rows * shape.hidden_size + output_projection


def frozen_weight_flops_per_token(
    num_frozen_params: int, num_adapter_params: int, num_layers: int, num_heads: int, head_dim: float, seq_len: int
) -> float:
    """Training FLOPs per token with frozen weights and a trained adapter: 4N + 6A + 12·L·H·Q·T.

    Args:
        num_frozen_params: N, frozen parameters excluding the input embedding table (as in ``flops_per_token``).
        num_adapter_params: A, trained adapter parameters (LoRA's A and B matrices), every one in a matmul.
        num_layers, num_heads, head_dim, seq_len: L, H, Q, T as in ``flops_per_token``.

    Returns:
        FLOPs per token (float): the PaLM form less the 2N weight-gradient FLOPs of the frozen weights.
    """
    attention = 12.0 * num_layers * num_heads * head_dim * seq_len
    return 4.0 * num_frozen_params + 6.0 * num_adapter_params + attention


def model_flops_per_token(model_config: PretrainedConfig, seq_len: int, adapter_params: Optional[int] = None) -> float:
    """Training FLOPs per token of a paddlenlp decoder config trained on ``seq_len``-token samples.

    Args:
        adapter_params: None: every weight is trained (PaLM form, ``flops_per_token``); else the base
            weights are frozen and this many adapter parameters are trained (``frozen_weight_flops_per_token``).
    """
    decoder = decoder_shape(model_config)
    # the mean of the query/key and value head widths: DeepSeek's MLA (module docstring); Qwen3's head_dim,
    # which hidden_size / heads is not (Qwen3-0.6B: 128, not 1024 / 16); hidden_size / heads elsewhere
    head_dim = (decoder.query_size + decoder.value_size) / (2 * model_config.num_attention_heads)
    layers = model_config.num_hidden_layers + decoder.prediction_layers  # each MTP module attends once more
    shape = (layers, model_config.num_attention_heads, head_dim, seq_len)
    if adapter_params is None:
        return flops_per_token(flops_parameters(model_config), *shape)
    return frozen_weight_flops_per_token(flops_parameters(model_config), adapter_params, *shape)


def nominal_flops_per_token(nominal_params: float, frozen_weights: bool = False) -> float:
    """Training FLOPs per token of the nominal form: 6 x nominal parameters (e.g. 7e9 for Llama-2-7B),
    or 4 x with ``frozen_weights`` (adapter fine-tuning: no weight gradients; FlagPerf's LoRA case)."""
    return (4.0 if frozen_weights else 6.0) * nominal_params


def mfu(tokens_per_card_per_sec: float, flops_per_token_value: float, peak_flops_per_card: float) -> float:
    """Model FLOPs utilization as a fraction in [0, 1]: achieved model FLOP/s per card / peak FLOP/s.

    Raises:
        ValueError: peak_flops_per_card is not positive.
    """
    if peak_flops_per_card <= 0:
        raise ValueError(f"peak_flops_per_card must be positive, got {peak_flops_per_card}")
    return tokens_per_card_per_sec * flops_per_token_value / peak_flops_per_card


def mfu_or_none(
    tokens_per_card_per_sec: Optional[float],
    flops_per_token_value: Optional[float],
    peak_flops_per_card: Optional[float],
) -> Optional[float]:
    """``mfu(...)``, or None when any input is unknown (no measured rate, no nominal size, no peak) or the
    result is not credible (above ``MFU_CREDIBLE_MAX``: see ``mfu_null_reason``)."""
    if tokens_per_card_per_sec is None or not flops_per_token_value or not peak_flops_per_card:
        return None
    value = mfu(tokens_per_card_per_sec, flops_per_token_value, peak_flops_per_card)
    return value if value <= MFU_CREDIBLE_MAX else None


def mfu_null_reason(
    tokens_per_card_per_sec: Optional[float],
    flops_per_token_value: Optional[float],
    peak_flops_per_card: Optional[float],
    peak_source: Optional[str] = None,
) -> Optional[str]:
    """Why ``mfu_or_none`` gives None for these inputs, in one sentence; None when it gives a value."""
    if not flops_per_token_value:
        return "no FLOPs per token (for mfu_nominal: set nominal_params)"
    if not peak_flops_per_card:
        return "no peak FLOP/s per card (a GPU without a datasheet entry, or no /proc/cpuinfo): set peak_flops_per_card"
    if tokens_per_card_per_sec is None:
        return "no step was timed after the throughput warm-up steps"
    value = mfu(tokens_per_card_per_sec, flops_per_token_value, peak_flops_per_card)
    if value <= MFU_CREDIBLE_MAX:
        return None
    return (
        f"not credible: the run's model FLOP/s are {value:.2f}x the peak of {peak_flops_per_card / 1e12:.3g} "
        f"TFLOP/s per card ({peak_source or 'source unknown'}), so that peak is too low; "
        "set peak_flops_per_card to the card's dense peak"
    )
