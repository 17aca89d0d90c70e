"""Parameter counts from configs: equal to built paddlenlp models, close to every published count."""

import pytest
from conftest import count_parameters
from paddlenlp.transformers import LlamaConfig

from pretrain.model import compute_as_trained
from pretrain.param_count import count_config_parameters
from pretrain.registry import FAMILIES, IMPLEMENTATIONS, MODEL_SIZES

PUBLISHED = [arch for arch in MODEL_SIZES.values() if arch.published_params]
TOLERANCE = 0.01
# Published counts whose own precision or hyperparameters do not allow 1% (see pretrain/families/):
WIDER_TOLERANCE = {
    # "1.3B" has two significant digits, i.e. anything in [1.25B, 1.35B); the count is 1.316B.
    "gpt3-1.3b": 0.015,
    # Table 2.1's 13.0B comes from d_model 5140, which 40 heads of 128 cannot divide; the buildable
    # 5120 = 40 x 128 (PaddleNLP's gpt3-13B-en) has 12.85B. test_gpt3_13b_published_width pins the 5140 count.
    "gpt3-13b": 0.012,
    # "1.7B" has two significant digits, i.e. anything in [1.65B, 1.75B); the count is 1.721B.
    "qwen3-1.7b": 0.015,
    # the model card's "21B total" truncates the 21.83B counted (test_ernie4_5_moe_counts_by_hand)
    "ernie-4.5-21b-a3b": 0.04,
}


def published_count(config, activated: bool = False) -> int:
    """The count a release publishes: the main model's (DeepSeek-V3's 671B and 37B leave out its
    multi-token-prediction module, test_deepseek_v3_mtp_module_counts_by_hand)."""
    return count_config_parameters(config, activated, prediction_modules=False)[0]


@pytest.mark.parametrize("arch", PUBLISHED, ids=lambda arch: arch.name)
def test_count_matches_published(arch):
    total = published_count(arch.model_config())
    assert total == pytest.approx(arch.published_params, rel=WIDER_TOLERANCE.get(arch.name, TOLERANCE))


def test_gpt3_13b_published_width():
    config = MODEL_SIZES["gpt3-13b"].model_config()
    config.hidden_size, config.intermediate_size = 5140, 4 * 5140  # Brown et al. 2020, Table 2.1 as printed
    assert count_config_parameters(config)[0] == pytest.approx(13.0e9, rel=TOLERANCE)


def test_wider_tolerances_are_needed():
    """Each exception is still outside 1%; drop it from WIDER_TOLERANCE once the entry is within."""
    for name in WIDER_TOLERANCE:
        arch = MODEL_SIZES[name]
        total = published_count(arch.model_config())
        assert abs(total / arch.published_params - 1) > TOLERANCE


def test_known_counts():
    """Exact counts derived by hand from the papers' shapes (not from the code under test)."""
    d, f, layers, vocab = 4096, 11008, 32, 32000  # LLaMA-7B
    per_layer = 4 * d * d + 3 * d * f + 2 * d
    assert count_config_parameters(MODEL_SIZES["llama-7b"].model_config()) == (
        layers * per_layer + 2 * vocab * d + d,
        vocab * d,
    )
    d, layers, vocab, positions = 12288, 96, 50257, 2048  # GPT-3 175B, tied embeddings
    per_layer = 12 * d * d + 13 * d
    assert count_config_parameters(MODEL_SIZES["gpt3-175b"].model_config())[0] == (
        layers * per_layer + (vocab + positions) * d + 2 * d
    )


def _decoder(d, f, layers, heads, kv_heads, vocab, *, tied, qkv_bias=False):
    """A LLaMA-style decoder's count by hand: q, k, v, o, the SwiGLU MLP (3 matrices), 2 RMSNorms per layer,
    the final norm, the embedding (twice untied); Qwen2's q/k/v biases."""
    kv = kv_heads * d // heads
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d + (d + 2 * kv if qkv_bias else 0)
    return layers * per_layer + (1 if tied else 2) * vocab * d + d


