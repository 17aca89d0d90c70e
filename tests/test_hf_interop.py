"""Hugging Face interop, proven numerically: export -> transformers, transformers -> continue_training.

Export: each family's debug model (llama, qwen2, qwen v1, baichuan 7B-style, gpt3), with weights drawn
large enough that attention is far from uniform, is saved, exported with tools/export_hf.py's code, and
loaded with transformers in float32: logits on demo-corpus text agree within 1e-4 and greedy generation
of 20 tokens is identical. A deliberately wrong mapping (q and k swapped, a missing transpose) fails the
same comparison. A real LoRA run exports after merging; the exported Qwen tiktoken and GPT-2 tokenizers give
paddlenlp's ids. Import: a random transformers model (GQA, rope_theta 500000, tied and untied, a vocabulary
padded past the tokenizer's) is saved with save_pretrained, a run continues from it, and its first loss
equals transformers' loss on the same batch (rel. 1e-5; a mixture of experts' with its router_aux_loss_coef x
load-balancing loss, which the run adds); with learning rate 0, exporting the run gives
the original tensors bit for bit. RoPE: the same weights under a config.json as transformers 5 writes it
(rope_parameters; tests/fixtures) and as 4.x writes it import to transformers' logits (theta 500000, linear,
dynamic and llama3 scaling; qwen2's theta 1e6), the export writes both forms; other scalings are refused in
one line. Mixture of experts (Qwen2-MoE with its gated shared expert, Mixtral, DeepSeek-V2 and V3 with MLA):
a random transformers model
imports to its logits and routing keys and exports back bit for bit; two experts swapped fail the comparison;
a routing paddlenlp does not compute (norm_topk_prob, decoder_sparse_step, sliding_window) is refused in one
line. A tensor the export's dtype cannot hold (float16 past 65504, NaN/inf) is refused, nothing written.
"""

import copy
import glob
import json
import os
import re
import socket
import subprocess

import numpy as np
import paddle
import pytest
from conftest import REPO, load_script, resolve_plan
from tiny_run import SHORT_DEMO_RUN

from pretrain.errors import UserError
from pretrain.hf_export import export, hf_tensors, parse_size, saved_tensors
from pretrain.model_config import load_local_config
from pretrain.registry import IMPLEMENTATIONS, MODEL_SIZES

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

torch = pytest.importorskip("torch", reason="torch (requirements-dev.txt) is needed to run transformers")
transformers = pytest.importorskip("transformers", reason="transformers (requirements-dev.txt) is not installed")

TOKENIZER = os.path.join(REPO, "data", "demo", "tokenizer")
LOGIT_TOLERANCE = 1e-4
NEW_TOKENS = 20
# family -> (registry debug size, config overrides): baichuan 7B-style is LLaMA-shaped with RoPE (no ALiBi).
EXPORTED = {
    "llama": ("llama-debug", {"num_key_value_heads": 2, "rope_theta": 500000.0}),  # GQA, rope_theta != 1e4
    "llama3.1": ("llama-3.1-debug", {}),  # GQA, tied embeddings, llama3 RoPE scaling (Llama 3.1 / 3.2)
    "qwen2": ("qwen2-debug", {}),  # GQA, tied embeddings
    "qwen3": ("qwen3-debug", {}),  # per-head q/k norms, head_dim 128 != hidden / heads, GQA, tied embeddings
    "ernie4_5": ("ernie-4.5-debug", {}),  # RoPE on interleaved pairs, head_dim 128 != hidden / heads, GQA, tied
    "qwen": ("qwen-debug", {}),
    "baichuan": ("baichuan-debug", {"alibi": False}),
    "gpt3": ("gpt3-debug", {}),
}


def demo_ids(count: int = 64) -> np.ndarray:
    """[1, count] token ids of the first demo-corpus document (the demo tokenizer, as the runs use)."""
    from pretrain.tokenizers import load_tokenizer_from

    with open(os.path.join(REPO, "data", "demo", "corpus.jsonl"), encoding="utf-8") as f:
        text = json.loads(f.readline())["text"]
    ids = load_tokenizer_from(TOKENIZER)(text)["input_ids"][:count]
    assert len(ids) == count
    return np.array([ids])


def saved_debug_model(family: str, folder: str, tokenizer: str = TOKENIZER, **extra) -> paddle.nn.Layer:
    """The family's debug model (2 layers) with weights ~ N(0, 0.08), norms ~ 1 + N(0, 0.1), saved to ``folder``
    with the tokenizer of folder ``tokenizer``."""
    name, overrides = EXPORTED[family]
    arch = MODEL_SIZES[name]
    config = arch.model_config()
    for key, value in {"num_hidden_layers": 2, **overrides, **extra}.items():
        setattr(config, key, value)
    model = arch.implementation.model_class.from_config(config, dtype="float32")
    rng = np.random.RandomState(0)
    for param_name, param in model.state_dict().items():
        shape = param.shape
        is_norm = "norm" in param_name or "ln_" in param_name
        value = 1 + rng.normal(0, 0.1, shape) if is_norm and len(shape) == 1 else rng.normal(0, 0.08, shape)
        param.set_value(value.astype("float32"))
    model.eval()
    model.save_pretrained(folder)
    from pretrain.tokenizers import load_tokenizer_from

    load_tokenizer_from(tokenizer).save_pretrained(folder)
    return model


def paddle_logits(model, ids: np.ndarray) -> np.ndarray:
    with paddle.no_grad():
        out = model(paddle.to_tensor(ids))
    return (out[0] if isinstance(out, tuple) else out).numpy()


def torch_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.numpy()


def greedy(logits_of, ids: np.ndarray, steps: int = NEW_TOKENS) -> list:
    """``steps`` greedy tokens after ``ids`` (full recompute each step: no cache in either framework)."""
    ids = ids.copy()
    for _ in range(steps):
        next_id = int(logits_of(ids)[0, -1].argmax())
        ids = np.concatenate([ids, [[next_id]]], axis=1)
    return ids[0, -steps:].tolist()


def documented_dtype_keyword() -> str:
    """The keyword docs/models.md's snippet gives ``from_pretrained`` the dtype by, for the installed
    transformers: ``dtype`` from 4.56 on (``torch_dtype`` is deprecated in 5), ``torch_dtype`` before
    (4.55 refuses ``dtype``)."""
    with open(os.path.join(REPO, "docs", "models.md"), encoding="utf-8") as f:
        docs = f.read()
    found = re.search(
        r"transformers >= (\d+)\.(\d+) .*takes (\w+)=; .* older take (\w+)= instead\n.*from_pretrained", docs
    )
    assert found, "docs/models.md: the transformers snippet no longer names its dtype keyword by version"
    since = tuple(map(int, found.group(1, 2)))
    installed = tuple(int(part) for part in transformers.__version__.split(".")[:2])
    return found.group(3) if installed >= since else found.group(4)


def load_hf(folder: str, dtype=torch.float32):
    """``folder`` loaded as docs/models.md shows (``documented_dtype_keyword``)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, **{documented_dtype_keyword(): dtype})
    model.eval()
    return model


@pytest.mark.parametrize("family", list(EXPORTED))
def test_export_matches_transformers(family, tmp_path):
    model = saved_debug_model(family, str(tmp_path / "saved"))
    summary = export(str(tmp_path / "saved"), str(tmp_path / "hf"))
    hf_model = load_hf(str(tmp_path / "hf"))
    assert type(hf_model).__name__ == summary["architecture"]
    ids = demo_ids()
    diff = np.abs(paddle_logits(model, ids) - torch_logits(hf_model, ids)).max()
    print(f"{family}: export max |logit diff| {diff:.3g}")
    assert diff <= LOGIT_TOLERANCE
    prompt = ids[:, :16]
    assert greedy(lambda x: paddle_logits(model, x), prompt) == greedy(lambda x: torch_logits(hf_model, x), prompt)


# Text beyond the demo corpus: CJK, accents in both Unicode forms (NFC applies), emoji, digit runs, whitespace
# runs, contractions, and special-token text (paddlenlp's QWenTokenizer encodes it as the special id).
HARD_TEXTS = [
    "中文分词测试，你好世界！日本語のテキスト、한국어 텍스트",
    "naïve café Ünïcödé e\u0301 ﬁ ½ Ⅻ",
    "emoji 😀🎉 and\ttabs\t\tand\n\n\nnewlines   ",
    "  1234567890 3.14159 12345678901234567890 ٣٤٥",
    "'s 'T 'RE I'M don't WE'LL",
    "<|endoftext|> inside <|im_start|>user\nhi<|im_end|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|end_of_text|>",
]


@pytest.mark.parametrize(
    "family, tokenizer",
    [("qwen", "qwen"), ("gpt3", "gpt2"), pytest.param("llama", "llama3", marks=pytest.mark.slow)],  # 28 s under load
)
def test_exported_tokenizer_encodes_as_paddlenlp(family, tokenizer, tmp_path, real_tokenizers):
    """The exported tokenizer, loaded by transformers' AutoTokenizer with no custom code, gives paddlenlp's ids
    and text on demo-corpus documents and HARD_TEXTS: Qwen's and Llama 3's tiktoken vocabularies as a
    tokenizer.json (PreTrainedTokenizerFast; Llama 3's with the BOS paddlenlp adds), GPT-2's vocab.json +
    merges.txt (GPT2Tokenizer)."""
    import time

    from pretrain.tokenizers import load_tokenizer_from

    saved_debug_model(family, str(tmp_path / "saved"), tokenizer=real_tokenizers[tokenizer])
    start = time.perf_counter()
    summary = export(str(tmp_path / "saved"), str(tmp_path / "hf"))
    print(f"{tokenizer}: export with the tokenizer {time.perf_counter() - start:.1f} s: {summary['tokenizer_files']}")
    expected_class = {
        "qwen": "PreTrainedTokenizerFast",
        "gpt2": "GPT2TokenizerFast",
        "llama3": "PreTrainedTokenizerFast",
    }[tokenizer]
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert type(hf_tokenizer).__name__ == expected_class
    paddle_tokenizer = load_tokenizer_from(real_tokenizers[tokenizer])
    with open(os.path.join(REPO, "data", "demo", "corpus.jsonl"), encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line, _ in zip(f, range(40))] + HARD_TEXTS
    for text in texts:
        ids = paddle_tokenizer(text)["input_ids"]
        assert hf_tokenizer(text)["input_ids"] == ids, text[:80]
        # the text as encoded; the libraries differ only in default clean-up (paddlenlp's GPT-2 joins " 's")
        plain = {"clean_up_tokenization_spaces": False}
        assert hf_tokenizer.decode(ids, **plain) == paddle_tokenizer.decode(ids, **plain), text[:80]
    assert hf_tokenizer.eos_token_id == paddle_tokenizer.eos_token_id is not None
    assert len(hf_tokenizer) == len(paddle_tokenizer)


@pytest.mark.parametrize(
    "family, wrong",
    [
        ("llama", "q_k_swapped"),
        ("llama", "transpose_missing"),
        ("qwen3", "q_k_norms_swapped"),
        ("ernie4_5", "half_rotation"),
    ],
)
def test_a_wrong_mapping_fails_the_comparison(family, wrong, tmp_path, monkeypatch):
    """The check has teeth: one layer's q and k exchanged, q left untransposed, Qwen3's per-head q and k
    norms exchanged, or ERNIE-4.5's heads left in pair order (paddlenlp's Qwen2 RoPE, which rotates halves,
    on ERNIE's weights; measured max |logit diff| 6.8), is caught."""
    import pretrain.hf_export as hf_export
    import pretrain.models.ernie4_5 as ernie4_5

    if wrong == "half_rotation":
        monkeypatch.setattr(ernie4_5, "pairs_to_halves", lambda heads: heads)

    def broken(tensors, config, impl):
        out = dict(hf_tensors(tensors, config, impl))
        q, k = "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"
        if wrong == "q_k_swapped":
            out[q], out[k] = out[k], out[q]
        elif wrong == "q_k_norms_swapped":
            q, k = "model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"
            out[q], out[k] = out[k], out[q]
        elif wrong == "transpose_missing":
            out[q] = np.ascontiguousarray(out[q].T)
        return iter(out.items())

    monkeypatch.setattr(hf_export, "hf_tensors", broken)
    model = saved_debug_model(family, str(tmp_path / "saved"), num_key_value_heads=4)
    export(str(tmp_path / "saved"), str(tmp_path / "hf"))
    ids = demo_ids()
    assert np.abs(paddle_logits(model, ids) - torch_logits(load_hf(str(tmp_path / "hf")), ids)).max() > LOGIT_TOLERANCE


def _hf_tensors_of(folder: str) -> dict:
    from safetensors.numpy import load_file

    tensors = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(folder, name)))
    return tensors


