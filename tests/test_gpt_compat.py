"""pretrain.compat.gpt: GPT's tied LM head is split and merged as the embedding it is (paddlenlp 3.0.0b4's
mapping has no action for it). The runs that need it: tests/test_parallel_layouts.py (GPT-3 in TP2)."""

import os

import numpy as np
import pytest
from conftest import REPO, run_script
from paddlenlp.transformers import GPTConfig, GPTForCausalLM

from pretrain.compat import gpt as gpt_compat

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

NAMES = ["gpt.embeddings.word_embeddings.weight", "lm_head.weight"]


def _config(rank: int) -> GPTConfig:
    return GPTConfig(
        vocab_size=8,
        hidden_size=4,
        num_attention_heads=2,
        num_hidden_layers=1,
        tensor_parallel_degree=2,
        tensor_parallel_rank=rank,
    )


def test_upstream_has_no_action_for_the_tied_head():
    """What the fix is for; once paddlenlp maps lm_head.weight itself, pretrain.compat.gpt can go."""
    assert "lm_head.weight" not in gpt_compat._UPSTREAM(GPTForCausalLM, _config(0))


def test_the_tied_head_is_split_and_merged_as_the_embedding():
    gpt_compat.apply()
    full = np.arange(32, dtype="float32").reshape(8, 4)  # [vocab, hidden]
    halves = []
    for rank in (0, 1):
        actions = GPTForCausalLM.get_tensor_parallel_convert_actions(_config(rank), NAMES, is_split=True)
        embedding, head = (actions[name](full) for name in NAMES)
        np.testing.assert_array_equal(head, full[4 * rank : 4 * rank + 4])  # this rank's vocabulary rows
        np.testing.assert_array_equal(head, embedding)
        halves.append(head)
    merge = GPTForCausalLM.get_tensor_parallel_convert_actions(_config(0), NAMES, is_split=False)
    np.testing.assert_array_equal(merge["lm_head.weight"](halves), full)


# In a fresh process: the modules a run imports, then the model built from the GPT-3 demo config.
INSTALLED_WHERE_BUILT = """
from paddlenlp.transformers.gpt.modeling import GPTPretrainedModel
from pretrain.arguments import parse_arguments
from pretrain.compat import gpt
from pretrain.model import build_model
from pretrain.resolve import resolve_run

def patched():
    return GPTPretrainedModel._get_tensor_parallel_mappings.__func__ is not gpt._UPSTREAM

print("patched after the imports:", patched())
plan = resolve_run(*parse_arguments([{config!r}, "--output_dir", {output!r}]))
build_model(plan)
print("patched after build_model:", patched())
"""


def test_importing_changes_nothing_and_building_a_gpt_model_installs_the_fix(tmp_path, demo_dir):
    """Importing pretrain.registry (and the modules a run imports) leaves paddlenlp's GPT class as it is; building
    a GPT model installs the fix (``Implementation.install_compat``), before paddlenlp reads the mapping.
    Before the fix moved out of the registry's import, the first line read "patched after the imports: True"."""
    script = tmp_path / "build_gpt.py"
    config = os.path.join(REPO, "config", "gpt3", "pretrain_demo_cpu.json")
    script.write_text(INSTALLED_WHERE_BUILT.format(config=config, output=str(tmp_path / "out")))
    result = run_script(str(script), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("patched")]
    assert lines == ["patched after the imports: False", "patched after build_model: True"]
