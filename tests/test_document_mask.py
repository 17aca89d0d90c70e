"""Document-aware packing (pretrain.document_mask): positions, masks and loss per document, proven on
the llama, qwen2, gpt3, qwen2_moe and mixtral debug models: a document's logits and gradients (of the
language-model loss) do not depend on what was packed before it."""

import os

import numpy as np
import paddle
import pytest
from conftest import REPO, load_script, resolve_plan

from pretrain.compat import moe as moe_compat
from pretrain.document_mask import (
    IGNORE_INDEX,
    DocumentCollator,
    dense_mask,
    document_ids,
    document_masking_problems,
    restarted_positions,
    startend_row_indices,
)
from pretrain.registry import find_model_size

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

EOS = 2
FAMILIES = (
    "llama-debug",
    "qwen2-debug",
    "qwen3-debug",
    "gpt3-debug",
    "qwen2_moe-debug",
    "qwen3_moe-debug",
    "mixtral-debug",
    "ernie-4.5-moe-debug",
)


def test_positions_restart_after_each_eos():
    tokens = np.array([[5, 6, EOS, 7, 8, 9, EOS, EOS, 4]])
    assert document_ids(tokens, EOS).tolist() == [[0, 0, 0, 1, 1, 1, 1, 2, 3]]
    assert restarted_positions(document_ids(tokens, EOS)).tolist() == [[0, 1, 2, 0, 1, 2, 3, 0, 0]]


def test_dense_mask_is_block_diagonal_causal_and_flashmask_says_the_same():
    tokens = np.array([[5, EOS, 7, 8, EOS, 9], [5, 6, 7, 8, 9, 10]])
    documents = document_ids(tokens, EOS)
    mask = dense_mask(documents)  # [batch, 1, seq, seq]
    assert mask.shape == (2, 1, 6, 6)
    assert mask[0, 0].astype(int).tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]
    assert (mask[1, 0] == np.tril(np.ones((6, 6), dtype=bool))).all()  # one document: plain causal
    # FlashMask (causal): column j is hidden from rows >= its start row; the same mask in O(seq).
    rows = startend_row_indices(documents)
    assert rows.dtype == np.int32 and rows.shape == (2, 1, 6)
    assert rows[0, 0].tolist() == [2, 2, 5, 5, 5, 6]
    row_index = np.arange(6)[:, None]
    from_rows = (row_index < rows[:, 0][:, None, :]) & np.tril(np.ones((6, 6), dtype=bool))
    assert (from_rows == mask[:, 0]).all()


def test_eod_mask_loss_ignores_the_prediction_made_at_eos():
    samples = [{"text": np.array([5, 6, EOS, 7, 8, EOS, 9])}]
    batch = DocumentCollator(EOS, eod_mask_loss=True)(samples)
    assert batch["labels"].tolist() == [[6, EOS, IGNORE_INDEX, 8, EOS, IGNORE_INDEX]]
    assert set(batch) == {"input_ids", "labels"}
    batch = DocumentCollator(EOS, reset_position_ids=True, reset_attention_mask=True, mask_form="flashmask")(samples)
    assert set(batch) == {"input_ids", "labels", "position_ids", "attn_mask_startend_row_indices"}


def _model(name):
    arch = find_model_size(name)
    config = arch.model_config()
    config.num_hidden_layers = 2
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    routing = arch.implementation.routing
    if routing is not None:  # a mixture of experts: paddle 3.3's fixes, and routers that differ per expert
        moe_compat.apply()
    paddle.seed(0)
    model = arch.implementation.model_class(config)
    if routing is not None and routing.init_routers:
        moe_compat.init_routers(model, routing.router_suffix, config.initializer_range)
    model.eval()  # no dropout; gradients still flow
    return model


def _logits(model, batch):
    inputs = {key: paddle.to_tensor(value) for key, value in batch.items() if key != "labels"}
    output = model(**inputs)
    return output[0] if isinstance(output, (tuple, list)) else output


def _docs(rng, a_len=9, b_len=12):
    doc_a = np.append(rng.integers(3, 8000, a_len - 1), EOS)
    doc_b = rng.integers(3, 8000, b_len)
    return doc_a, doc_b