def test_every_saved_layout_exports_the_same_tensors(tmp_path):
    """Single file, index-sharded safetensors, per-rank tensor-parallel and pipeline files: one export. The
    pipeline layouts hold the tied embedding on both stages, under its own name, as GPT-3's pipeline runs save it
    (per rank, and paddlenlp's unified checkpoint in two shards, its index naming one): before, the export wrote
    it twice into one shard, a file transformers refuses ("invalid offset"; found by the support matrix)."""
    from safetensors.numpy import save_file

    model = saved_debug_model("qwen2", str(tmp_path / "single"))
    reference = export(str(tmp_path / "single"), str(tmp_path / "hf_single"), max_shard_size="200KB")
    assert reference["shards"] > 1
    expected = _hf_tensors_of(str(tmp_path / "hf_single"))

    model.save_pretrained(str(tmp_path / "sharded"), safe_serialization=True, max_shard_size="300KB")
    config = load_local_config(str(tmp_path / "single"))
    impl = MODEL_SIZES["qwen2-debug"].implementation
    state = dict(saved_tensors(str(tmp_path / "single"), config, impl))
    embedding = "qwen2.embed_tokens.weight"
    assert embedding in state
    split_config = load_local_config(str(tmp_path / "single"))
    split_config.tensor_parallel_degree = 2
    for layout, files in {
        "tp": {
            f"model_state.tp0{rank}.pdparams": {
                name: actions[name](value) if name in actions else value for name, value in state.items()
            }
            for rank in range(2)
            for split_config.tensor_parallel_rank in [rank]
            for actions in [impl.model_class.get_tensor_parallel_convert_actions(split_config, list(state))]
        },
        "pp": {
            "model_state.pp00.pdparams": {k: v for k, v in state.items() if "layers.1" not in k},
            "model_state.pp01.pdparams": {k: v for k, v in state.items() if "layers.1" in k or k == embedding},
        },
        "unified pp": {
            "model-00001-of-00002.safetensors": {k: v for k, v in state.items() if "layers.1" not in k},
            "model-00002-of-00002.safetensors": {k: v for k, v in state.items() if "layers.1" in k or k == embedding},
        },
    }.items():
        folder = tmp_path / layout
        os.makedirs(folder)
        config.save_pretrained(str(folder))
        for name, part in files.items():
            if name.endswith(".safetensors"):
                save_file({k: np.asarray(v) for k, v in part.items()}, str(folder / name), metadata={"format": "np"})
            else:
                paddle.save({k: paddle.to_tensor(np.asarray(v)) for k, v in part.items()}, str(folder / name))
        if layout == "unified pp":  # the index names the first stage's file for the embedding
            owner = {k: name for name, part in reversed(list(files.items())) for k in part}
            with open(folder / "model.safetensors.index.json", "w") as f:
                json.dump({"metadata": {}, "weight_map": owner}, f)
    for layout in ("sharded", "tp", "pp", "unified pp"):
        export(str(tmp_path / layout), str(tmp_path / f"hf_{layout}"))
        got = _hf_tensors_of(str(tmp_path / f"hf_{layout}"))
        assert sorted(got) == sorted(expected), layout
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=f"{layout}: {name}")


def test_lora_run_exports_after_merge(tmp_path, demo_dir):
    """A real LoRA run (run_finetune.py, a few steps, merge_lora: true) exports from its merged/ folder and from
    tools/merge_lora.py's folder alike, and transformers computes the adapted model's logits (base + adapter,
    unmerged in paddlenlp); the adapter's run folder itself is refused, naming merged/."""
    from tiny_finetune import finetune_args, write_demo_pairs

    from pretrain.finetune.lora import load_lora_model

    base = str(tmp_path / "base")
    saved_debug_model("llama", base)
    pairs = write_demo_pairs(str(tmp_path), train=40, dev=8)
    run = str(tmp_path / "run")
    load_script("run_finetune.py").main(finetune_args(base, pairs, run, steps=6))
    merged = str(tmp_path / "merged")
    load_script("tools/merge_lora.py").main(["--base_model", base, "--lora_path", run, "--output", merged])
    adapted = load_lora_model(base, run)
    adapted.eval()
    ids = demo_ids()
    expected = paddle_logits(adapted, ids)
    assert expected.std() > 0.3  # logits far from uniform: a wrong mapping would show
    adapted.disable_lora()
    assert np.abs(paddle_logits(adapted, ids) - expected).max() > 1e-3  # the adapter changed the model
    for name, folder in {"run_merged": os.path.join(run, "merged"), "merge_lora": merged}.items():
        export(folder, str(tmp_path / f"hf_{name}"))
        diff = np.abs(torch_logits(load_hf(str(tmp_path / f"hf_{name}")), ids) - expected).max()
        print(f"LoRA via {name}: export max |logit diff| {diff:.3g}")
        assert diff <= LOGIT_TOLERANCE, name
    with pytest.raises(
        UserError, match=rf"holds a LoRA adapter \(lora_config.json\), not a model; export {run}/merged$"
    ):
        export(run, str(tmp_path / "hf_run"))


def test_export_dtype_and_shards(tmp_path):
    saved_debug_model("llama", str(tmp_path / "saved"))
    summary = export(str(tmp_path / "saved"), str(tmp_path / "hf"), dtype="bfloat16", max_shard_size="1MB")
    with open(tmp_path / "hf" / "model.safetensors.index.json", encoding="utf-8") as f:
        index = json.load(f)
    assert summary["shards"] == len(set(index["weight_map"].values())) > 1
    for shard in set(index["weight_map"].values()):  # at most 1 MB of tensors, or one larger tensor alone
        names = [name for name, file in index["weight_map"].items() if file == shard]
        assert len(names) == 1 or os.path.getsize(tmp_path / "hf" / shard) < 1e6 + 10_000
    tensors = _hf_tensors_of(str(tmp_path / "hf"))
    assert {str(v.dtype) for v in tensors.values()} == {"bfloat16"}
    with open(tmp_path / "hf" / "config.json", encoding="utf-8") as f:
        assert json.load(f)["torch_dtype"] == "bfloat16"
    assert {p.dtype for p in load_hf(str(tmp_path / "hf"), torch.bfloat16).parameters()} == {torch.bfloat16}
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2GiB") == 2 * 2**30