@pytest.mark.parametrize(
    "name, shape, tied, qkv_bias",
    [
        ("llama-3.1-8b", (4096, 14336, 32, 32, 8, 128256), False, False),
        ("llama-3.1-405b", (16384, 53248, 126, 128, 8, 128256), False, False),
        ("llama-3.2-1b", (2048, 8192, 16, 32, 8, 128256), True, False),
        ("llama-3.2-3b", (3072, 8192, 28, 24, 8, 128256), True, False),
        ("qwen2.5-0.5b", (896, 4864, 24, 14, 2, 151936), True, True),
        ("qwen2.5-72b", (8192, 29568, 80, 64, 8, 152064), False, True),
    ],
)
def test_llama3_and_qwen25_counts_by_hand(name, shape, tied, qkv_bias):
    """Llama 3.1/3.2 and Qwen2.5 from their config.json shapes (d, ffn, layers, heads, kv heads, vocab), tied
    embeddings counted once: Llama-3.1-8B's 8,030,261,248 is its safetensors total_size / 2 (16,060,522,496 bytes of
    bfloat16, as Llama-3-8B's), Llama-3.2-1B's 1,235,814,400 its model page's 1.24B."""
    total, _ = count_config_parameters(MODEL_SIZES[name].model_config())
    assert total == _decoder(*shape, tied=tied, qkv_bias=qkv_bias)
    assert {"llama-3.1-8b": 8_030_261_248, "llama-3.2-1b": 1_235_814_400}.get(name, total) == total


def _variants():
    """Small configs covering every switch of the formula, built for real below."""
    tiny = {"num_hidden_layers": 2, "vocab_size": 320}
    variants = {arch.name: arch.model_config() for arch in MODEL_SIZES.values() if arch.name.endswith("-debug")}
    for config in variants.values():
        for key, value in tiny.items():
            setattr(config, key, value)
    variants["llama-gqa-tied"] = LlamaConfig(
        **tiny,
        hidden_size=64,
        intermediate_size=176,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    qwen_bias = MODEL_SIZES["qwen-debug"].model_config()
    qwen_bias.no_bias, qwen_bias.num_hidden_layers, qwen_bias.vocab_size = False, 2, 320
    variants["qwen-with-biases"] = qwen_bias
    qwen2_untied = MODEL_SIZES["qwen2-debug"].model_config()
    qwen2_untied.tie_word_embeddings, qwen2_untied.num_hidden_layers, qwen2_untied.vocab_size = False, 2, 320
    variants["qwen2-untied"] = qwen2_untied
    # DeepSeek-V2's query compression (q_lora_rank: q_a_proj, its norm, q_b_proj) and attention biases
    deepseek = MODEL_SIZES["deepseek_v2-debug"].model_config()
    deepseek.q_lora_rank, deepseek.attention_bias, deepseek.num_hidden_layers, deepseek.vocab_size = 48, True, 3, 320
    variants["deepseek_v2-q-lora-bias"] = deepseek
    return variants


VARIANTS = _variants()


def test_every_family_is_built_below():
    assert set(FAMILIES) <= {MODEL_SIZES[name].family for name in VARIANTS if name in MODEL_SIZES}
    assert {config.model_type for config in VARIANTS.values()} == set(IMPLEMENTATIONS)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_count_equals_built_model(name):
    config = VARIANTS[name]
    model = compute_as_trained(IMPLEMENTATIONS[config.model_type].model_class(config), config.model_type)
    assert count_config_parameters(config) == count_parameters(model)


# Mixture of experts as published (total, activated), in the published precision; sources in pretrain/families/.
PUBLISHED_MOE = {
    "qwen1.5-moe-a2.7b": ("14.3", "2.7"),  # Qwen/Qwen1.5-MoE-A2.7B model card
    "qwen2-57b-a14b": ("57.4", "14"),  # Qwen/Qwen2-57B-A14B model card; "A14B"
    # Qwen/Qwen3-30B-A3B model card: 30.5B in total, 3.3B activated, which truncates the 3.353B counted rather
    # than rounding it: test_qwen3_moe_counts_by_hand_and_the_model_cards_non_embedding compares it so
    "qwen3-30b-a3b": ("30.5", None),
    "qwen3-235b-a22b": ("235", "22"),  # Qwen/Qwen3-235B-A22B model card: 235B in total, 22B activated
    "mixtral-8x7b": ("46.7", "12.9"),  # Mistral AI's Mixtral announcement
    # DeepSeek-V2 technical report (arXiv 2405.04434) and model cards; their activated figures follow no basis
    # this formula can state (see test_deepseek_v2_counts_by_hand), so only the totals are compared here
    "deepseek-v2-lite": ("15.7", None),
    "deepseek-v2": ("236", None),
    "deepseek-v3": ("671", None),  # DeepSeek-V3 technical report: 671B total, 37B activated
    # baidu/ERNIE-4.5-{21B-A3B,300B-A47B}-PT model cards: 21B total, 3B activated per token; 300B total, 47B
    # activated. The totals (21.83B, 298.64B) are compared by test_ernie4_5_moe_counts_by_hand and the 1% test
    # (the 21B's with its wider tolerance): "21" and "300" are not the counts rounded.
    "ernie-4.5-21b-a3b": (None, "3"),
    "ernie-4.5-300b-a47b": (None, "47"),
}


# Qwen3 (dense) as published (total, non-embedding: neither the embedding nor an untied LM head), in the
# published precision: each Qwen/Qwen3-<size> model card, "Number of Parameters" and "(Non-Embedding)".
PUBLISHED_QWEN3 = {
    "qwen3-0.6b": ("0.6", "0.44"),
    "qwen3-1.7b": ("1.7", "1.4"),
    "qwen3-4b": ("4.0", "3.6"),
    "qwen3-8b": ("8.2", "6.95"),
    "qwen3-14b": ("14.8", "13.2"),
    "qwen3-32b": ("32.8", "31.2"),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_QWEN3))
