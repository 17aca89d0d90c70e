"""Greedy generation with paddlenlp's ``model.generate``, around a pitfall of paddlenlp 3.0.0b4.

The pitfall: ``model.generate(input_ids=ids)`` without ``attention_mask`` fails for LLaMA-style
models. ``GenerationMixin.generate`` then makes its own mask with
``prepare_attention_mask_for_generation``: an *additive* float mask of shape [batch, 1, 1, seq]
(0 = attend), which LLaMA's forward takes for a 4-D *boolean* keep-mask. With the default
``USE_CASUAL_MASK=False`` the first forward fails (``ReshapeOp``: X's size 4 vs shape [1, 1, 4, 4]
for a 4-token prompt); with ``USE_CASUAL_MASK=True`` the first step runs but the second fails when
``update_model_kwargs_for_generation`` concatenates a [batch, 1] column of ones to that 4-D mask.

The workaround: always pass the tokenizer's 2-D ``attention_mask`` ([batch, seq], 1 = token) with
``input_ids``; LLaMA combines it with its causal mask and ``update_model_kwargs_for_generation``
extends it by one column per generated token. ``generate`` returns ``(ids, scores)`` where ``ids``
holds only the generated tokens, not the prompt. ``generation_config.json`` as saved by a
pretraining run says ``use_cache: false``, so ``use_cache=True`` is passed too (each step then
runs on the new token only).
"""

from __future__ import annotations

import paddle


@paddle.no_grad()
def generate_greedy(model, tokenizer, prompt: str, max_new_tokens: int) -> list:
    """The token ids greedy decoding appends to ``prompt`` (prompt excluded), up to and without ``eos``."""
    encoded = tokenizer(prompt, return_tensors="pd")
    ids, _ = model.generate(
        input_ids=encoded["input_ids"],
        attention_mask=encoded["attention_mask"],  # the workaround: see the module docstring
        max_new_tokens=max_new_tokens,
        decode_strategy="greedy_search",
        eos_token_id=tokenizer.eos_token_id,
        use_cache=True,
    )
    generated = ids[0].numpy().tolist()
    return generated[: generated.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in generated else generated


def generate_text(model, tokenizer, prompt: str, max_new_tokens: int) -> str:
    """``generate_greedy`` decoded to text (special tokens dropped)."""
    model.eval()
    return tokenizer.decode(generate_greedy(model, tokenizer, prompt, max_new_tokens), skip_special_tokens=True)