def test_cli_refuses_alibi_with_one_line_and_status_2(tmp_path):
    from conftest import run_script

    saved_debug_model("baichuan", str(tmp_path / "alibi"), alibi=True)
    result = run_script("tools/export_hf.py", str(tmp_path / "alibi"), "--output", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {tmp_path / 'alibi'}: cannot export")
    assert not os.path.exists(tmp_path / "out")


def test_alibi_and_bad_output_are_one_line_errors(tmp_path):
    saved_debug_model("baichuan", str(tmp_path / "alibi"), alibi=True)
    with pytest.raises(UserError, match=r"cannot export to Hugging Face transformers: alibi: true \(Baichuan-13B"):
        export(str(tmp_path / "alibi"), str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out") and not list(tmp_path.glob("out.partial*"))
    os.makedirs(tmp_path / "full")
    (tmp_path / "full" / "x").write_text("keep")
    with pytest.raises(UserError, match="exists and is not an empty folder"):
        export(str(tmp_path / "alibi"), str(tmp_path / "full"))
    assert (tmp_path / "full" / "x").read_text() == "keep"
    with pytest.raises(UserError, match=r"^--output \S+/full/x is a file; give a new folder"):
        export(str(tmp_path / "alibi"), str(tmp_path / "full" / "x"))
    assert (tmp_path / "full" / "x").read_text() == "keep"


def saved_with_one_value(folder: str, value: float) -> str:
    """The llama debug model saved to ``folder`` with one weight of layer 0's down_proj set to ``value``;
    returns that tensor's transformers name."""
    model = saved_debug_model("llama", folder)
    weight = model.llama.layers[0].mlp.down_proj.weight
    values = weight.numpy()
    values[3, 5] = value
    weight.set_value(values)
    model.save_pretrained(folder)
    return "model.layers.0.mlp.down_proj.weight"


@pytest.mark.parametrize(
    "dtype, value, message",
    [
        (
            "float16",
            1e5,
            r"max \|value\| 1e\+05 is past the range of float16 \(largest finite 65504\); export with "
            r"--dtype float32 or bfloat16$",
        ),
        ("float16", -7e4, r"max \|value\| 7e\+04 is past the range of float16"),
        ("bfloat16", np.nan, r" holds 1 NaN/inf value\(s\): the saved model has diverged; export a checkpoint"),
        ("bfloat16", np.inf, r" holds 1 NaN/inf value\(s\)"),
        ("float32", np.nan, r" holds 1 NaN/inf value\(s\)"),
    ],
)
def test_a_tensor_the_dtype_cannot_hold_is_refused_and_nothing_written(dtype, value, message, tmp_path):
    name = saved_with_one_value(str(tmp_path / "saved"), value)
    with pytest.raises(UserError, match=f"^tensor {re.escape(name)}.*{message}"):
        export(str(tmp_path / "saved"), str(tmp_path / "hf"), dtype=dtype)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["saved"]  # no folder, no partial one
    saved_with_one_value(str(tmp_path / "saved"), 6e4)  # within float16's range: exported as it is
    export(str(tmp_path / "saved"), str(tmp_path / "hf"), dtype="float16")
    assert _hf_tensors_of(str(tmp_path / "hf"))[name][5, 3] == np.float16(6e4)


def test_values_float16_writes_as_zero_are_counted_per_tensor_in_one_line(tmp_path):
    """One weight of 1e-8 (float16 rounds up to 2.98e-8 to 0) and whatever the random init holds that small: the
    float16 export counts each tensor's nonzero values written as 0, as numpy's cast of the float32 export's
    tensors gives them, and says so in one warning line; bfloat16 loses none.

    Today's main: the export writes them as 0 and says nothing (its summary has no "flushed" or "warnings")."""
    name = saved_with_one_value(str(tmp_path / "saved"), 1e-8)
    export(str(tmp_path / "saved"), str(tmp_path / "f32"), dtype="float32")
    expected = {}
    for tensor, array in _hf_tensors_of(str(tmp_path / "f32")).items():
        lost = np.count_nonzero(array) - np.count_nonzero(array.astype(np.float16))
        if lost:
            expected[tensor] = lost
    summary = export(str(tmp_path / "saved"), str(tmp_path / "f16"), dtype="float16")
    assert summary["flushed"] == expected and expected[name] >= 1
    counts = ", ".join(f"{tensor} {count}" for tensor, count in sorted(expected.items(), key=lambda item: -item[1]))
    assert summary["warnings"] == [
        f"--dtype float16: {sum(expected.values())} nonzero value(s) in {len(expected)} tensor(s) were written as 0 "
        f"(|value| <= 2.98e-08, half float16's smallest 5.96e-08): {counts}; export with --dtype float32 or bfloat16 "
        "to keep them"
    ]
    assert _hf_tensors_of(str(tmp_path / "f16"))[name][5, 3] == 0
    assert export(str(tmp_path / "saved"), str(tmp_path / "bf16"), dtype="bfloat16")["flushed"] == {}


def test_deepseek_v2_yarn_export_says_transformers_4_computes_other_logits():
    """Today's main: the export of a DeepSeek-V2 with mscale_all_dim (the registry's, 0.707) says nothing."""
    from pretrain.hf_export import transformers_version_warning

    def warning(name: str, config=None):
        arch = MODEL_SIZES[name]
        return transformers_version_warning(config or arch.model_config(), arch.implementation.hf.architecture)

    assert warning("deepseek_v2-debug") == (
        "DeepSeek-V2's YaRN (mscale_all_dim 0.707): transformers 5 computes the model's logits; transformers 4.x's "
        "DeepseekV2Attention leaves out YaRN's attention scale and computes others (docs/models.md, \"From and to "
        'Hugging Face"): load the export with transformers >= 5'
    )
    assert warning("deepseek_v3-debug") is None  # transformers 4.x's DeepseekV3Attention applies the scale
    without = MODEL_SIZES["deepseek_v2-debug"].model_config()
    without.rope_scaling = {key: value for key, value in without.rope_scaling.items() if key != "mscale_all_dim"}
    assert warning("deepseek_v2-debug", without) is None


def test_cli_float16_overflow_is_one_line_and_status_2(tmp_path):
    from conftest import run_script

    name = saved_with_one_value(str(tmp_path / "saved"), 1e5)
    result = run_script(
        "tools/export_hf.py", str(tmp_path / "saved"), "--output", str(tmp_path / "out"), "--dtype", "float16"
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: tensor {name}: max |value| 1e+05 is past the range of float16 (largest finite 65504); export with "
        "--dtype float32 or bfloat16"
    )
    assert "RuntimeWarning" not in result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["saved"]


# --- import: a transformers model as the start of a run ---------------------------------------------

# family -> (demo config, transformers model factory); vocab 8064 > the demo tokenizer's 8000 (padded).
SMALL = dict(vocab_size=8064, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)


def test_a_killed_exports_partial_folder_is_removed_by_the_next(tmp_path):
    saved_debug_model("llama", str(tmp_path / "model"))
    ended = subprocess.Popen(["true"])
    ended.wait()  # its pid stands for an export the OOM killer ended
    stale = tmp_path / f"out.partial.{socket.gethostname()}.{ended.pid}"
    stale.mkdir()
    (stale / "model-00001-of-00002.safetensors").write_bytes(b"half written")
    export(str(tmp_path / "model"), str(tmp_path / "out"))
    assert not stale.exists() and (tmp_path / "out" / "config.json").is_file()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model", "out"]


def _llama():
    config = transformers.LlamaConfig(
        **SMALL, num_key_value_heads=2, rope_theta=500000.0, rms_norm_eps=1e-5, max_position_embeddings=256
    )
    return transformers.LlamaForCausalLM(config)


def _baichuan_7b_style():
    """Baichuan-7B / Baichuan2-7B converted to the Llama layout: full multi-head attention, RoPE theta 1e4, eps 1e-6."""
    config = transformers.LlamaConfig(**SMALL, num_key_value_heads=4, rms_norm_eps=1e-6, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(config)


def _qwen2():
    config = transformers.Qwen2Config(**SMALL, num_key_value_heads=2, tie_word_embeddings=True)
    return transformers.Qwen2ForCausalLM(config)


def _qwen3():
    """Qwen3 with q wider than hidden (4 heads of 32 on 64) and untied embeddings (Qwen3-8B and up)."""
    config = transformers.Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=32, rope_theta=1e6)
    return transformers.Qwen3ForCausalLM(config)


def _ernie4_5():
    """ERNIE-4.5 with q wider than hidden (4 heads of 32 on 64), tied embeddings (as every published size)."""
    config = transformers.Ernie4_5Config(
        **SMALL, num_key_value_heads=2, head_dim=32, rope_theta=500000.0, tie_word_embeddings=True
    )
    return transformers.Ernie4_5ForCausalLM(config)


def _gpt2():
    config = transformers.GPT2Config(
        vocab_size=8064, n_embd=64, n_layer=2, n_head=4, n_positions=256, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0
    )
    return transformers.GPT2LMHeadModel(config)


def save_as_qwen_v1(qwen2, folder: str) -> None:
    """A Qwen (v1) remote-code folder (QWenLMHeadModel names, fused c_attn) holding ``qwen2``'s weights."""
    from safetensors.torch import save_file

    c = qwen2.config
    tensors = {
        "transformer.wte.weight": qwen2.model.embed_tokens.weight,
        "transformer.ln_f.weight": qwen2.model.norm.weight,
    }
    tensors["lm_head.weight"] = qwen2.lm_head.weight
    for i, layer in enumerate(qwen2.model.layers):
        attn, mlp, h = layer.self_attn, layer.mlp, f"transformer.h.{i}."
        tensors[h + "attn.c_attn.weight"] = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        tensors[h + "attn.c_attn.bias"] = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
        tensors[h + "attn.c_proj.weight"] = attn.o_proj.weight
        tensors[h + "mlp.w1.weight"], tensors[h + "mlp.w2.weight"] = mlp.up_proj.weight, mlp.gate_proj.weight
        tensors[h + "mlp.c_proj.weight"] = mlp.down_proj.weight
        tensors[h + "ln_1.weight"], tensors[h + "ln_2.weight"] = (
            layer.input_layernorm.weight,
            layer.post_attention_layernorm.weight,
        )
    os.makedirs(folder)
    save_file(
        {k: v.detach().contiguous() for k, v in tensors.items()},
        os.path.join(folder, "model.safetensors"),
        metadata={"format": "pt"},
    )
    config = {
        "architectures": ["QWenLMHeadModel"],
        "model_type": "qwen",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "kv_channels": c.hidden_size // c.num_attention_heads,
        "intermediate_size": 2 * c.intermediate_size,
        "layer_norm_epsilon": c.rms_norm_eps,
        "rotary_emb_base": c.rope_theta,
        "rotary_pct": 1.0,
        "max_position_embeddings": 256,
        "seq_length": 256,
        "no_bias": True,
        "tie_word_embeddings": False,
    }
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)


def _qwen2_untied():
    config = transformers.Qwen2Config(**SMALL, num_key_value_heads=4, tie_word_embeddings=False, rope_theta=10000.0)
    return transformers.Qwen2ForCausalLM(config)


def _qwen2_moe():
    """4 routed experts (top 2) and a gated shared expert; router aux coefficient 0.01, not paddlenlp's default."""
    config = transformers.Qwen2MoeConfig(
        **SMALL, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, router_aux_loss_coef=0.01, max_position_embeddings=256,
    )  # fmt: skip
    return transformers.Qwen2MoeForCausalLM(config)


def _qwen3_moe():
    """Qwen3-MoE: per-head q/k norms (head_dim 32), 4 routed experts (top 2, weights renormalised), no shared
    expert; layer 2 of 4 dense (mlp_only_layers); router aux coefficient 0.01, not the published 0.001."""
    config = transformers.Qwen3MoeConfig(
        **{**SMALL, "num_hidden_layers": 4}, num_key_value_heads=2, head_dim=32, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[2], router_aux_loss_coef=0.01,
        max_position_embeddings=256, rope_theta=1e6,
    )  # fmt: skip
    return transformers.Qwen3MoeForCausalLM(config)


def _mixtral():
    config = transformers.MixtralConfig(
        **SMALL, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.03,
        max_position_embeddings=256, rope_theta=1e6,
    )  # fmt: skip
    return transformers.MixtralForCausalLM(config)


def _deepseek_v2():
    """MLA with query compression (q_a_proj, its norm, q_b_proj), a dense first layer, 4 routed experts (top 2) and
    a shared one; YaRN over 64 x 4 positions, without mscale_all_dim: transformers 4.x's DeepseekV2Attention
    leaves out the softmax scaling it implies (transformers 5 applies it, as paddlenlp and DeepSeek's code do)."""
    config = transformers.DeepseekV2Config(
        **SMALL, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
        first_k_dense_replace=1, topk_method="greedy", n_group=1, topk_group=1, aux_loss_alpha=0.003,
        max_position_embeddings=256, rope_scaling={"rope_type": "yarn", "factor": 4.0,
        "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1},
    )  # fmt: skip
    return transformers.DeepseekV2ForCausalLM(config)


def _deepseek_v3():
    """DeepSeek-V3's routing: sigmoid scores, noaux_tc within 2 of 4 groups (8 experts, top-2), the routing bias,
    renormalised weights scaled by 2.5; YaRN with mscale = mscale_all_dim (transformers' DeepseekV3Attention
    applies the softmax scaling)."""
    config = transformers.DeepseekV3Config(
        **SMALL, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
        n_group=4,
        topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5, max_position_embeddings=256,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32,
        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    )  # fmt: skip
    model = transformers.DeepseekV3ForCausalLM(config)
    model.model.layers[1].mlp.gate.e_score_correction_bias.normal_(0.0, 0.3)  # a buffer: chooses other experts
    return model


def _ernie4_5_moe():
    """ERNIE-4.5 MoE: q wider than hidden (4 heads of 32 on 64), tied embeddings, a dense first layer then 4
    routed experts (top 2, renormalised) and 2 shared ones (one MLP of 2 x 32); router aux coefficient 0.01, not
    the published 0.001. ``randomized`` draws each layer's routing bias too, so it chooses other experts."""
    config = transformers.Ernie4_5_MoeConfig(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=2, head_dim=32, moe_num_experts=4, moe_k=2,
        moe_intermediate_size=32, moe_num_shared_experts=2, moe_layer_start_index=1, router_aux_loss_coef=0.01,
        max_position_embeddings=256, rope_theta=500000.0, tie_word_embeddings=True,
    )  # fmt: skip
    return transformers.Ernie4_5_MoeForCausalLM(config)


IMPORTED = {
    "llama": ("llama", _llama),
    "baichuan": ("baichuan", _baichuan_7b_style),
    "qwen2": ("qwen2", _qwen2),
    "qwen3": ("qwen3", _qwen3),
    "ernie4_5": ("ernie4_5", _ernie4_5),
    "qwen": ("qwen", _qwen2_untied),  # saved as a Qwen v1 folder
    "gpt3": ("gpt3", _gpt2),
    "qwen2_moe": ("qwen2_moe", _qwen2_moe),
    "qwen3_moe": ("qwen3_moe", _qwen3_moe),
    "mixtral": ("mixtral", _mixtral),
    "deepseek_v2": ("deepseek_v2", _deepseek_v2),
    "deepseek_v3": ("deepseek_v3", _deepseek_v3),
    "ernie4_5_moe": ("ernie4_5_moe", _ernie4_5_moe),
}
BATCH = 4


def _continue_argv(family: str, source: str, output: str, cache: str, *extra: str) -> list:
    config = os.path.join(REPO, "config", IMPORTED[family][0], "pretrain_demo_cpu.json")
    return [
        config,
        *("--model_name_or_path", source, "--continue_training", "true", "--tokenizer_name_or_path", TOKENIZER),
        *("--output_dir", output, "--data_cache", cache, *SHORT_DEMO_RUN, "--max_steps", "1", *extra),
    ]


def randomized(hf_model):
    """``hf_model`` in eval mode with weights ~ N(0, 0.08), norms ~ 1 + N(0, 0.1), from torch's generator
    (transformers' own init, N(0, 0.02), leaves every logit near ln V and would hide a wrong mapping)."""
    hf_model.eval()
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            is_norm = param.dim() == 1 and ("norm" in name or "ln_" in name)
            param.copy_(1 + 0.1 * torch.randn_like(param) if is_norm else 0.08 * torch.randn_like(param))
    return hf_model


def hf_source(family: str, folder: str):
    """A random transformers model of ``family`` (``randomized``, seed 0) saved to ``folder``."""
    torch.manual_seed(0)
    hf_model = randomized(IMPORTED[family][1]())
    if family == "qwen":
        save_as_qwen_v1(hf_model, folder)
    else:
        hf_model.save_pretrained(folder)
    return hf_model


def router_aux_term(hf_model, ids) -> float:
    """What a run adds to the loss of a mixture of experts on ``ids``: ``router_aux_loss_coef`` x transformers'
    load-balancing loss of its router logits (0.0 for a dense model, or one whose model adds its loss itself).
    Mixtral's function for every family (the same code; transformers 4.55's Qwen2-MoE copy reads the device's
    index, which a CPU tensor has not)."""
    config = hf_model.config
    impl = IMPLEMENTATIONS.get(config.model_type)
    if impl is None or impl.routing is None or impl.routing.aux_loss_in_model:
        return 0.0  # a dense model; or the model adds its loss to the gradient only (DeepSeek, ERNIE-4.5-MoE)
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    router_logits = hf_model.model(ids, output_router_logits=True).router_logits
    experts = getattr(config, "num_experts", None) or config.num_local_experts
    aux = load_balancing_loss_func(router_logits, experts, config.num_experts_per_tok)
    return config.router_aux_loss_coef * float(aux)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(IMPORTED))
def test_first_loss_equals_transformers_loss(family, tmp_path, demo_dir):
    from pretrain.data import build_datasets, collate_causal_lm
    from pretrain.model import build_model

    hf_model = hf_source(family, str(tmp_path / "hf"))
    argv = _continue_argv(family, str(tmp_path / "hf"), str(tmp_path / "run"), str(tmp_path / "cache"))
    plan = resolve_plan(argv)
    model = build_model(plan)  # what the run starts from
    model.eval()
    summary = load_script("run_pretrain.py").main(argv)
    train, _, _ = build_datasets(plan)
    batch = collate_causal_lm([train[i] for i in range(BATCH)])
    with torch.no_grad():
        logits = hf_model(torch.tensor(batch["input_ids"])).logits.double()
        aux_term = router_aux_term(hf_model, torch.tensor(batch["input_ids"]))
    labels = torch.tensor(batch["labels"]).reshape(-1)
    loss = float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels)) + aux_term
    diff = np.abs(paddle_logits(model, batch["input_ids"]) - logits.numpy()).max()
    print(
        f"{family}: import max |logit diff| {diff:.3g}; first loss {summary['train_loss_first']:.7f}, "
        f"transformers {loss:.7f}"
    )
    assert diff <= LOGIT_TOLERANCE
    assert summary["train_loss_first"] == pytest.approx(loss, rel=1e-5)
    assert float(logits.std()) > 0.3, float(logits.std())  # logits far from uniform: a wrong mapping would show


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen2_moe", "mixtral", "deepseek_v2"])
def test_learning_rate_zero_then_export_is_the_identity(family, tmp_path, demo_dir):
    """A run's output_dir exports to the tensors it started from, bit for bit (mixtures of experts included)."""
    hf_source(family, str(tmp_path / "hf"))
    zero = ("--learning_rate", "0", "--min_learning_rate", "0")
    argv = _continue_argv(family, str(tmp_path / "hf"), str(tmp_path / "run"), str(tmp_path / "cache"), *zero)
    load_script("run_pretrain.py").main(argv)
    export(str(tmp_path / "run"), str(tmp_path / "back"), dtype="float32", tokenizer=False)
    original, back = _hf_tensors_of(str(tmp_path / "hf")), _hf_tensors_of(str(tmp_path / "back"))
    assert sorted(original) == sorted(back)
    for name in original:
        np.testing.assert_array_equal(back[name], original[name], err_msg=name)