def test_qwen3_total_and_non_embedding_counts_equal_the_model_cards(name):
    config = MODEL_SIZES[name].model_config()
    total, embedding = count_config_parameters(config)
    non_embedding = total - embedding * (1 if config.tie_word_embeddings else 2)
    for count, figure in zip((total, non_embedding), PUBLISHED_QWEN3[name]):
        assert f"{count / 1e9:.{len(figure.partition('.')[2])}f}" == figure


def test_qwen3_0_6b_counts_by_hand():
    """Qwen3-0.6B's config.json: 28 layers, hidden 1024, 16 query and 8 key/value heads of 128 (q is 2048
    wide), MLP 3072, vocabulary 151,936, tied; per layer two [128] head norms besides the two [1024] norms."""
    d, q, kv, f, vocab = 1024, 16 * 128, 8 * 128, 3072, 151936
    per_layer = d * (q + 2 * kv) + q * d + 3 * d * f + 2 * d + 2 * 128
    config = MODEL_SIZES["qwen3-0.6b"].model_config()
    assert count_config_parameters(config) == (vocab * d + 28 * per_layer + d, vocab * d) == (596049920, 155582464)


def test_qwen3_moe_counts_by_hand_and_the_model_cards_non_embedding():
    """Qwen3-30B-A3B's config.json: 48 layers, hidden 2048, 32 query and 4 key/value heads of 128, two [128] head
    norms, 128 experts of 3 x 2048 x 768 and a [2048, 128] router per layer, no shared expert, vocabulary 151,936
    untied; 8 experts per token. Non-embedding (neither embedding nor LM head), as the model cards give it:
    Qwen3-30B-A3B 29.9B, Qwen3-235B-A22B 234B."""
    d, q, kv, vocab, expert = 2048, 32 * 128, 4 * 128, 151936, 3 * 2048 * 768
    attention = d * (q + 2 * kv) + q * d + 2 * 128 + 2 * d  # with the layer's two norms
    outside = 2 * vocab * d + d
    config = MODEL_SIZES["qwen3-30b-a3b"].model_config()
    assert count_config_parameters(config)[0] == 48 * (attention + 128 * expert + d * 128) + outside
    assert count_config_parameters(config, activated=True)[0] == 48 * (attention + 8 * expert + d * 128) + outside
    assert int(count_config_parameters(config, activated=True)[0] / 1e8) == 33  # the card's 3.3B, truncated
    for name, figure in (("qwen3-30b-a3b", "29.9"), ("qwen3-235b-a22b", "234")):
        total, embedding = count_config_parameters(MODEL_SIZES[name].model_config())
        assert f"{(total - 2 * embedding) / 1e9:.{len(figure.partition('.')[2])}f}" == figure


