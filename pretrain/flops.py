"""Model FLOPs per token and model FLOPs utilization (MFU).

Definition: PaLM, Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways",
Appendix B. A decoder with N non-embedding parameters, L layers, H heads of dimension Q,
trained on sequences of T tokens, costs per token

    6 * N              forward (2N) + backward (4N) of every weight matmul
  + 12 * L * H * Q * T attention scores and weighted sum: 2 matmuls of [T, Q] x [Q, T] per head
                       and layer, 2 FLOPs per multiply-add, x3 for forward + backward,
                       counted without the causal mask's savings (as PaLM does)

MFU = achieved tokens/s per card * FLOPs per token / peak dense FLOP/s per card.
Recomputation is not counted (that would be hardware FLOPs utilization, HFU).
"""


def flops_per_token(num_non_embedding_params: int, num_layers: int, num_heads: int, head_dim: int,
                    seq_len: int) -> float:
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


def mfu(tokens_per_card_per_sec: float, flops_per_token_value: float, peak_flops_per_card: float) -> float:
    """Model FLOPs utilization as a fraction in [0, 1]: achieved model FLOP/s per card / peak FLOP/s.

    Raises:
        ValueError: peak_flops_per_card is not positive.
    """
    if peak_flops_per_card <= 0:
        raise ValueError(f"peak_flops_per_card must be positive, got {peak_flops_per_card}")
    return tokens_per_card_per_sec * flops_per_token_value / peak_flops_per_card