def test_preflight_refuses_a_tensor_that_does_not_fit(tmp_path, demo_dir):
    hf_source("llama", str(tmp_path / "hf"))
    config_file = tmp_path / "hf" / "config.json"
    config = json.loads(config_file.read_text())
    config["intermediate_size"] = 96  # the saved tensors are 128 wide
    config_file.write_text(json.dumps(config))
    argv = _continue_argv("llama", str(tmp_path / "hf"), str(tmp_path / "run"), str(tmp_path / "cache"))
    with pytest.raises(UserError) as error:
        load_script("run_pretrain.py").main(argv)
    assert "tensor model.layers.0.mlp.gate_proj.weight of" in str(error.value)
    assert "has shape [128, 64], but this run's architecture needs [96, 64]" in str(error.value)
    assert not os.path.exists(tmp_path / "run" / "model_state.pdparams")


def test_unsupported_transformers_config_is_one_line(tmp_path):
    hf_source("llama", str(tmp_path / "hf"))
    config_file = tmp_path / "hf" / "config.json"
    config = json.loads(config_file.read_text())
    config["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0}
    config_file.write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"cannot start from this Hugging Face model: rope_type 'llama3' without "):
        load_local_config(str(tmp_path / "hf"))


# --- RoPE in transformers 4.x's and 5's config.json forms --------------------------------------------

