"""LoRA fine-tuning (run_finetune.py): data masking, truncation and packing; the frozen-weight FLOPs;
the adapter size; preflight; a tiny end-to-end run with its adapter, merged model and generation."""

import json
import os

import numpy as np
import paddle
import pytest
from conftest import REPO, load_script
from tiny_finetune import (
    finetune_args,
    pretrain_tiny_model,
    save_random_adapter,
    save_random_model,
    write_demo_pairs,
)

from pretrain.errors import UserError
from pretrain.finetune.pairs import (
    IGNORE_INDEX,
    Example,
    padding_collator,
    read_examples,
    tokenize_example,
    tokenize_split,
)
from pretrain.metrics import flops
from pretrain.metrics.hardware import datasheet_peak_flops
from pretrain.registry import find_model_size
from pretrain.tokenizers import load_tokenizer_from

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

TOKENIZER = os.path.join(REPO, "data", "demo", "tokenizer")


@pytest.fixture(scope="module")
def tokenizer(demo_dir):
    return load_tokenizer_from(TOKENIZER)


def ids(tokenizer, text, first=True):
    return tokenizer(text, add_special_tokens=first)["input_ids"]


# --- data ---------------------------------------------------------------------------------------


def test_prompt_is_masked_and_response_ends_with_eos(tokenizer):
    example = Example(("Verse: In the beginning God created the heaven\nBook:",), ("Genesis",))
    features, truncated = tokenize_example(tokenizer, example, max_seq_length=64)
    prompt, response = ids(tokenizer, example.sources[0]), ids(tokenizer, "Genesis", first=False)
    tokens = prompt + response + [tokenizer.eos_token_id]
    assert not truncated
    assert features["input_ids"] == tokens[:-1]
    # labels[t] is the token after input_ids[t]: -100 while that token is still the prompt
    assert features["labels"] == [IGNORE_INDEX] * (len(prompt) - 1) + response + [tokenizer.eos_token_id]
    assert features["position_ids"] == list(range(len(tokens) - 1))


def test_turns_are_masked_turn_by_turn(tokenizer):
    example = Example(("Who?", "And then?"), ("Moses", "Aaron"))
    features, _ = tokenize_example(tokenizer, example, max_seq_length=64)
    p1, r1 = ids(tokenizer, "Who?"), ids(tokenizer, "Moses", False) + [tokenizer.eos_token_id]
    p2, r2 = ids(tokenizer, "And then?", False), ids(tokenizer, "Aaron", False) + [tokenizer.eos_token_id]
    unshifted = [IGNORE_INDEX] * len(p1) + r1 + [IGNORE_INDEX] * len(p2) + r2
    assert features["input_ids"] == (p1 + r1 + p2 + r2)[:-1]
    assert features["labels"] == unshifted[1:]


def test_truncation_is_counted_and_promptonly_examples_dropped(tokenizer):
    short = Example(("Verse: Jesus wept.\nBook:",), ("John",))
    long = Example(("Verse: " + "and the LORD spake unto Moses, saying, " * 4 + "\nBook:",), ("Leviticus",))
    prompt_length = len(ids(tokenizer, short.sources[0]))
    features, truncated = tokenize_example(tokenizer, short, max_seq_length=prompt_length)  # room for 1 answer token
    assert truncated and len(features["input_ids"]) == prompt_length
    assert [label for label in features["labels"] if label != IGNORE_INDEX] == ids(tokenizer, "John", False)[:1]

    split = tokenize_split(tokenizer, [short, long, short], max_seq_length=16, zero_padding=False)
    assert (split.examples, split.truncated, split.dropped, split.sequences) == (3, 1, 1, 2)
    assert split.label_tokens == 2 * (len(ids(tokenizer, "John", False)) + 1)