def test_ernie4_5_0_3b_counts_by_hand_and_equals_the_model_card():
    """ERNIE-4.5-0.3B's config.json: 18 layers, hidden 1024, 16 query and 2 key/value heads of 128 (q is 2048
    wide), MLP 3072, vocabulary 103,424, tied, no bias; the baidu/ERNIE-4.5-0.3B-PT model card: "Params 0.36B"."""
    d, q, kv, f, vocab = 1024, 16 * 128, 2 * 128, 3072, 103424
    per_layer = d * (q + 2 * kv) + q * d + 3 * d * f + 2 * d
    config = MODEL_SIZES["ernie-4.5-0.3b"].model_config()
    total, embedding = count_config_parameters(config)
    assert (total, embedding) == (vocab * d + 18 * per_layer + d, vocab * d) == (360748032, 105906176)
    assert f"{total / 1e9:.2f}" == "0.36"


def test_ernie4_5_moe_counts_by_hand():
    """ERNIE-4.5-21B-A3B's config.json: 28 layers, hidden 2560, 20 query and 4 key/value heads of 128, a dense
    layer 0 (MLP 12288), then 27 MoE layers of 64 experts of 3 x 2560 x 1536, 2 shared ones (one MLP of 3072), a
    [2560, 64] router and its [64] routing bias; vocabulary 103,424, tied; 6 experts per token. The model card's
    "21B total, 3B activated" truncate 21.83B and round 3.35B. ERNIE-4.5-300B-A47B: 54 layers, hidden 8192, 64 and 8
    heads, 3 dense layers (MLP 28672), 51 MoE layers of 64 experts of 3584 without a shared one, 8 per token:
    298.6B in total, within 0.5% of the card's 300B, and 47.1B activated, its 47B."""
    d, q, kv, vocab = 2560, 20 * 128, 4 * 128, 103424
    attention = d * (q + 2 * kv) + q * d + 2 * d  # with the layer's two norms
    router, expert, shared = d * 64 + 64, 3 * d * 1536, 3 * d * 3072
    outside, dense = vocab * d + d, attention + 3 * d * 12288
    config = MODEL_SIZES["ernie-4.5-21b-a3b"].model_config()
    total = outside + dense + 27 * (attention + router + 64 * expert + shared)
    activated = outside + dense + 27 * (attention + router + 6 * expert + shared)
    assert count_config_parameters(config) == (total, vocab * d) and total == 21_825_437_888
    assert count_config_parameters(config, activated=True)[0] == activated == 3_352_150_208
    assert int(total / 1e9) == 21 and round(activated / 1e9) == 3
    d, q, kv = 8192, 64 * 128, 8 * 128
    attention, expert = d * (q + 2 * kv) + q * d + 2 * d, 3 * d * 3584
    outside, dense, router = vocab * d + d, 3 * (attention + 3 * d * 28672), d * 64 + 64
    config = MODEL_SIZES["ernie-4.5-300b-a47b"].model_config()
    total, activated = (outside + dense + 51 * (attention + router + k * expert) for k in (64, 8))
    counted = (count_config_parameters(config)[0], count_config_parameters(config, activated=True)[0])
    assert counted == (total, activated)


def test_every_moe_entry_has_published_counts():
    moe = {arch.name for arch in PUBLISHED if arch.implementation.routing is not None}
    assert moe == set(PUBLISHED_MOE)
    assert all(MODEL_SIZES[name].published_active_params for name in moe)


@pytest.mark.parametrize("name", sorted(PUBLISHED_MOE))
def test_moe_total_and_activated_counts_equal_the_published_figures(name):
    config = MODEL_SIZES[name].model_config()
    for figure, activated in zip(PUBLISHED_MOE[name], (False, True)):
        if figure is None:
            continue
        decimals = len(figure.partition(".")[2])
        assert f"{published_count(config, activated) / 1e9:.{decimals}f}" == figure