# The config.json transformers 5.24 wrote for each case (tests/fixtures/README.md): RoPE only in
# rope_parameters. Beside each, the same RoPE in transformers 4.x's keys, which the installed 4.x writes.
TRANSFORMERS5_CONFIGS = os.path.join(REPO, "tests", "fixtures", "transformers5_configs.json")
ROPE_4X = {
    "llama_theta": {"rope_theta": 500000.0},
    "llama_linear": {"rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
    # max_position_embeddings 32: the 64-token text is past it, where the dynamic base changes
    "llama_dynamic": {"rope_theta": 10000.0, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
    "llama_llama3": {
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            **{"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        },
    },
    "qwen2_theta": {"rope_theta": 1000000.0},
}


def transformers5_config(case: str) -> dict:
    with open(TRANSFORMERS5_CONFIGS, encoding="utf-8") as f:
        return json.load(f)[case]


def rope_folders(case: str, root) -> tuple:
    """(transformers model, {form: folder}): a random model with the RoPE of ``case``, built by the installed
    transformers from the 4.x keys and saved by it ("4.x"); the same weights with transformers 5's config.json ("5")."""
    import shutil

    config5 = transformers5_config(case)
    fields = {k: v for k, v in config5.items() if k not in ("rope_parameters", "transformers_version", "model_type")}
    config = transformers.AutoConfig.for_model(config5["model_type"], **fields, **ROPE_4X[case])
    torch.manual_seed(0)
    hf_model = randomized(transformers.AutoModelForCausalLM.from_config(config))
    hf_model.save_pretrained(str(root / "4.x"))
    shutil.copytree(root / "4.x", root / "5")
    (root / "5" / "config.json").write_text(json.dumps(config5))
    return hf_model, {"4.x": str(root / "4.x"), "5": str(root / "5")}


def imported_model(family: str, folder: str, root):
    """The model a run of ``family``'s demo config with ``continue_training`` from the transformers folder
    ``folder`` starts from."""
    from pretrain.model import build_model

    model = build_model(resolve_plan(_continue_argv(family, folder, str(root / "run"), str(root / "cache"))))
    model.eval()
    return model


@pytest.mark.parametrize("case", list(ROPE_4X))
def test_rope_of_both_transformers_forms_imports_and_exports(case, tmp_path, demo_dir):
    """A folder in transformers 5's form (rope_parameters only) and one in 4.x's form (rope_theta, rope_scaling)
    import to the logits transformers computes (within 1e-4); the export writes both forms, its rope_parameters
    as transformers 5 wrote them, and the installed transformers computes the same logits from it, as does a
    run importing it again."""
    hf_model, folders = rope_folders(case, tmp_path)
    ids = demo_ids()
    expected = torch_logits(hf_model, ids)
    for form, folder in folders.items():
        model = imported_model(case.split("_")[0], folder, tmp_path / form)
        diff = np.abs(paddle_logits(model, ids) - expected).max()
        print(f"{case}, transformers {form} form: import max |logit diff| {diff:.3g}")
        assert diff <= LOGIT_TOLERANCE, form
    model.save_pretrained(str(tmp_path / "saved"))
    export(str(tmp_path / "saved"), str(tmp_path / "exported"), tokenizer=False)
    written = json.loads((tmp_path / "exported" / "config.json").read_text())
    rope = transformers5_config(case)["rope_parameters"]
    assert written["rope_parameters"] == rope
    assert written["rope_theta"] == rope["rope_theta"]
    assert written["rope_scaling"] == (
        {k: v for k, v in rope.items() if k != "rope_theta"} if "factor" in rope else None
    )
    diff = np.abs(torch_logits(load_hf(str(tmp_path / "exported")), ids) - expected).max()
    print(f"{case}: export max |logit diff| {diff:.3g}")
    assert diff <= LOGIT_TOLERANCE
    back = imported_model(case.split("_")[0], str(tmp_path / "exported"), tmp_path / "back")  # both forms at once
    assert np.abs(paddle_logits(back, ids) - expected).max() <= LOGIT_TOLERANCE


def _llama31_tied(high_freq_factor: float = 4.0):
    """Llama-3.2-1B's parts at SMALL's scale: GQA, tied embeddings, llama3 RoPE scaling (factor 32, low 1, high
    ``high_freq_factor``); its original length 16 makes the scaling change wavelengths from 4 positions up."""
    scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": high_freq_factor}
    config = transformers.LlamaConfig(
        **SMALL,
        num_key_value_heads=2,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        rope_scaling={**scaling, "original_max_position_embeddings": 16},
    )
    torch.manual_seed(0)
    return randomized(transformers.LlamaForCausalLM(config))


def test_llama3_scaling_with_tied_embeddings_imports_and_exports(tmp_path, demo_dir):
    """Llama 3.2's form (llama3 RoPE scaling, tied input and output embeddings) imports to transformers' logits and
    exports back to them (within 1e-4), tied (no lm_head tensor written); the check has teeth: the same weights under
    a config.json whose high_freq_factor is 2 instead of 4 differ, on import and on export."""
    hf_model = _llama31_tied()
    hf_model.save_pretrained(str(tmp_path / "hf"))
    ids = demo_ids()
    expected = torch_logits(hf_model, ids)
    model = imported_model("llama", str(tmp_path / "hf"), tmp_path / "run")
    diff = np.abs(paddle_logits(model, ids) - expected).max()
    print(f"llama3 scaling, tied: import max |logit diff| {diff:.3g}")
    assert diff <= LOGIT_TOLERANCE
    model.save_pretrained(str(tmp_path / "saved"))
    export(str(tmp_path / "saved"), str(tmp_path / "exported"), tokenizer=False)
    written = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert written["tie_word_embeddings"] is True and "lm_head.weight" not in _hf_tensors_of(str(tmp_path / "exported"))
    assert written["rope_scaling"] == {**hf_model.config.rope_scaling, "rope_type": "llama3"}
    diff = np.abs(torch_logits(load_hf(str(tmp_path / "exported")), ids) - expected).max()
    print(f"llama3 scaling, tied: export max |logit diff| {diff:.3g}")
    assert diff <= LOGIT_TOLERANCE

    wrong = _llama31_tied(high_freq_factor=2.0).config.to_dict()
    for folder in ("hf", "exported"):
        config_file = tmp_path / folder / "config.json"
        config_file.write_text(
            json.dumps({**json.loads(config_file.read_text()), "rope_scaling": wrong["rope_scaling"]})
        )
    if "rope_parameters" in written:  # the export's transformers 5 form says the same
        config_file = tmp_path / "exported" / "config.json"
        rope = {**written["rope_parameters"], "high_freq_factor": 2.0}
        config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "rope_parameters": rope}))
    wrong_import = np.abs(
        paddle_logits(imported_model("llama", str(tmp_path / "hf"), tmp_path / "wrong"), ids) - expected
    )
    wrong_export = np.abs(torch_logits(load_hf(str(tmp_path / "exported")), ids) - expected)
    print(f"high_freq_factor 2: import {wrong_import.max():.3g}, export {wrong_export.max():.3g} max |logit diff|")
    assert wrong_import.max() > 1e-3 and wrong_export.max() > 1e-3


def test_a_llama31_run_trains_with_the_llama3_scaling_and_exports_it(tmp_path, demo_dir):
    """The Llama 3.1 CPU demo (llama-3.1-debug: llama3 RoPE scaling, tied embeddings) builds paddlenlp's
    Llama3RotaryEmbedding, trains, and its saved model exports to transformers' logits (within 1e-4)."""
    from paddlenlp.transformers import AutoModelForCausalLM

    from pretrain.model import build_model

    config = os.path.join(REPO, "config", "llama", "pretrain_demo_cpu_llama3.1.json")
    run = str(tmp_path / "run")
    argv = [config, "--output_dir", run, "--data_cache", str(tmp_path / "cache"), *SHORT_DEMO_RUN, "--max_steps", "2"]
    rotary = build_model(resolve_plan(argv)).llama.layers[0].self_attn.rotary_emb
    assert (type(rotary).__name__, rotary.factor, rotary.original_max_position_embeddings) == (
        "Llama3RotaryEmbedding",
        8.0,
        128,
    )
    load_script("run_pretrain.py").main(argv)
    export(run, str(tmp_path / "hf"), dtype="float32", tokenizer=False)
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert written["rope_scaling"] == {**MODEL_SIZES["llama-3.1-debug"].config["rope_scaling"], "rope_type": "llama3"}
    assert written["tie_word_embeddings"] is True
    trained = AutoModelForCausalLM.from_pretrained(run, dtype="float32")
    trained.eval()
    ids = demo_ids()
    diff = np.abs(paddle_logits(trained, ids) - torch_logits(load_hf(str(tmp_path / "hf")), ids)).max()
    print(f"llama-3.1-debug trained 2 steps: export max |logit diff| {diff:.3g}")
    assert diff <= LOGIT_TOLERANCE


def test_ignoring_rope_parameters_fails_the_comparison(tmp_path, demo_dir, monkeypatch):
    """The check has teeth: read as before (transformers 5's rope_parameters unseen), theta 500000 with linear
    scaling x2 imports as plain RoPE with theta 10000, and the logits differ."""
    import pretrain.hf_import as hf_import

    hf_model, folders = rope_folders("llama_linear", tmp_path)
    monkeypatch.setattr(
        hf_import, "read_rope", lambda hf_config, config_file: {"rope_type": "default", "rope_theta": 1e4}
    )
    ids = demo_ids()
    assert (
        np.abs(paddle_logits(imported_model("llama", folders["5"], tmp_path), ids) - torch_logits(hf_model, ids)).max()
        > 1e-3
    )