def test_a_split_with_nothing_left_to_learn_is_refused(tokenizer):
    from pretrain.finetune.pairs import check_split

    long = Example(("Verse: " + "and the LORD spake unto Moses, saying, " * 4 + "\nBook:",), ("Leviticus",))
    split = tokenize_split(tokenizer, [long, long], max_seq_length=16, zero_padding=True)
    with pytest.raises(UserError, match="dev.json: all 2 examples lose every response token .* max_seq_length 16"):
        check_split(split, "dev.json", 16)


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "demo.json:2: not valid JSON"),
        ('{"src": "a"}', 'demo.json:2: each line must be an object with "src" and "tgt"'),
        ('{"src": ["a", "b"], "tgt": ["c"]}', "demo.json:2: 'src' has 2 turns but 'tgt' has 1"),
        ('{"src": 3, "tgt": "c"}', "demo.json:2: 'src' must be a string or a non-empty list of strings"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "demo.json"
    path.write_text('{"src": "ok", "tgt": "fine"}\n' + line + "\n")
    with pytest.raises(UserError, match=message):
        read_examples(str(path))


def test_a_missing_file_or_a_folder_is_named(tmp_path):
    (tmp_path / "dev.json").write_text('{"src": "ok", "tgt": "fine"}\n')
    with pytest.raises(UserError, match=f"{tmp_path} is a folder; give one of its jsonl files .* e.g. .*dev.json"):
        read_examples(str(tmp_path))
    with pytest.raises(UserError, match=f"{tmp_path / 'nope.json'} does not exist; give a jsonl file"):
        read_examples(str(tmp_path / "nope.json"))


def test_packed_examples_see_exactly_what_they_see_alone(tokenizer, monkeypatch):
    """Packing puts 3 examples into one 64-token sequence; each example's logits must equal its own
    unpacked forward pass. With the mask ignored (USE_CASUAL_MASK=True: one causal sequence) the
    later examples attend to the earlier ones and differ, so the comparison can fail."""
    from paddlenlp.transformers import LlamaForCausalLM

    config = find_model_size("llama-debug").model_config()
    config.update({"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "vocab_size": 8064})
    config.update({"num_attention_heads": 4, "num_key_value_heads": 4})
    paddle.seed(0)
    model = LlamaForCausalLM.from_config(config)
    model.eval()
    examples = [
        Example(("Verse: Jesus wept.\nBook:",), ("John",)),
        Example(("Verse: In the beginning was the Word\nBook:",), ("John",)),
        Example(("Verse: The LORD is my shepherd; I shall not want.\nBook:",), ("Psalms",)),
    ]
    collate = padding_collator(tokenizer, 64)
    alone = [collate([tokenize_split(tokenizer, [e], 64, zero_padding=False).dataset[0]]) for e in examples]
    packed_split = tokenize_split(tokenizer, examples, 64, zero_padding=True)
    assert packed_split.sequences == 1
    packed = collate([packed_split.dataset[0]])
    assert packed["attention_mask"].shape == (1, 1, 64, 64)

    def logits(batch):
        inputs = {key: paddle.to_tensor(value) for key, value in batch.items() if key != "labels"}
        return model(**inputs, return_dict=True).logits.numpy()[0]

    def packed_matches_alone() -> bool:
        packed_logits, offset, same = logits(packed), 0, True
        for batch in alone:
            length = int(batch["attention_mask"].sum())
            same &= np.allclose(packed_logits[offset : offset + length], logits(batch)[:length], atol=1e-5)
            offset += length
        return same

    monkeypatch.setenv("USE_CASUAL_MASK", "False")
    assert packed_matches_alone()
    monkeypatch.setenv("USE_CASUAL_MASK", "True")
    assert not packed_matches_alone()


def test_demo_pairs_answer_where_each_passage_is_from(demo_dir):
    from pretrain.finetune.demo import BIBLE, SHAKESPEARE, bible_chapter, build_pairs, read_corpus

    corpus = os.path.join(demo_dir, "corpus.jsonl")
    chapters = [chapter for chapter in map(bible_chapter, read_corpus(corpus)) if chapter is not None]
    assert len(chapters) == 1189 and len({book for book, _ in chapters}) == 66  # the King James Bible
    train, dev = build_pairs(corpus)
    assert {pair["tgt"] for pair in train} == {pair["tgt"] for pair in dev} == {BIBLE, SHAKESPEARE}
    assert {"src": "Passage: Praise the LORD, O my soul.\nFrom:", "tgt": BIBLE} in train + dev
    assert {"src": "Passage: This will I carry to Rome.\nFrom:", "tgt": SHAKESPEARE} in train + dev
    assert len(dev) == len(set(map(json.dumps, dev))) and 150 < len(dev) < len(train) / 20  # one per held-out document


# --- FLOPs and adapter size ----------------------------------------------------------------------


@pytest.mark.parametrize("tokens_per_sec, published_mfu", [(4017, 0.361), (4945, 0.444)])
def test_lora_mfu_counts_four_n(tokens_per_sec, published_mfu):
    # FlagPerf training/nvidia/llama2_7b_finetune-pytorch/README.md, Llama-2-7B LoRA on one A100-40G:
    # frozen weights, so 4 x 7e9 FLOPs per token: 4017 tokens/s (seq 512, fp16, micro batch 4) is
    # 36.1%; the README's seq-4096 version reads 4945 tokens/s and 44.4%.
    peak = datasheet_peak_flops("NVIDIA A100-SXM4-40GB").flops_per_sec
    value = flops.mfu(tokens_per_sec, flops.nominal_flops_per_token(7e9, frozen_weights=True), peak)
    assert abs(value - published_mfu) <= 0.0005 + 1e-12  # published to 0.1%: 4017 gives 36.05%, printed 36.1%
    assert flops.mfu(tokens_per_sec, flops.nominal_flops_per_token(7e9), peak) == pytest.approx(1.5 * value)


def test_frozen_weight_flops_of_llama2_7b_with_the_published_adapter():
    # N = 6,607,343,616 (tests/test_flops.py); the adapter on q_proj and v_proj, r 8:
    # 32 layers x 2 x 8 x (4096 + 4096) = 4,194,304; attention 12·32·32·128·512 = 805,306,368.
    config = find_model_size("llama-2-7b").model_config()
    expected = 4 * 6_607_343_616 + 6 * 4_194_304 + 805_306_368
    assert flops.model_flops_per_token(config, 512, adapter_params=4_194_304) == expected
    assert flops.model_flops_per_token(config, 512) == 6 * 6_607_343_616 + 805_306_368


def lora_arguments(*targets, rank=8):
    from pretrain.finetune.lora_arguments import LoRAArguments

    return LoRAArguments(lora_rank=rank, lora_target_modules=list(targets))


def test_llama2_7b_adapter_size_from_the_config():
    from pretrain.finetune.lora import adapter_parameter_count

    config = find_model_size("llama-2-7b").model_config()
    assert adapter_parameter_count(config, lora_arguments(".*q_proj", ".*v_proj")) == 4_194_304


@pytest.mark.parametrize(
    "family, fused, targets",
    [
        ("llama-debug", False, (".*q_proj", ".*v_proj")),
        ("llama-debug", False, (".*proj",)),
        ("llama-debug", True, (".*qkv_proj", ".*gate_up_fused_proj", ".*down_proj")),
        ("qwen2-debug", False, (".*q_proj", ".*v_proj", ".*o_proj", ".*up_proj")),
        ("qwen3-debug", False, (".*q_proj", ".*k_proj", ".*o_proj")),  # q 512 wide (head_dim 128) on hidden 64
        ("ernie-4.5-debug", True, (".*qkv_proj", ".*o_proj")),
    ],
)
def test_adapter_size_from_the_config_equals_the_built_lora_model(family, fused, targets):
    from paddlenlp.peft import LoRAConfig, LoRAModel

    from pretrain.finetune.lora import adapter_parameter_count, parameter_counts
    from pretrain.registry import implementation_for

    config = find_model_size(family).model_config()
    config.update({"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4})
    config.update(
        {"num_key_value_heads": 2, "vocab_size": 256, "fuse_attention_qkv": fused, "fuse_attention_ffn": fused}
    )
    model = implementation_for(config.model_type, "test").model_class.from_config(config)
    lora = LoRAModel(model, LoRAConfig(target_modules=list(targets), r=4, lora_alpha=8))
    expected = adapter_parameter_count(config, lora_arguments(*targets, rank=4))
    assert expected > 0 and parameter_counts(lora)[0] == expected


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("size, model_type", [("qwen3-debug", "qwen3"), ("ernie-4.5-debug", "ernie4_5")])
def test_a_lora_model_keeps_the_projection_hooks(size, model_type, fused):
    """paddlenlp's LoRA replaces q_proj and k_proj (or qkv_proj) by ``LoRALinear``; with its B at zero the model
    computes what the base model does, Qwen3's per-head q/k norms and ERNIE-4.5's RoPE pair order included
    (``pretrain.models.qwen2_head_dim``'s hooks). When the norms were hooks put on the projections
    at build time, the replaced projections lost them: max |logit diff| 0.87 (fused: 1.01) on the Qwen3 debug
    model (2 layers); ERNIE-4.5's, its heads rotated as halves, 0.066 (fused: 0.055)."""
    from paddlenlp.peft import LoRAConfig, LoRAModel

    from pretrain.registry import implementation_for

    config = find_model_size(size).model_config()
    config.update({"num_hidden_layers": 2, "fuse_attention_qkv": fused})
    paddle.seed(0)
    model = implementation_for(model_type, "test").model_class.from_config(config)
    for name, parameter in model.named_parameters():
        if "norm" in name:  # away from 1, so a norm left out changes the logits
            parameter.set_value(1 + 0.3 * paddle.randn(parameter.shape))
    model.eval()
    ids = paddle.randint(0, config.vocab_size, [1, 16])
    with paddle.no_grad():
        base = model(ids)[0] if isinstance(model(ids), tuple) else model(ids)
        targets = [".*qkv_proj"] if fused else [".*q_proj", ".*k_proj"]
        lora = LoRAModel(model, LoRAConfig(target_modules=targets, r=4, lora_alpha=8))
        lora.eval()
        adapted = lora(ids)
        adapted = adapted[0] if isinstance(adapted, tuple) else adapted
    assert type(model.qwen2.layers[0].self_attn._sub_layers[targets[0][2:]]).__name__ == "LoRALinear"
    assert float((base - adapted).abs().max()) == 0.0


@pytest.mark.parametrize(
    "name, micro_batch, fp16", [("lora_argument.json", 2, False), ("lora_argument_fp16.json", 4, True)]
)
def test_configs_are_the_published_lora_case(name, micro_batch, fp16):
    """FlagPerf training/nvidia/llama2_7b_finetune-pytorch: Llama-2-7B, LoRA r 8, alpha 32, dropout 0.05 on
    q_proj and v_proj, sequence 512; fp32 micro batch 2, fp16 micro batch 4; 3 epochs of SAMSum (14,732)."""
    from pretrain.arguments import parse_arguments
    from pretrain.finetune.lora import adapter_parameter_count
    from pretrain.finetune.lora_arguments import FINETUNE_ARGUMENT_CLASSES

    path = os.path.join(REPO, "config", "llama", name)
    model_args, data_args, training_args, lora_args = parse_arguments([path], FINETUNE_ARGUMENT_CLASSES)
    assert (lora_args.lora_rank, lora_args.lora_alpha, lora_args.lora_dropout) == (8, 32, 0.05)
    assert lora_args.lora_target_modules == [".*q_proj", ".*v_proj"] and model_args.continue_training
    assert data_args.max_seq_length == 512 and not data_args.zero_padding
    assert (training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps) == (micro_batch, 1)
    assert (training_args.fp16, training_args.bf16, training_args.nominal_params) == (fp16, False, 7e9)
    assert training_args.max_steps == 3 * 14_732 // micro_batch
    assert adapter_parameter_count(find_model_size("llama-2-7b").model_config(), lora_args) == 4_194_304


# --- preflight -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, demo_dir):
    return pretrain_tiny_model(str(tmp_path_factory.mktemp("tiny_base")), steps=150)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory, demo_dir):
    return write_demo_pairs(str(tmp_path_factory.mktemp("pairs")), train=400, dev=40)


def test_preflight_lists_every_lora_problem(tmp_path, tiny_model, pairs):
    argv = finetune_args(tiny_model, pairs, str(tmp_path / "out"), "--dry_run", "true")
    argv += ["--continue_training", "false", "--lora_target_modules", ".*q_prj"]
    with pytest.raises(UserError) as error:
        load_script("run_finetune.py").main(argv)
    lines = str(error.value).splitlines()
    assert lines[0] == "preflight found 2 problems, nothing was started:"
    assert any(line.startswith("  - continue_training: LoRA fine-tuning trains an adapter") for line in lines)
    assert any(line.startswith("  - lora_target_modules: '.*q_prj' matches no linear layer") for line in lines)


def test_unknown_key_names_the_closest_one(tmp_path, tiny_model, pairs):
    with pytest.raises(UserError, match="unknown key 'max_length'; did you mean 'max_seq_length'"):
        load_script("run_finetune.py").main(finetune_args(tiny_model, pairs, str(tmp_path), "--max_length", "8"))


def test_a_second_run_on_the_same_output_dir_is_refused(tmp_path, tiny_model, pairs):
    from pretrain.run_lock import output_dir_lock

    out = str(tmp_path / "out")
    with output_dir_lock(out, local_zero=True):  # the lock run_pretrain.py takes too (pretrain.run_lock)
        with pytest.raises(UserError, match="is in use by another run"):
            load_script("run_finetune.py").main(finetune_args(tiny_model, pairs, out))


def test_dry_run_sizes_the_adapter(tmp_path, tiny_model, pairs, capsys):
    out = str(tmp_path / "out")
    assert load_script("run_finetune.py").main(finetune_args(tiny_model, pairs, out, "--dry_run", "true")) is None
    printed = capsys.readouterr().out
    # 2 layers x (q_proj + v_proj) x r 8 x (64 + 64)
    assert "1,114,432 frozen parameters (1.11 M); 4,096 adapter parameters" in printed
    assert "train: " in printed and "(400 examples)" in printed and not os.path.exists(out)


# --- a tiny run end to end -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, tiny_model, pairs):
    out = str(tmp_path_factory.mktemp("finetuned"))
    argv = finetune_args(tiny_model, pairs, out, "--learning_rate", "0.02", steps=60)
    summary = load_script("run_finetune.py").main(argv)
    return out, summary


def test_run_writes_adapter_summary_and_merged_model(finetuned, tiny_model):
    out, summary = finetuned
    for name in ("lora_model_state.pdparams", "lora_config.json", "run_summary.json", "loss_history.json"):
        assert os.path.isfile(os.path.join(out, name)), name
    assert not os.path.exists(os.path.join(out, "model_state.pdparams"))  # the adapter alone, not the base model
    with open(os.path.join(out, "lora_config.json")) as f:
        lora_config = json.load(f)
    assert (lora_config["r"], lora_config["lora_alpha"], lora_config["lora_dropout"]) == (8, 32, 0.05)
    assert lora_config["target_modules"] == [".*q_proj", ".*v_proj"]
    assert set(paddle.load(os.path.join(out, "lora_model_state.pdparams"))) == {
        f"llama.layers.{layer}.self_attn.{proj}.lora_{ab}"
        for layer in (0, 1)
        for proj in ("q_proj", "v_proj")
        for ab in "AB"
    }
    assert summary["trainable_params"] == 4096 and summary["num_params"] == 1_114_432
    assert summary["total_params_with_adapter"] == 1_114_432 + 4096
    assert summary["global_step"] == 60 and summary["train_tokens"] == 60 * 4 * 64
    # frozen-weight form: 4N + 6 x adapter + 12·L·H·Q·T (N: 1,114,432 - 8064·64 embedding + 0 tied)
    n = 1_114_432 - 8064 * 64
    assert summary["model_flops_per_token"] == 4 * n + 6 * 4096 + 12 * 2 * 4 * 16 * 64
    assert summary["train_examples"] == 400 and summary["eval_examples"] == 40
    assert summary["train_sequences"] < 400  # packed
    assert summary["tokens_per_card_per_sec"] > 0 and summary["peak_memory_gib"] > 0
    assert os.path.isfile(os.path.join(out, "merged", "model_state.pdparams"))


def test_fine_tuned_loss_falls_below_the_base_models(finetuned):
    _, summary = finetuned
    assert summary["eval_loss"] < 0.9 * summary["eval_loss_base"]  # about 0.8 x; make finetune-demo: 0.5 x
    assert summary["train_loss_last"] < summary["train_loss_first"]


def test_merged_model_loads_equals_base_plus_adapter_and_generates(finetuned, tiny_model):
    from paddlenlp.transformers import AutoModelForCausalLM

    from pretrain.finetune.generate import generate_greedy
    from pretrain.finetune.lora import load_lora_model

    out, _ = finetuned
    merged = AutoModelForCausalLM.from_pretrained(os.path.join(out, "merged"))
    merged.eval()
    assert not any("lora" in name for name in merged.state_dict())
    adapted = load_lora_model(tiny_model, out)
    adapted.eval()
    tokenizer = load_tokenizer_from(os.path.join(out, "merged"))
    prompt = "Verse: And God said, Let there be light: and there was light.\nBook:"
    input_ids = paddle.to_tensor([ids(tokenizer, prompt)])
    np.testing.assert_allclose(
        merged(input_ids=input_ids, return_dict=True).logits.numpy(),
        adapted(input_ids=input_ids, return_dict=True).logits.numpy(),
        atol=1e-4,
    )
    adapted.disable_lora()
    base_logits = adapted(input_ids=input_ids, return_dict=True).logits.numpy()
    assert not np.allclose(base_logits, merged(input_ids=input_ids, return_dict=True).logits.numpy(), atol=1e-3)

    generated = generate_greedy(merged, tokenizer, prompt, max_new_tokens=6)
    reference, tokens = [], ids(tokenizer, prompt)
    for _ in range(6):  # greedy by hand: one full forward pass per token
        logits = merged(input_ids=paddle.to_tensor([tokens]), return_dict=True).logits
        token = int(logits[0, -1].argmax())
        if token == tokenizer.eos_token_id:
            break
        reference.append(token)
        tokens.append(token)
    assert generated and generated == reference


def test_generate_without_attention_mask_is_the_known_pitfall(finetuned):
    """paddlenlp 3.0.0b4: generate(input_ids=...) alone builds a 4-D additive mask LLaMA cannot use
    (docs/finetune.md). If this starts passing, paddlenlp fixed it: drop the workaround's note."""
    from paddlenlp.transformers import AutoModelForCausalLM

    out, _ = finetuned
    model = AutoModelForCausalLM.from_pretrained(os.path.join(out, "merged"))
    model.eval()
    with pytest.raises(ValueError):
        model.generate(input_ids=paddle.to_tensor([[332, 262, 459, 608]]), max_new_tokens=3, use_cache=True)


def test_merge_tool_writes_the_same_model_as_merge_lora(finetuned, tiny_model, tmp_path):
    out, _ = finetuned
    load_script("tools/merge_lora.py").main(
        ["--base_model", tiny_model, "--lora_path", out, "--output", str(tmp_path / "merged")]
    )
    want = paddle.load(os.path.join(out, "merged", "model_state.pdparams"))
    got = paddle.load(str(tmp_path / "merged" / "model_state.pdparams"))
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name].numpy(), want[name].numpy(), err_msg=name)


# --- tools/merge_lora.py on untrained models: what it refuses ------------------------------------


@pytest.fixture(scope="module")
def random_lora(tmp_path_factory, demo_dir):
    """(base 64 wide, an adapter of it, a base 128 wide): untrained, saved in seconds."""
    tmp = tmp_path_factory.mktemp("random_lora")
    base = save_random_model(str(tmp / "base64"), hidden_size=64)
    return base, save_random_adapter(base, str(tmp / "adapter")), save_random_model(str(tmp / "base128"), 128)


def merge(base: str, adapter: str, output: str):
    return load_script("tools/merge_lora.py").main(["--base_model", base, "--lora_path", adapter, "--output", output])


def test_merge_tool_merges_the_saved_adapter(random_lora, tmp_path):
    base, adapter, _ = random_lora
    merge(base, adapter, str(tmp_path / "out"))
    lora = paddle.load(os.path.join(adapter, "lora_model_state.pdparams"))
    before = paddle.load(os.path.join(base, "model_state.pdparams"))
    after = paddle.load(str(tmp_path / "out" / "model_state.pdparams"))
    name = "llama.layers.1.self_attn.v_proj"
    a, b = lora[f"{name}.lora_A"].numpy(), lora[f"{name}.lora_B"].numpy()
    want = before[f"{name}.weight"].numpy() + a @ b * (8 / 4)  # W + A @ B x alpha / r
    np.testing.assert_allclose(after[f"{name}.weight"].numpy(), want, rtol=1e-5, atol=1e-6)


def test_merge_tool_refuses_an_adapter_of_another_shape(random_lora, tmp_path):
    base, adapter, wide_base = random_lora
    expected = r"llama.layers.0.self_attn.q_proj.lora_A is \[64, 4\] in the adapter but \[128, 4\] in the base model"
    with pytest.raises(UserError, match=expected + r" \(8 of 8 tensors differ\); give the base model it was trained"):
        merge(wide_base, adapter, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize(
    "edit, message",
    [
        ("drop", r"the base model has 1 adapter tensors that the adapter lacks, e.g. llama.layers.1.self_attn.v_proj"),
        ("add", r"1 of the adapter's tensors match no layer of the base model, e.g. llama.layers.7.mlp.up_proj"),
    ],
)
def test_merge_tool_refuses_an_adapter_with_missing_or_unknown_tensors(random_lora, tmp_path, edit, message):
    import shutil

    base, adapter, _ = random_lora
    edited = str(tmp_path / "adapter")
    shutil.copytree(adapter, edited)
    path = os.path.join(edited, "lora_model_state.pdparams")
    state = paddle.load(path)
    if edit == "drop":
        del state["llama.layers.1.self_attn.v_proj.lora_B"]
    else:
        state["llama.layers.7.mlp.up_proj.lora_A"] = paddle.zeros([64, 4])
    paddle.save(state, path)
    with pytest.raises(UserError, match=message):
        merge(base, edited, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("target", ["base", "adapter", "adapter/", "link", "file"])
def test_merge_tool_refuses_an_output_over_its_inputs_or_a_file(random_lora, tmp_path, target):
    base, adapter, _ = random_lora
    os.symlink(base, tmp_path / "link")
    (tmp_path / "file").write_text("")
    output = {"base": base, "adapter": adapter, "adapter/": adapter + "/", "link": str(tmp_path / "link")}
    output = output.get(target, str(tmp_path / "file"))
    message = {"base": "is the --base_model folder", "link": "is the --base_model folder", "file": "is a file"}
    before = {folder: sorted(os.listdir(folder)) for folder in (base, adapter)}
    with pytest.raises(UserError, match=message.get(target, "is the --lora_path folder")):
        merge(base, adapter, output)
    assert {folder: sorted(os.listdir(folder)) for folder in (base, adapter)} == before
    assert os.path.getsize(tmp_path / "file") == 0


# --- tools/generate.py ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def three_pairs(tmp_path_factory):
    path = tmp_path_factory.mktemp("generate") / "pairs.json"
    path.write_text("".join(json.dumps({"src": f"Verse {i}:\nBook:", "tgt": "Genesis"}) + "\n" for i in range(3)))
    return str(path)


def generate(model: str, data: str, *extra: str) -> dict:
    return load_script("tools/generate.py").main([model, "--data", data, "--show", "0", *extra])


@pytest.mark.parametrize("flag, value", [("--num", "-1"), ("--num", "0"), ("--max_new_tokens", "0")])
def test_generate_refuses_counts_below_one(random_lora, three_pairs, flag, value):
    with pytest.raises(UserError, match=f"^{flag} {value} must be >= 1$"):
        generate(random_lora[0], three_pairs, flag, value)


def test_generate_answers_num_pairs(random_lora, three_pairs):
    assert generate(random_lora[0], three_pairs, "--num", "2", "--max_new_tokens", "1")["answered"] == 2


def test_generate_refuses_answers_past_the_model_positions(random_lora, three_pairs, tmp_path):
    tokenizer = load_tokenizer_from(random_lora[0])
    fits = 64 - len(tokenizer("Verse 0:\nBook:")["input_ids"])  # random_lora's models have 64 positions
    message = rf"--max_new_tokens {fits + 1}: prompt 1 is {64 - fits} tokens, .* max_position_embeddings 64; "
    with pytest.raises(UserError, match=message + f"give --max_new_tokens <= {fits}$"):
        generate(random_lora[0], three_pairs, "--max_new_tokens", str(fits + 1))
    assert generate(random_lora[0], three_pairs, "--max_new_tokens", str(fits), "--num", "1")["answered"] == 1


@pytest.mark.parametrize("degrees", [("--tensor_parallel_degree", "2"), ("--pipeline_parallel_degree", "2")])
def test_lora_under_tensor_or_pipeline_parallelism_is_refused_in_one_line(degrees):
    """GPU path, by construction: the published LoRA config as paddlenlp resolves it on 8 cards with TP2
    or PP2 (simulated launch). Under TP each rank saves its own adapter shard and merge_lora merges
    single-card layers only; under PP the merge runs on rank 0 alone (stage 0's layers): refused."""
    from types import SimpleNamespace

    from pretrain.arguments import parse_arguments
    from pretrain.finetune.lora_arguments import FINETUNE_ARGUMENT_CLASSES
    from pretrain.finetune.run import check_lora
    from pretrain.layout import ParallelLayout, simulated_launch

    path = os.path.join(REPO, "config", "llama", "lora_argument.json")
    with simulated_launch(1, 8):
        model_args, _, training_args, lora_args = parse_arguments([path, *degrees], FINETUNE_ARGUMENT_CLASSES)
        layout = ParallelLayout.from_arguments(training_args, 1)
    plan = SimpleNamespace(
        model_args=model_args, lora_args=lora_args, model_config=None, layout=layout, resume_checkpoint=None
    )
    (problem,) = check_lora(plan)
    assert problem.startswith("tensor_parallel_degree: LoRA fine-tuning runs data parallel (and sharding) only")
    assert problem.endswith("set both degrees to 1") and "\n" not in problem
    plan.layout = ParallelLayout(world_size=8, nnodes=1, data_parallel_degree=8)
    assert check_lora(plan) == []