def test_mixtral_total_equals_the_checkpoint_and_activated_is_two_experts():
    """By hand from the config: per layer attention 2·4096² + 2·4096·1024, 8 experts of 3·4096·14336, router
    4096·8, 2 norms; the checkpoint's model.safetensors.index.json total_size is 93,405,585,408 bf16 bytes."""
    d, kv, f, experts, layers, vocab = 4096, 1024, 14336, 8, 32, 32000
    attention, expert, router = 2 * d * d + 2 * d * kv, 3 * d * f, d * experts
    outside = 2 * vocab * d + d  # embedding, lm_head, final norm
    config = MODEL_SIZES["mixtral-8x7b"].model_config()
    assert count_config_parameters(config)[0] == layers * (attention + 8 * expert + router + 2 * d) + outside
    assert count_config_parameters(config)[0] == 93_405_585_408 // 2
    activated = layers * (attention + 2 * expert + router + 2 * d) + outside
    assert count_config_parameters(config, activated=True)[0] == activated


def _deepseek_v2_by_hand(d, layers, vocab, heads, q_rank, experts, top_k, fe, fd, shared=2) -> tuple:
    """(total, activated) of a DeepSeek-V2 config.json by hand: MLA per layer (q_proj, or q_a + its norm + q_b;
    kv_a_proj_with_mqa [d, 512 + 64], its norm, kv_b [512, heads x (128 + 128)], o [heads x 128, d]), 2 norms;
    layer 0 a dense SwiGLU MLP of fd, the others a router [d, E], E experts of fe and ``shared`` shared experts
    of fe; untied embedding and head, final norm."""
    q = heads * (128 + 64)
    query = d * q if q_rank is None else d * q_rank + q_rank + q_rank * q
    attention = query + d * (512 + 64) + 512 + 512 * heads * 256 + heads * 128 * d + 2 * d
    dense = attention + 3 * d * fd
    outside = 2 * vocab * d + d
    total = dense + (layers - 1) * (attention + d * experts + (experts + shared) * 3 * d * fe) + outside
    activated = dense + (layers - 1) * (attention + d * experts + (top_k + shared) * 3 * d * fe) + outside
    return total, activated


def test_deepseek_v2_counts_by_hand():
    """DeepSeek-V2-Lite (config.json: hidden 2048, 27 layers, 16 heads, no query compression, 64 experts of 1408,
    top-6, 2 shared, dense layer 10944) has 15,706,484,224 parameters: its four safetensors files hold 31.41 GB
    (3 x 8.59 + 5.64) of bfloat16, and the model card says 15.7B; DeepSeek-V2 (5120, 60 layers, 128 heads,
    q_lora_rank 1536, 160 experts of 1536, dense 12288) 235.7B, "236B". The activated counts (every tensor one
    token uses, as for the other families) are 2.66B and 21.38B; the releases say 2.4B and 21B, which lie
    between these and the same less both 102,400-row embedding tables (2.24B, 20.33B): DeepSeek does not say
    which tensors it counts."""
    lite = MODEL_SIZES["deepseek-v2-lite"].model_config()
    assert _deepseek_v2_by_hand(2048, 27, 102400, 16, None, 64, 6, 1408, 10944) == (
        15_706_484_224,
        2_661_150_208,
    )
    assert (count_config_parameters(lite)[0], count_config_parameters(lite, activated=True)[0]) == (
        15_706_484_224,
        2_661_150_208,
    )
    full = MODEL_SIZES["deepseek-v2"].model_config()
    by_hand = _deepseek_v2_by_hand(5120, 60, 102400, 128, 1536, 160, 6, 1536, 12288)
    assert by_hand == (235_741_434_880, 21_375_800_320)
    assert (count_config_parameters(full)[0], count_config_parameters(full, activated=True)[0]) == by_hand
    for config, published in ((lite, 2.4e9), (full, 21e9)):
        activated, embedding = count_config_parameters(config, activated=True)
        assert activated - 2 * embedding < published < activated


# DeepSeek-V3 by hand (config_671B.json): hidden 7168, 61 layers of which 3 dense of 18432, 128 heads, q_lora_rank
# 1536, 256 experts of 2048, top-8, 1 shared, vocabulary 129,280; each router [7168, 256] with its 256-entry bias
V3_D, V3_HEADS, V3_Q_RANK, V3_VOCAB, V3_EXPERTS, V3_FE = 7168, 128, 1536, 129280, 256, 2048
V3_ATTENTION = (  # MLA and the layer's two norms
    V3_D * V3_Q_RANK + V3_Q_RANK + V3_Q_RANK * V3_HEADS * 192 + V3_D * 576 + 512
    + 512 * V3_HEADS * 256 + V3_HEADS * 128 * V3_D + 2 * V3_D
)  # fmt: skip
V3_ROUTER = V3_D * V3_EXPERTS + V3_EXPERTS