@pytest.mark.parametrize(
    "case, change, message",
    [
        (
            "llama_yarn",
            {},
            r"rope_type 'yarn' \(\{.*\}\); paddlenlp's model computes rope_type 'default' or 'linear' or",
        ),
        (
            "qwen2_theta",
            {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}},
            r"rope_type 'linear' \(.*\); paddlenlp's model computes rope_type 'default'$",
        ),
        (
            "llama_theta",
            {"rope_theta": 10000.0},
            r"config.json: rope_theta 10000.0 and rope_parameters.rope_theta 500000.0 disagree \(the transformers 4.x "
            r"and 5 forms of the same RoPE\); keep one of them$",
        ),
        (
            "llama_linear",
            {"rope_scaling": {"type": "linear", "factor": 4.0}},
            r"rope_scaling.factor 4.0 and rope_parameters.factor 2.0 disagree",
        ),
    ],
)
def test_a_rope_paddlenlp_does_not_compute_is_refused_in_one_line(case, change, message, tmp_path):
    os.makedirs(tmp_path / "hf")
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**transformers5_config(case), **change}))
    hf_source("llama", str(tmp_path / "weights"))  # any torch-layout weights: the config is refused first
    os.rename(tmp_path / "weights" / "model.safetensors", tmp_path / "hf" / "model.safetensors")
    with pytest.raises(UserError, match=message) as error:
        load_local_config(str(tmp_path / "hf"))
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_trained_demo_model_continues_romeo_alike_in_transformers(tmp_path, demo_dir):
    """The README's demo config, trained a few steps, exported: transformers' tokenizer gives the same ids and
    its greedy continuation of "ROMEO:" is paddlenlp's (pretrain.finetune.generate, what tools/generate.py uses)."""
    from paddlenlp.transformers import AutoModelForCausalLM

    from pretrain.finetune.generate import generate_greedy
    from pretrain.tokenizers import load_tokenizer_from

    config = os.path.join(REPO, "config", "llama", "pretrain_demo_cpu.json")
    run = str(tmp_path / "demo")
    argv = [config, "--output_dir", run, "--data_cache", str(tmp_path / "cache"), *SHORT_DEMO_RUN, "--max_steps", "8"]
    load_script("run_pretrain.py").main(argv)
    load_script("tools/export_hf.py").main([run, "--output", str(tmp_path / "hf")])

    tokenizer = load_tokenizer_from(run)
    model = AutoModelForCausalLM.from_pretrained(run)
    model.eval()
    expected = generate_greedy(model, tokenizer, "ROMEO:", NEW_TOKENS)
    assert expected  # something to compare: not an immediate end of text

    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    hf_model = load_hf(str(tmp_path / "hf"))
    inputs = hf_tokenizer("ROMEO:", return_tensors="pt")
    assert inputs["input_ids"][0].tolist() == tokenizer("ROMEO:")["input_ids"]
    with torch.no_grad():
        out = hf_model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    generated = out[0, inputs["input_ids"].shape[1] :].tolist()
    if tokenizer.eos_token_id in generated:
        generated = generated[: generated.index(tokenizer.eos_token_id)]
    assert generated == expected
    assert hf_tokenizer.decode(generated) == tokenizer.decode(expected)


@pytest.mark.parametrize("weights", ["bf16_safetensors", "pytorch_bin"])
def test_other_weight_files_load_alike(weights, tmp_path, demo_dir):
    """A bfloat16 checkpoint (upcast exactly to the run's float32) and a pytorch_model.bin folder (read by
    paddlenlp's load_torch, no torch needed) give the model transformers computes."""
    from pretrain.model import build_model

    hf_model = hf_source("llama", str(tmp_path / "fp32"))
    if weights == "bf16_safetensors":
        with torch.no_grad():  # the reference: bfloat16 values computed in float32 (RoPE buffers untouched)
            for param in hf_model.parameters():
                param.copy_(param.to(torch.bfloat16).to(torch.float32))
        copy.deepcopy(hf_model).to(torch.bfloat16).save_pretrained(str(tmp_path / "hf"))
    else:
        hf_model.save_pretrained(str(tmp_path / "hf"), safe_serialization=False)
        assert os.path.isfile(tmp_path / "hf" / "pytorch_model.bin")
    model = build_model(resolve_plan(_continue_argv("llama", str(tmp_path / "hf"), str(tmp_path / "run"), "cache")))
    model.eval()
    ids = demo_ids()
    assert np.abs(paddle_logits(model, ids) - torch_logits(hf_model, ids)).max() <= LOGIT_TOLERANCE


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "ernie4_5"])
def test_fused_qkv_and_ffn_both_ways(family, tmp_path, demo_dir):
    """fuse_attention_qkv/ffn runs: the import fuses with paddlenlp's actions, the export splits again
    (config.json does not record the fusion; the names do)."""
    from pretrain.model import build_model

    hf_model = hf_source(family, str(tmp_path / "hf"))
    fused = ("--fuse_attention_qkv", "true", "--fuse_attention_ffn", "true")
    argv = _continue_argv(family, str(tmp_path / "hf"), str(tmp_path / "run"), str(tmp_path / "cache"), *fused)
    model = build_model(resolve_plan(argv))
    model.eval()
    assert any("qkv_proj" in name for name in model.state_dict())
    ids = demo_ids()
    assert np.abs(paddle_logits(model, ids) - torch_logits(hf_model, ids)).max() <= LOGIT_TOLERANCE
    model.save_pretrained(str(tmp_path / "saved"))
    export(str(tmp_path / "saved"), str(tmp_path / "back"), tokenizer=False)
    original, back = _hf_tensors_of(str(tmp_path / "hf")), _hf_tensors_of(str(tmp_path / "back"))
    assert sorted(original) == sorted(back)
    for name in original:
        np.testing.assert_array_equal(back[name], original[name], err_msg=name)


# What a tensor-parallel rank's layers hold (Megatron-LM's layout, as paddlenlp's mpu layers hold it; weights
# [in, out]): column-parallel layers the output (last) axis split, row-parallel weights and the vocabulary-parallel
# embedding the first axis, Qwen v1's fused c_attn q, k and v each split by columns and the rank's three parts side
# by side; biases of row-parallel layers, norms and position embeddings whole. The vocabulary is split only
# when it divides (LlamaModel/Qwen2Model replicate it otherwise).
TP_COLUMN = re.compile(
    r"(q_proj|k_proj|v_proj|qkv_proj|gate_proj|up_proj|linear1|mlp\.w1|mlp\.w2)\.(weight|bias)$|^lm_head"
)
TP_ROW = re.compile(r"(o_proj|down_proj|out_proj|linear2|c_proj|embed_tokens|word_embeddings|wte)\.weight$")
TP_VOCAB = re.compile(r"embed_tokens|word_embeddings|wte|lm_head")
# routed experts built as plain linear layers, whole on every rank: DeepseekV2MLP(is_moe=True) (ERNIE-4.5-MoE's)
WHOLE_EXPERTS = {"ernie4_5_moe"}


def tensor_parallel_part(
    name: str, whole: np.ndarray, rank: int, degree: int, vocab_divides: bool, experts_whole: bool = False
) -> np.ndarray:
    if experts_whole and re.search(r"\.experts\.\d+\.", name):
        return whole
    if name.endswith(("c_attn.weight", "c_attn.bias")):
        return np.concatenate([np.split(p, degree, axis=-1)[rank] for p in np.split(whole, 3, axis=-1)], axis=-1)
    if TP_VOCAB.search(name) and not vocab_divides:
        return whole
    if TP_COLUMN.search(name):
        return np.split(whole, degree, axis=-1)[rank]
    if TP_ROW.search(name):
        return np.split(whole, degree, axis=0)[rank]
    return whole


@pytest.mark.parametrize(
    "family, vocab",
    [
        ("llama", 8064),
        ("llama", 8063),
        ("qwen2", 8064),
        ("qwen3", 8064),
        ("qwen3_moe", 8064),
        ("ernie4_5", 8064),
        ("ernie4_5_moe", 8064),
        ("qwen", 8064),
        ("gpt3", 8064),
    ],
)
def test_tensor_parallel_rank_gets_paddlenlps_split(family, vocab, tmp_path, monkeypatch):
    """By construction (no tensor-parallel group on CPU): under tensor_parallel_degree 2, each rank's converted
    tensors are the slices its parallel layers hold (``tensor_parallel_part``, written out independently of
    paddlenlp's split actions that the import uses): GQA k/v with one key/value head per rank, biases, Qwen v1's
    fused q/k/v, a padded vocabulary split by rows (8064) and one that does not divide kept whole (8063), ERNIE-4.5
    MoE's shared experts split and its routed experts whole."""
    from pretrain.hf_import import converted_tensors, hf_implementation, load_hf_config

    monkeypatch.setitem(SMALL, "vocab_size", vocab)
    hf_source(family, str(tmp_path / "hf"))
    impl = hf_implementation(str(tmp_path / "hf"))
    whole = dict(converted_tensors(str(tmp_path / "hf"), load_hf_config(str(tmp_path / "hf"), impl), impl))
    split = set()
    for rank in range(2):
        tp_config = load_hf_config(str(tmp_path / "hf"), impl)
        tp_config.tensor_parallel_degree, tp_config.tensor_parallel_rank = 2, rank
        part = dict(converted_tensors(str(tmp_path / "hf"), tp_config, impl))
        assert sorted(part) == sorted(whole)
        for name, array in part.items():
            expected = tensor_parallel_part(name, whole[name], rank, 2, vocab % 2 == 0, family in WHOLE_EXPERTS)
            np.testing.assert_array_equal(array, expected, err_msg=f"rank {rank}: {name}")
            if expected.shape != whole[name].shape:
                split.add(name.split(".")[-2])
    assert {"q_proj", "k_proj", "c_attn"} & split  # attention is split (k_proj: GQA, 2 key/value heads)
    assert any(TP_VOCAB.search(name) for name in split) == (vocab % 2 == 0)


# --- mixture of experts: Qwen2-MoE and Mixtral both ways ---------------------------------------------

# family -> (the experts' tensor name in transformers, the routing keys a round trip keeps)
MOE = {
    "qwen2_moe": ("model.layers.1.mlp.experts.{}.down_proj.weight", ("num_experts", "router_aux_loss_coef")),
    "qwen3_moe": (
        "model.layers.1.mlp.experts.{}.down_proj.weight",
        ("num_experts", "router_aux_loss_coef", "norm_topk_prob", "mlp_only_layers", "head_dim"),
    ),
    "mixtral": ("model.layers.1.block_sparse_moe.experts.{}.w2.weight", ("num_local_experts", "router_aux_loss_coef")),
    "deepseek_v2": ("model.layers.1.mlp.experts.{}.down_proj.weight", ("n_routed_experts", "aux_loss_alpha")),
    "deepseek_v3": ("model.layers.1.mlp.experts.{}.down_proj.weight", ("n_routed_experts", "routed_scaling_factor")),
    "ernie4_5_moe": (  # layer 2: in layer 1 the routing bias (randomized) keeps every token off experts 0 and 1
        "model.layers.2.mlp.experts.{}.down_proj.weight",
        ("moe_num_experts", "moe_k", "moe_num_shared_experts", "moe_layer_start_index", "router_aux_loss_coef"),
    ),
}