@pytest.mark.parametrize("name", FAMILIES)
def test_document_b_packed_after_a_equals_b_alone(name, monkeypatch):
    monkeypatch.setenv("USE_CASUAL_MASK", "False")  # paddlenlp would drop the mask otherwise
    model = _model(name)
    rng = np.random.default_rng(0)
    doc_a, doc_b = _docs(rng)
    collate = DocumentCollator(EOS, reset_position_ids=True, reset_attention_mask=True)
    packed = collate([{"text": np.concatenate([doc_a, doc_b, [4]])}])
    alone = collate([{"text": np.concatenate([doc_b, [4]])}])
    with paddle.no_grad():
        b_packed = _logits(model, packed).numpy()[0, len(doc_a) :]
        b_alone = _logits(model, alone).numpy()[0]
        other_a = np.append(rng.integers(3, 8000, len(doc_a) - 1), EOS)
        b_after_other_a = _logits(model, collate([{"text": np.concatenate([other_a, doc_b, [4]])}])).numpy()[0]
        unmasked = DocumentCollator(EOS)([{"text": np.concatenate([doc_a, doc_b, [4]])}])
        b_unmasked = _logits(model, unmasked).numpy()[0, len(doc_a) :]
    np.testing.assert_allclose(b_packed, b_alone, atol=1e-5, rtol=0)
    np.testing.assert_allclose(b_after_other_a[len(doc_a) :], b_packed, atol=1e-5, rtol=0)
    assert np.abs(b_unmasked - b_alone).max() > 1e-3  # without the mask, A leaks into B


@pytest.mark.parametrize("name", FAMILIES)
def test_restarted_positions_reach_the_model(name, monkeypatch):
    """``position_ids`` change document B's logits in every family; with the mask alone (positions
    running on across the EOS), GPT-3's learned absolute positions leave B unlike B alone, while
    LLaMA's and Qwen2's rotary embeddings depend only on position differences inside a document,
    so there the mask alone already gives B its own logits."""
    monkeypatch.setenv("USE_CASUAL_MASK", "False")
    model = _model(name)
    doc_a, doc_b = _docs(np.random.default_rng(3))
    packed = [{"text": np.concatenate([doc_a, doc_b, [4]])}]

    def b_logits(text, **keys):
        with paddle.no_grad():
            logits = _logits(model, DocumentCollator(EOS, **keys)(text)).numpy()[0]
        return logits[len(logits) - len(doc_b) :]

    running_on, restarted = b_logits(packed), b_logits(packed, reset_position_ids=True)
    assert np.abs(restarted - running_on).max() > 1e-3
    alone = b_logits([{"text": np.concatenate([doc_b, [4]])}])
    mask_only = np.abs(b_logits(packed, reset_attention_mask=True) - alone).max()
    if name == "gpt3-debug":
        assert mask_only > 1e-3
    else:
        assert mask_only < 1e-5


def _per_token_loss_sum(model, tokens, drop_last_label):
    """Sum of the cross entropy of ``tokens`` run alone (its last prediction left out if asked), and the count."""
    logits = _logits(model, {"input_ids": tokens[None, :-1]})[0]
    labels = paddle.to_tensor(tokens[1:])
    losses = paddle.nn.functional.cross_entropy(logits, labels[:, None], reduction="none")[:, 0]
    if drop_last_label:
        losses = losses[:-1]
    return losses.sum(), losses.shape[0]


