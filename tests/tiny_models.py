"""The tiny model configs the unit tests build by hand, in one place: a 2-layer LLaMA, 4 heads."""

from paddlenlp.transformers import LlamaConfig


def tiny_llama_config(hidden_size: int = 64, vocab_size: int = 256, **overrides) -> LlamaConfig:
    """A 2-layer LLaMA ``hidden_size`` wide: 4 attention heads (and, unless overridden, 4 key/value heads), an FFN
    twice as wide, ``vocab_size`` rows, 64 positions; ``overrides``: any other LlamaConfig field."""
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    return LlamaConfig(**{**fields, **overrides})