@pytest.mark.parametrize("family", list(MOE))
def test_mixture_of_experts_imports_and_exports_to_transformers_logits(family, tmp_path, demo_dir):
    """A random transformers Qwen2-MoE (routed experts, the shared expert and its sigmoid gate) or Mixtral
    (w1/w2/w3 experts) starts a run with transformers' logits (1e-4) and the routing keys of its config.json
    (experts, top-k, the aux coefficient); the run's model exports to the same tensors, bit for bit, and config
    keys, and transformers computes the same logits from the export."""
    hf_model = hf_source(family, str(tmp_path / "hf"))
    model = imported_model(family, str(tmp_path / "hf"), tmp_path)
    ids = demo_ids()
    expected = torch_logits(hf_model, ids)
    assert expected.std() > 0.3  # far from uniform: a wrong mapping would show
    diff = np.abs(paddle_logits(model, ids) - expected).max()
    print(f"{family}: import max |logit diff| {diff:.3g}")
    assert diff <= LOGIT_TOLERANCE
    source = json.loads((tmp_path / "hf" / "config.json").read_text())
    for key in ("num_experts_per_tok", *MOE[family][1]):  # ERNIE's config.json names the top-k moe_k only
        assert getattr(model.config, key) == source.get(key, getattr(hf_model.config, key)), key
    model.save_pretrained(str(tmp_path / "saved"))
    export(str(tmp_path / "saved"), str(tmp_path / "back"), tokenizer=False)
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert {key: written[key] for key in source if key.endswith(("experts", "_tok", "_coef", "_size"))} == {
        key: source[key] for key in source if key.endswith(("experts", "_tok", "_coef", "_size"))
    }
    original, back = _hf_tensors_of(str(tmp_path / "hf")), _hf_tensors_of(str(tmp_path / "back"))
    assert sorted(original) == sorted(back)
    for name in original:
        np.testing.assert_array_equal(back[name], original[name], err_msg=name)
    diff = np.abs(torch_logits(load_hf(str(tmp_path / "back")), ids) - expected).max()
    print(f"{family}: export max |logit diff| {diff:.3g}")
    assert diff <= LOGIT_TOLERANCE


@pytest.mark.parametrize("family", list(MOE))
def test_two_experts_swapped_fail_the_comparison(family, tmp_path, demo_dir, monkeypatch):
    """The check has teeth: layer 1's experts 0 and 1 exchanged in the export change transformers' logits."""
    import pretrain.hf_export as hf_export

    def broken(tensors, config, impl):
        out = dict(hf_tensors(tensors, config, impl))
        first, second = (MOE[family][0].format(expert) for expert in (0, 1))
        out[first], out[second] = out[second], out[first]
        return iter(out.items())

    hf_model = hf_source(family, str(tmp_path / "hf"))
    model = imported_model(family, str(tmp_path / "hf"), tmp_path)
    model.save_pretrained(str(tmp_path / "saved"))
    monkeypatch.setattr(hf_export, "hf_tensors", broken)
    export(str(tmp_path / "saved"), str(tmp_path / "back"), tokenizer=False)
    ids = demo_ids()
    assert np.abs(torch_logits(load_hf(str(tmp_path / "back")), ids) - torch_logits(hf_model, ids)).max() > 1e-3


def test_qwen3_moe_decoder_sparse_step_places_experts_as_transformers(tmp_path, demo_dir):
    """decoder_sparse_step 2 with mlp_only_layers [3] over 4 layers: experts in layer 1 only, as transformers'
    Qwen3MoeDecoderLayer builds them (paddlenlp's Qwen2-MoE would put them in all 4); the import computes
    transformers' logits."""
    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(
        **{**SMALL, "num_hidden_layers": 4}, num_key_value_heads=2, head_dim=32, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[3],
        max_position_embeddings=256,
    )  # fmt: skip
    hf_model = randomized(transformers.Qwen3MoeForCausalLM(config))
    hf_model.save_pretrained(str(tmp_path / "hf"))
    model = imported_model("qwen3_moe", str(tmp_path / "hf"), tmp_path)
    sparse = [index for index, layer in enumerate(hf_model.model.layers) if hasattr(layer.mlp, "gate")]
    assert sparse == [index for index, layer in enumerate(model.qwen2_moe.layers) if hasattr(layer.mlp, "gate")] == [1]
    ids = demo_ids()
    assert np.abs(paddle_logits(model, ids) - torch_logits(hf_model, ids)).max() <= LOGIT_TOLERANCE


def _without_renormalised_top_k(gate):
    gate.norm_topk_prob = False


def _without_routing_bias(gate):
    gate.e_score_correction_bias.set_value(paddle.zeros_like(gate.e_score_correction_bias))


@pytest.mark.parametrize(
    "family, change",
    [("qwen3_moe", _without_renormalised_top_k), ("ernie4_5_moe", _without_routing_bias)],
    ids=["qwen3_moe top-k not renormalised", "ernie4_5_moe routing bias zeroed"],
)
def test_a_routing_without_its_family_detail_misses_transformers_logits(family, change, tmp_path, demo_dir):
    """The comparison sees each family's routing: the imported model equals transformers' logits, and the same
    model with its gates changed leaves them by more than 1e-3. Qwen3-MoE's ``norm_topk_prob`` off (paddlenlp's
    Qwen2-MoE block never passes it: the top-2 weights left summing to less than 1); ERNIE-4.5-MoE's
    ``e_score_correction_bias`` zeroed (experts chosen by their scores alone; measured: 0.38)."""
    hf_model = hf_source(family, str(tmp_path / "hf"))
    model = imported_model(family, str(tmp_path / "hf"), tmp_path)
    ids = demo_ids()
    expected = torch_logits(hf_model, ids)
    assert np.abs(paddle_logits(model, ids) - expected).max() <= LOGIT_TOLERANCE
    for name, layer in model.named_sublayers():
        if name.endswith(".mlp.gate"):
            change(layer)
    diff = np.abs(paddle_logits(model, ids) - expected).max()
    print(f"{family} with its gates changed: max |logit diff| {diff:.3g}")
    assert diff > 1e-3


def test_ernie4_5_moe_import_leaves_the_releases_mtp_tensors_out(tmp_path, demo_dir):
    """baidu/ERNIE-4.5-*-PT folders also hold a multi-token-prediction module ("mtp" tensors), which transformers'
    Ernie4_5_MoeForCausalLM ignores on load: the import does too, and computes transformers' logits. (Without
    leaving them out: "continue_training: tensor model.mtp_linear_proj.0.weight of .../model.safetensors has no
    place in Ernie4_5MoeForCausalLM".)"""
    from safetensors.numpy import load_file, save_file

    hf_model = hf_source("ernie4_5_moe", str(tmp_path / "hf"))
    weights = str(tmp_path / "hf" / "model.safetensors")
    extra = {"model.mtp_linear_proj.0.weight": np.ones((64, 128), "float32")}
    save_file({**load_file(weights), **extra}, weights, metadata={"format": "pt"})
    model = imported_model("ernie4_5_moe", str(tmp_path / "hf"), tmp_path)
    ids = demo_ids()
    assert np.abs(paddle_logits(model, ids) - torch_logits(hf_model, ids)).max() <= LOGIT_TOLERANCE


@pytest.mark.parametrize(
    "family, change, message",
    [
        ("qwen2_moe", {"norm_topk_prob": True}, r"norm_topk_prob True \(paddlenlp's model computes False\)$"),
        ("qwen2_moe", {"decoder_sparse_step": 2}, r"decoder_sparse_step 2 \(paddlenlp's model computes 1\)$"),
        ("mixtral", {"sliding_window": 64}, r"sliding_window 64 \(paddlenlp's model computes None\)$"),
        ("qwen3_moe", {"tie_word_embeddings": True}, r"tie_word_embeddings True \(paddlenlp's model computes False\)$"),
    ],
)
def test_a_routing_paddlenlp_does_not_compute_is_refused_in_one_line(family, change, message, tmp_path):
    hf_source(family, str(tmp_path / "hf"))
    config_file = tmp_path / "hf" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **change}))
    with pytest.raises(UserError, match=r"config.json: cannot start from this Hugging Face model: " + message):
        load_local_config(str(tmp_path / "hf"))


# --- begin- and end-of-text ids: the tokenizer's, which generation stops on ---------------------------------


def emits_end_of_text(model, eos_id: int) -> None:
    """Set ``model``'s weights (in place) so that whatever the input, its most likely next token is ``eos_id``:
    each layer's output projections 0 (the residual stream is the token's embedding), every embedding row 1
    but ``eos_id``'s 2 and the LM head the embedding's transpose (tied or not), so the final norm sees ones
    and the logits are hidden for every token but ``eos_id``'s 2 x hidden."""
    state = model.state_dict()
    embedding = next(value for name, value in state.items() if name.endswith("embed_tokens.weight"))
    rows = np.ones(embedding.shape, "float32")
    rows[eos_id] = 2.0
    for name, value in state.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            value.set_value(np.zeros(value.shape, "float32"))
        elif name.endswith("embed_tokens.weight"):
            value.set_value(rows)
        elif name.endswith("lm_head.weight"):
            value.set_value(rows.T if list(value.shape) == [rows.shape[1], rows.shape[0]] else rows)


def test_exported_demo_model_stops_at_the_tokenizers_end_of_text_in_transformers(tmp_path):
    """The Qwen2 demo config (the demo tokenizer: <s> 1, </s> 2), built as a run builds it, its weights set to
    emit </s>, saved and exported: transformers' generate stops after that one token, reading the ids of the
    exported generation_config.json and config.json.

    Today's main: config.json and generation_config.json say bos/eos 151643 (paddlenlp's Qwen2 default, outside
    the 8,064-row vocabulary), and transformers generates </s> 8 times, to max_new_tokens."""
    from pretrain.model import build_model

    plan = resolve_plan([os.path.join(REPO, "config", "qwen2", "pretrain_demo_cpu.json"), "--num_hidden_layers", "2"])
    eos = plan.tokenizer.convert_tokens_to_ids("</s>")
    assert (plan.model_config.bos_token_id, plan.model_config.eos_token_id) == (1, eos) == (1, 2)
    model = build_model(plan)
    emits_end_of_text(model, eos)
    model.save_pretrained(str(tmp_path / "saved"))
    plan.tokenizer.save_pretrained(str(tmp_path / "saved"))
    summary = export(str(tmp_path / "saved"), str(tmp_path / "hf"))
    assert summary["warnings"] == []  # config.json already holds the tokenizer's ids
    with open(tmp_path / "hf" / "generation_config.json", encoding="utf-8") as f:
        assert json.load(f)["eos_token_id"] == eos

    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    inputs = hf_tokenizer("ROMEO:", return_tensors="pt")
    with torch.no_grad():
        out = load_hf(str(tmp_path / "hf")).generate(**inputs, max_new_tokens=8, do_sample=False)
    assert out[0, inputs["input_ids"].shape[1] :].tolist() == [eos]  # one token, </s>, and it stopped