@pytest.mark.parametrize("name", FAMILIES)
def test_gradients_of_a_packed_masked_batch_equal_those_of_the_separate_documents(name, monkeypatch):
    monkeypatch.setenv("USE_CASUAL_MASK", "False")
    model = _model(name)
    doc_a, doc_b = _docs(np.random.default_rng(1))
    extra = np.array([4])
    collate = DocumentCollator(EOS, reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=True)
    batch = collate([{"text": np.concatenate([doc_a, doc_b, extra])}])
    loss = model(**{key: paddle.to_tensor(value) for key, value in batch.items()})[0]
    loss.backward()
    packed = {p.name: p.grad.numpy().copy() for p in model.parameters() if p.grad is not None}
    model.clear_gradients()
    # doc A alone predicts its own tokens (EOS last), doc B alone predicts B[1:] and the extra token
    sum_a, count_a = _per_token_loss_sum(model, np.append(doc_a, doc_b[0]), drop_last_label=True)
    sum_b, count_b = _per_token_loss_sum(model, np.concatenate([doc_b, extra]), drop_last_label=False)
    separate_loss = (sum_a + sum_b) / (count_a + count_b)
    np.testing.assert_allclose(float(loss), float(separate_loss), rtol=1e-5)
    separate_loss.backward()
    separate = {p.name: p.grad.numpy() for p in model.parameters() if p.grad is not None}
    assert packed.keys() == separate.keys() and len(packed) > 10
    for key, grad in packed.items():
        np.testing.assert_allclose(grad, separate[key], atol=1e-5, rtol=1e-4, err_msg=key)


def _plan(tmp_path, family, *extra):
    config = f"{REPO}/config/{family}/pretrain_demo_cpu.json"
    return resolve_plan([config, "--output_dir", str(tmp_path), "--reset_attention_mask", "true", *extra])


def test_preflight_refuses_what_cannot_honour_the_mask(tmp_path):
    assert document_masking_problems(_plan(tmp_path, "llama")) == []
    assert document_masking_problems(_plan(tmp_path, "gpt3")) == []
    (qwen,) = document_masking_problems(_plan(tmp_path, "qwen"))
    assert "paddlenlp's qwen model takes no per-document positions" in qwen
    for family in ("gpt3", "mixtral"):  # the dense mask only
        assert document_masking_problems(_plan(tmp_path, family)) == []
        (flash,) = document_masking_problems(_plan(tmp_path, family, "--use_flash_attention", "true"))
        model_type = "gpt" if family == "gpt3" else family
        assert flash == (
            f"reset_attention_mask: paddlenlp's {model_type} takes no FlashMask (attn_mask_startend_row_indices), "
            "the mask form used under flash attention; set use_flash_attention false (dense mask) or "
            "reset_attention_mask false"
        )
    for family in ("llama", "qwen2_moe"):
        assert document_masking_problems(_plan(tmp_path, family, "--use_flash_attention", "true")) == []
        assert document_masking_problems(_plan(tmp_path, family)) == []
    (alibi,) = document_masking_problems(_plan(tmp_path, "baichuan"))
    assert "ALiBi" in alibi


