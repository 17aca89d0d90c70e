"""DeepSeek-V3's multi-token prediction (``pretrain.mtp``): the samples it needs, its loss weight, its training."""

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest
from conftest import resolve_plan

from pretrain.data import build_datasets, collate_causal_lm
from pretrain.model import build_model

CONFIG = "config/deepseek_v3/pretrain_demo_cpu.json"
SEQ = 32


def _plan(tmp_path, *extra: str):
    argv = [CONFIG, "--output_dir", str(tmp_path / "run"), "--data_cache", str(tmp_path / "cache")]
    return resolve_plan([*argv, "--max_seq_length", str(SEQ), "--max_steps", "2", *extra])


def _mtp_layer(model):
    return model.deepseek_v3.layers[model.config.num_hidden_layers]


def test_a_sample_holds_the_token_the_mtp_module_reads_past_the_window(tmp_path):
    """paddlenlp's DeepseekV2Model.forward (deepseek_v2/modeling.py:1593) reads seq_length + 1 inputs and labels
    with one MTP depth. Today's main builds no MTP module (num_nextn_predict_layers 0); its data path with MTP on
    (``sample_tokens`` without the depth) gave samples of 33 tokens and config.seq_length 32 ("assert 32 == 33"):
    the main loss would have read 31 tokens."""
    plan = _plan(tmp_path)
    assert plan.model_config.num_nextn_predict_layers == 1 and plan.model_config.num_nextn_predict_lambda == 0.3
    assert plan.model_config.seq_length == SEQ + 1  # the inputs: the attention's reshape under SP reads it
    train = build_datasets(plan)[0]
    batch = collate_causal_lm([train[0], train[1]])
    assert batch["input_ids"].shape == batch["labels"].shape == (2, SEQ + 1)
    model = build_model(plan)
    model.eval()
    with paddle.no_grad():
        loss, logits = model(input_ids=paddle.to_tensor(batch["input_ids"]), labels=paddle.to_tensor(batch["labels"]))[
            :2
        ]
    assert logits.shape == [2, SEQ, plan.model_config.vocab_size]  # the main model's window: max_seq_length tokens
    main = F.cross_entropy(
        logits.reshape([-1, logits.shape[-1]]), paddle.to_tensor(batch["labels"][:, :SEQ]).reshape([-1])
    )
    np.testing.assert_allclose(float(loss), float(main), rtol=1e-5)  # the logged loss is the next-token loss


def test_the_loss_weight_scales_the_module_gradient_and_leaves_the_loss(tmp_path):
    """L = L_main + lambda x L_MTP (DeepSeek-V3 report eq. 25): the MTP module's own weights (eh_proj, enorm,
    hnorm) take lambda x the MTP loss's gradient, plus the module's router loss's (lambda 0: that alone);
    paddlenlp's add_loss keeps the returned value the main loss's. The projection has no bias
    (``mtp.drop_projection_bias``; paddlenlp builds one)."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 8000, size=(2, SEQ + 2))
    batch = {"input_ids": paddle.to_tensor(tokens[:, :-1]), "labels": paddle.to_tensor(tokens[:, 1:])}
    losses, grads = [], []
    for weight in (0.0, 0.3, 0.6):
        paddle.seed(7)
        model = build_model(_plan(tmp_path))
        model.config.num_nextn_predict_lambda = weight
        loss = model(**batch)[0]
        loss.backward()
        layer = _mtp_layer(model)
        assert layer.eh_proj.bias is None and not [n for n, _ in model.named_parameters() if "eh_proj.bias" in n]
        losses.append(float(loss))
        grads.append({name: getattr(layer, name).weight.grad.numpy() for name in ("eh_proj", "enorm", "hnorm")})
    assert losses[0] == losses[1] == losses[2]
    for name in grads[0]:
        step = grads[1][name] - grads[0][name]  # 0.3 x the MTP loss's gradient
        assert np.abs(step).max() > 10 * np.abs(grads[0][name]).max(), name
        np.testing.assert_allclose(grads[2][name] - grads[1][name], step, rtol=1e-3, atol=1e-7, err_msg=name)


@pytest.mark.launch
def test_the_demo_trains_the_mtp_module(tmp_path, demo_dir):
    """A CPU run of the DeepSeek-V3 demo: its MTP module is saved, without a projection bias, and moves between
    the checkpoint at step 2 and the end at step 4, as the main model's weights do."""
    from conftest import load_script

    argv = [CONFIG, "--output_dir", str(tmp_path), "--data_cache", str(tmp_path / "cache"), "--max_steps", "4"]
    short = ["--max_seq_length", "64", "--gradient_accumulation_steps", "1", "--do_eval", "false"]
    summary = load_script("run_pretrain.py").main(
        [*argv, *short, "--evaluation_strategy", "no", "--save_steps", "2", "--measure_peak_flops", "false"]
    )
    assert summary["global_step"] == 4
    final = paddle.load(str(tmp_path / "model_state.pdparams"))
    saved = paddle.load(str(tmp_path / "checkpoint-2" / "model_state.pdparams"))
    module = [key for key in final if key.startswith("deepseek_v3.layers.4.")]
    assert {"deepseek_v3.layers.4.eh_proj.weight", "deepseek_v3.layers.4.enorm.weight"} <= set(module)
    assert not [key for key in final if "eh_proj.bias" in key]
    for key in ("eh_proj.weight", "enorm.weight", "hnorm.weight", "self_attn.o_proj.weight"):
        name = f"deepseek_v3.layers.4.{key}"
        assert not np.array_equal(final[name].numpy(), saved[name].numpy()), name


def test_the_overrides_turn_the_module_off_and_reweigh_its_loss(tmp_path):
    """``num_nextn_predict_layers 0``: the main model alone (samples of max_seq_length + 1 tokens, the report's
    671B-style count); ``num_nextn_predict_lambda 0.1``: the report's weight after its first 10T tokens. The run's
    header says which."""
    from pretrain.param_count import count_config_parameters
    from pretrain.report import format_header

    plan = _plan(tmp_path, "--num_nextn_predict_layers", "0")
    assert plan.model_config.seq_length == SEQ
    assert "4 layers, hidden 256" in format_header(plan)[0]
    assert "4 layers + 1 multi-token-prediction module (loss weight 0.3), hidden" in format_header(_plan(tmp_path))[0]
    assert plan.num_parameters == count_config_parameters(_plan(tmp_path).model_config, prediction_modules=False)[0]
    assert _plan(tmp_path, "--num_nextn_predict_lambda", "0.1").model_config.num_nextn_predict_lambda == 0.1