def test_export_writes_the_tokenizers_ids_over_a_saved_configs_with_one_line(tmp_path):
    """A folder saved with paddlenlp's Qwen2 defaults (151643, as every Qwen2 run saved before runs took the
    tokenizer's ids) exports with the saved tokenizer's ids and one warning naming both.

    Today's main: config.json and generation_config.json of the export hold 151643, and nothing is said."""
    saved_debug_model("qwen2", str(tmp_path / "saved"))
    summary = export(str(tmp_path / "saved"), str(tmp_path / "hf"))
    config_file = os.path.join(str(tmp_path / "saved"), "config.json")
    assert summary["warnings"] == [
        f"{config_file} has bos_token_id 151643 (the tokenizer's: 1), eos_token_id 151643 (the tokenizer's: 2); "
        "the export writes the tokenizer's, which the model was trained to end text with"
    ]
    for name in ("config.json", "generation_config.json"):
        with open(tmp_path / "hf" / name, encoding="utf-8") as f:
            written = json.load(f)
        assert (written["bos_token_id"], written["eos_token_id"]) == (1, 2), name


@pytest.mark.parametrize("family", ["qwen2", "qwen2_moe", "deepseek_v2", "deepseek_v3", "gpt3", "llama"])
def test_a_demo_run_takes_the_tokenizers_ids(family):
    """Today's main: qwen2 and qwen2_moe 151643/151643, deepseek_v2 100000/100001, deepseek_v3 0/1 (<unk>, <s>),
    gpt3 0/7; llama 1/2 by paddlenlp's default."""
    plan = resolve_plan([os.path.join(REPO, "config", family, "pretrain_demo_cpu.json")])
    assert (plan.model_config.bos_token_id, plan.model_config.eos_token_id) == (1, 2)


def test_deepseek_v3_mtp_module_exports_and_imports_bit_for_bit(tmp_path, demo_dir):
    """DeepSeek-V3's multi-token-prediction module (``pretrain.mtp``) exports in the release's layout: layer
    num_hidden_layers holds enorm, hnorm, eh_proj with its input halves in the release's order (embedding first:
    vLLM's deepseek_mtp.py) and its copies of the embedding, output head and final norm; a run started from the
    export holds every tensor of the model bit for bit, and exports the same tensors again. transformers'
    DeepseekV3ForCausalLM builds no MTP module: it loads the main model (leaving the module's tensors unused) and
    computes its logits. The module computed from the export as vLLM reads the release (``_release_mtp_logits``)
    gives paddlenlp's MTP logits (8.6e-6; 9.05 with eh_proj's halves in paddlenlp's order)."""
    from pretrain.model import build_model

    config = os.path.join(REPO, "config", "deepseek_v3", "pretrain_demo_cpu.json")
    argv = [config, "--num_hidden_layers", "2", "--output_dir", str(tmp_path / "run0"), "--max_steps", "1"]
    model = build_model(resolve_plan(argv))
    rng = np.random.RandomState(0)
    for name, param in model.state_dict().items():
        is_norm = "norm" in name and len(param.shape) == 1
        param.set_value(
            (1 + rng.normal(0, 0.1, param.shape) if is_norm else rng.normal(0, 0.08, param.shape)).astype("float32")
        )
    model.eval()
    model.save_pretrained(str(tmp_path / "saved"))
    export(str(tmp_path / "saved"), str(tmp_path / "hf"), tokenizer=False)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["num_nextn_predict_layers"] == 1
    tensors, state = _hf_tensors_of(str(tmp_path / "hf")), model.state_dict()
    projection = state["deepseek_v3.layers.2.eh_proj.weight"].numpy()  # [2d, d]: rows for hnorm(h), then enorm(e)
    half = projection.shape[1]
    np.testing.assert_array_equal(
        tensors["model.layers.2.eh_proj.weight"], np.concatenate([projection[half:], projection[:half]]).T
    )
    for name, main in (("embed_tokens", "model.embed_tokens"), ("shared_head.head", "lm_head")):
        np.testing.assert_array_equal(tensors[f"model.layers.2.{name}.weight"], tensors[f"{main}.weight"])
    np.testing.assert_array_equal(tensors["model.layers.2.shared_head.norm.weight"], tensors["model.norm.weight"])

    imported = imported_model("deepseek_v3", str(tmp_path / "hf"), tmp_path)
    back = imported.state_dict()
    assert sorted(back) == sorted(state)
    for name, value in state.items():
        np.testing.assert_array_equal(back[name].numpy(), value.numpy(), err_msg=name)
    imported.save_pretrained(str(tmp_path / "saved_again"))
    export(str(tmp_path / "saved_again"), str(tmp_path / "hf_again"), tokenizer=False)
    again = _hf_tensors_of(str(tmp_path / "hf_again"))
    assert sorted(again) == sorted(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(again[name], value, err_msg=name)

    ids = demo_ids(65)  # paddlenlp's model reads one token more with one MTP depth; logits of the first 64
    hf_model = load_hf(str(tmp_path / "hf"))
    diff = np.abs(paddle_logits(model, ids) - torch_logits(hf_model, ids[:, :64])).max()
    print(f"deepseek_v3 with MTP: export max |logit diff| {diff:.3g}")
    assert diff <= LOGIT_TOLERANCE
    with paddle.no_grad():
        (mtp_hidden,) = model.deepseek_v3(input_ids=paddle.to_tensor(ids), return_dict=True).mtp_outputs
        expected = model.lm_head(mtp_hidden).numpy()
    diff = np.abs(_release_mtp_logits(hf_model, tensors, ids, 2) - expected).max()
    print(f"deepseek_v3 MTP module: export max |logit diff| {diff:.3g}")
    assert diff <= LOGIT_TOLERANCE


def _release_mtp_logits(hf_model, tensors: dict, ids: np.ndarray, layer: int) -> np.ndarray:
    """[1, seq - 1, vocab] logits of the MTP module ``model.layers.<layer>`` of a DeepSeek-V3 folder's ``tensors``
    computed as vLLM's ``DeepSeekMultiTokenPredictorLayer`` reads the release (vllm/model_executor/models/
    deepseek_mtp.py): eh_proj(cat[enorm(embed_tokens(t[i+1])), hnorm(h_i)]) with h the main model's last hidden
    state before its final norm, then the layer as transformers' DeepseekV3DecoderLayer, shared_head.norm and
    shared_head.head; positions of ``ids`` [1, seq], the main model reading the first seq - 1."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

    prefix, seq = f"model.layers.{layer}.", ids.shape[1] - 1
    own = {name[len(prefix) :]: torch.tensor(value) for name, value in tensors.items() if name.startswith(prefix)}
    config = hf_model.config
    block = DeepseekV3DecoderLayer(config, layer).eval()
    block.load_state_dict({name: value for name, value in own.items() if name in block.state_dict()}, strict=True)
    captured = {}
    hook = hf_model.model.layers[-1].register_forward_hook(lambda module, args, out: captured.update(h=out))
    with torch.no_grad():
        hf_model(torch.tensor(ids[:, :seq]))
        hook.remove()
        hidden = captured["h"][0] if isinstance(captured["h"], tuple) else captured["h"]

        def rms(x, weight):
            return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps)

        embedded = own["embed_tokens.weight"][torch.tensor(ids[:, 1:])]
        joined = torch.cat([rms(embedded, own["enorm.weight"]), rms(hidden, own["hnorm.weight"])], dim=-1)
        x = joined @ own["eh_proj.weight"].T
        positions = torch.arange(seq)[None]
        mask = torch.full((seq, seq), float("-inf")).triu(1)[None, None]
        out = block(
            x, attention_mask=mask, position_ids=positions, position_embeddings=hf_model.model.rotary_emb(x, positions)
        )
        out = out[0] if isinstance(out, tuple) else out
        return (rms(out, own["shared_head.norm.weight"]) @ own["shared_head.head.weight"].T).numpy()


def test_an_mtp_module_with_its_own_head_norm_is_refused_in_one_line(tmp_path, demo_dir):
    """paddlenlp's MTP module reads the main model's final norm where the release holds shared_head.norm: a folder
    whose copy differs cannot be imported as it is; the line says how to start without the module."""
    from safetensors.numpy import load_file, save_file

    from pretrain.model import build_model

    config = os.path.join(REPO, "config", "deepseek_v3", "pretrain_demo_cpu.json")
    model = build_model(resolve_plan([config, "--num_hidden_layers", "2", "--output_dir", str(tmp_path / "run0")]))
    model.save_pretrained(str(tmp_path / "saved"))
    export(str(tmp_path / "saved"), str(tmp_path / "hf"), tokenizer=False)
    (shard,) = [name for name in os.listdir(tmp_path / "hf") if name.endswith(".safetensors")]
    tensors = load_file(str(tmp_path / "hf" / shard))
    tensors["model.layers.2.shared_head.norm.weight"] = tensors["model.layers.2.shared_head.norm.weight"] * 2
    save_file(tensors, str(tmp_path / "hf" / shard), metadata={"format": "pt"})
    with pytest.raises(
        UserError,
        match=r"layers\.2\.shared_head\.norm\.weight differs from model\.norm\.weight.*num_nextn_predict_layers 0",
    ):
        imported_model("deepseek_v3", str(tmp_path / "hf"), tmp_path)


def test_safetensors_without_a_format_are_refused_not_loaded_transposed(tmp_path):
    """A folder whose config.json names LlamaForCausalLM (transformers' and paddlenlp's class name alike) and whose
    safetensors carry no ``format`` metadata: before, it was not a Hugging Face folder and paddlenlp's loader took
    its torch [out, in] weights as paddle's [in, out] (the helper that found it measured an ERNIE-4.5-MoE folder
    loading with logits 2.9 off, every square matrix transposed); now one line names the file and the fix."""
    from safetensors.numpy import load_file, save_file

    from pretrain.hf_import import hf_implementation

    hf_source("llama", str(tmp_path / "hf"))
    assert hf_implementation(str(tmp_path / "hf")) is not None
    (file,) = glob.glob(str(tmp_path / "hf" / "*.safetensors"))
    save_file(load_file(file), file)  # the same tensors, no metadata
    with pytest.raises(UserError, match=r"model\.safetensors: its safetensors metadata has no format 'pt'"):
        hf_implementation(str(tmp_path / "hf"))