def _reference_flashmask(received):
    """``paddle.nn.functional.flashmask_attention`` (causal, one start row per key column) as its
    docstring defines it, in eager Paddle: row i may see column j when j <= i < startend[..., j, 0].
    Records the ``startend_row_indices`` each call receives in ``received``."""

    def flashmask_attention(query, key, value, startend_row_indices=None, *, causal=False, **unused):
        assert causal and startend_row_indices.dtype == paddle.int32
        received.append(startend_row_indices.numpy())
        q, k, v = (x.transpose([0, 2, 1, 3]) for x in (query, key, value))  # [batch, heads, seq, dim]
        if k.shape[1] != q.shape[1]:  # grouped-query attention: each K/V head serves several query heads
            k, v = (x.repeat_interleave(q.shape[1] // k.shape[1], axis=1) for x in (k, v))
        seq = q.shape[2]
        rows = paddle.arange(seq, dtype="int32").reshape([1, 1, seq, 1])
        allowed = (rows < startend_row_indices[..., 0].unsqueeze(2)) & (rows >= paddle.arange(seq, dtype="int32"))
        scores = paddle.matmul(q, k, transpose_y=True) / q.shape[-1] ** 0.5
        scores = paddle.where(allowed, scores, paddle.full_like(scores, float("-inf")))
        return paddle.matmul(paddle.nn.functional.softmax(scores, axis=-1), v).transpose([0, 2, 1, 3])

    return flashmask_attention


@pytest.mark.parametrize("name", ("llama-debug", "qwen2-debug", "qwen2_moe-debug"))
def test_flash_attention_path_hands_flashmask_the_document_ends(name, monkeypatch):
    """The GPU path, by construction: under use_flash_attention paddlenlp passes our
    attn_mask_startend_row_indices to flashmask_attention; with that kernel's documented meaning
    the logits equal the dense path's."""
    monkeypatch.setenv("USE_CASUAL_MASK", "False")
    received = []
    monkeypatch.setattr(paddle.nn.functional, "flashmask_attention", _reference_flashmask(received))
    model = _model(name)
    doc_a, doc_b = _docs(np.random.default_rng(2))
    text = [{"text": np.concatenate([doc_a, doc_b, [4]])}, {"text": np.concatenate([doc_b, doc_a, [4]])}]
    dense = DocumentCollator(EOS, reset_position_ids=True, reset_attention_mask=True)(text)
    flash = DocumentCollator(EOS, reset_position_ids=True, reset_attention_mask=True, mask_form="flashmask")(text)
    with paddle.no_grad():
        expected = _logits(model, dense).numpy()
        model.config.use_flash_attention = True
        got = _logits(model, flash).numpy()
    assert len(received) == model.config.num_hidden_layers  # every layer went through FlashMask
    np.testing.assert_array_equal(received[0][..., 0], flash["attn_mask_startend_row_indices"])
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_a_run_trains_with_document_masking(tmp_path, demo_dir):
    """run_pretrain.py with the three keys on the CPU demo: the dense mask reaches the model (paddlenlp's
    causal fast path is off) and the loss falls."""
    from tiny_run import tiny_args

    from pretrain.metrics.loss_curves import load_train_losses

    flags = ("--reset_position_ids", "true", "--reset_attention_mask", "true", "--eod_mask_loss", "true")
    longer = ("--max_seq_length", "512")  # demo documents average ~1,100 tokens: a batch of 4 x 512 spans several
    argv = tiny_args(str(tmp_path / "out"), str(tmp_path / "cache"), *longer, *flags, steps=6, save_steps=1000)
    load_script("run_pretrain.py").main(argv)
    assert os.environ["USE_CASUAL_MASK"] == "False"
    losses = [loss for _, loss in load_train_losses(str(tmp_path / "out"))]
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.05
    plain = tiny_args(str(tmp_path / "plain"), str(tmp_path / "cache"), *longer, steps=1, save_steps=1000)
    load_script("run_pretrain.py").main(plain)
    assert os.environ["USE_CASUAL_MASK"] == "True"
    (first_plain,) = [loss for _, loss in load_train_losses(str(tmp_path / "plain"))]
    assert abs(first_plain - losses[0]) > 1e-4  # same weights and samples: the masks changed the loss


def test_the_header_says_what_the_keys_do(tmp_path):
    from pretrain.report import format_header

    data_line = format_header(_plan(tmp_path, "llama", "--eod_mask_loss", "true"))[2]
    assert data_line.endswith(
        "; documents: attention within each document (dense mask), no loss on the token after EOS"
    )
    assert "documents:" not in format_header(resolve_plan([f"{REPO}/config/llama/pretrain_demo_cpu.json"]))[2]


def test_data_written_without_the_tokenizers_eos_is_refused(tmp_path, demo_dir):
    import json
    import shutil

    prefix = tmp_path / "noeos"
    for suffix in (".bin", ".idx"):
        shutil.copy(os.path.join(demo_dir, "demo_text_document" + suffix), str(prefix) + suffix)
    with open(os.path.join(demo_dir, "demo_text_document.stats.json")) as f:
        stats = json.load(f)
    (tmp_path / "noeos.stats.json").write_text(json.dumps({**stats, "eos_token_id": None}))
    (problem,) = document_masking_problems(_plan(tmp_path, "llama", "--input_dir", str(prefix)))
    assert problem == (
        f"reset_position_ids/reset_attention_mask/eod_mask_loss: {prefix}.stats.json says its documents end with "
        "no EOS, so documents cannot be told apart; re-run create_pretraining_data.py with --append_eos (this "
        "tokenizer's EOS is 2), or turn these keys off"
    )