def test_deepseek_v3_counts_by_hand():
    """DeepSeek-V3's main model: 671,026,419,200 parameters, the report's 671B. Activated 37.55B; the report's 37B
    lies between it and the same less both embedding tables (35.70B)."""
    d, fe = V3_D, V3_FE
    dense = V3_ATTENTION + 3 * d * 18432
    outside = 2 * V3_VOCAB * d + d
    total = 3 * dense + 58 * (V3_ATTENTION + V3_ROUTER + (V3_EXPERTS + 1) * 3 * d * fe) + outside
    activated = 3 * dense + 58 * (V3_ATTENTION + V3_ROUTER + (8 + 1) * 3 * d * fe) + outside
    assert (total, activated) == (671_026_419_200, 37_552_297_472)
    config = MODEL_SIZES["deepseek-v3"].model_config()
    assert count_config_parameters(config, prediction_modules=False)[0] == total
    activated_count, embedding = count_config_parameters(config, activated=True, prediction_modules=False)
    assert activated_count == activated and activated - 2 * embedding < 37e9 < activated


def test_deepseek_v3_mtp_module_counts_by_hand():
    """DeepSeek-V3's multi-token-prediction module (report section 2.2; config_671B.json num_nextn_predict_layers
    1): one more MoE layer, enorm and hnorm, eh_proj [2 x 7168, 7168] (no bias), sharing the main model's embedding
    and head: 11,610,061,056 parameters, 688,093,440 of them activated. The Hugging Face checkpoint stores the
    module with its own copies of the embedding and head (model.layers.61.embed_tokens, shared_head.head: 2 x
    926,679,040) and its own shared_head.norm, 13.46B; with the main model 684.49B. The model card
    (huggingface.co/deepseek-ai/DeepSeek-V3): "685B ... 671B of the Main Model weights and 14B of the
    Multi-Token Prediction (MTP) Module weights": 685B rounds 684.49B up by its FP8 scale tensors (about one per
    128 x 128 weight block, 0.04B), and 14B is 685 - 671."""
    d, fe = V3_D, V3_FE
    module = V3_ATTENTION + V3_ROUTER + (V3_EXPERTS + 1) * 3 * d * fe + 2 * d + 2 * d * d
    activated = V3_ATTENTION + V3_ROUTER + (8 + 1) * 3 * d * fe + 2 * d + 2 * d * d
    assert (module, activated) == (11_610_061_056, 688_093_440)
    config = MODEL_SIZES["deepseek-v3"].model_config()
    main = count_config_parameters(config, prediction_modules=False)[0]
    assert count_config_parameters(config)[0] == main + module == 682_636_480_256
    main_activated = count_config_parameters(config, activated=True, prediction_modules=False)[0]
    assert count_config_parameters(config, activated=True)[0] == main_activated + activated
    copies = 2 * V3_VOCAB * d + d  # the checkpoint's own embedding, head and head norm of the module
    assert main + module + copies == 684_489_845_504
    assert f"{(module + copies) / 1e9:.2f}" == "13.46"


@pytest.mark.parametrize("name", sorted(n for n, c in VARIANTS.items() if IMPLEMENTATIONS[c.model_type].routing))
def test_activated_count_leaves_out_the_unused_experts_of_the_built_model(name):
    config = VARIANTS[name]
    model = compute_as_trained(IMPLEMENTATIONS[config.model_type].model_class(config), config.model_type)
    suffix = IMPLEMENTATIONS[config.model_type].routing.router_suffix
    router = next(layer for layer_name, layer in model.named_sublayers() if layer_name.endswith(suffix))
    experts = router.weight.shape[1]
    experts_0 = [int(p.numel()) for param_name, p in model.named_parameters() if ".experts.0." in param_name]
    one_expert = sum(experts_0) // config.num_hidden_layers
    unused = config.num_hidden_layers * (experts - config.num_experts_per_tok) * one_expert
    assert count_config_parameters(config, activated=True)[0] == count_parameters(model)[0] - unused
