"""A recipe's pinned global batch (``global_batch_size``): gradient accumulation derived from the card
count, the same samples per step on 1 or 2 nodes, card counts that cannot reach it refused in one line."""

import glob
import json
import os

import pytest
from conftest import REPO

from pretrain.arguments import parse_arguments
from pretrain.errors import UserError
from pretrain.layout import ParallelLayout, simulated_launch

RECIPES = sorted(glob.glob(os.path.join(REPO, "config", "*", "pretrain_argument*.json")))
# The family recipes' published batches in tokens (docs/models.md): 4M tokens (Llama 2 paper sec. 2.2,
# and the same batch for Qwen, Qwen2, Baichuan 2), 2M for GPT-3 6.7B (GPT-3 paper, Table 2.1).
PUBLISHED_BATCH_TOKENS = {"gpt3": 2 * 2**20}


def _parsed(path: str, nnodes: int, nproc_per_node: int = 8, *extra: str):
    with simulated_launch(nnodes, nproc_per_node):
        _, data_args, training_args = parse_arguments([path, *extra])
        layout = ParallelLayout.from_arguments(training_args, nnodes)
    return data_args, training_args, layout


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.split(os.sep)[-2])
def test_a_recipe_trains_its_published_batch_on_any_number_of_nodes(path):
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    assert "gradient_accumulation_steps" not in config  # derived from global_batch_size
    family = path.split(os.sep)[-2]
    accumulation = {}
    for nnodes in (1, 2, 4):
        data_args, args, layout = _parsed(path, nnodes)
        samples = layout.global_batch_samples(args.per_device_train_batch_size, args.gradient_accumulation_steps)
        assert samples == config["global_batch_size"]
        assert samples * data_args.max_seq_length == PUBLISHED_BATCH_TOKENS.get(family, 4 * 2**20)
        accumulation[nnodes] = args.gradient_accumulation_steps
    assert accumulation[1] == 2 * accumulation[2] == 4 * accumulation[4]


def test_a_card_count_that_cannot_reach_the_global_batch_is_refused():
    path = os.path.join(REPO, "config", "llama", "pretrain_argument.json")
    with pytest.raises(UserError) as error:
        _parsed(path, 3)  # 24 cards, TP2: 12 data-parallel ranks do not divide 1024 samples
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("global_batch_size 1024 cannot be reached on 24 card(s): 12 data-parallel ranks")
    assert message.endswith("e.g. 4, 8, 16, 32 cards"), message
    for cards in map(int, message.split("e.g. ")[1].split(" cards")[0].split(", ")):
        assert 1024 % (cards // 2) == 0  # each suggestion reaches it


def test_global_batch_and_accumulation_together_are_refused():
    path = os.path.join(REPO, "config", "llama", "pretrain_argument.json")
    with pytest.raises(UserError, match=r"^gradient_accumulation_steps: 8 is set together with global_batch_size 1024"):
        _parsed(path, 1, 8, "--gradient_accumulation_steps", "8")


def test_one_process_accumulates_the_whole_global_batch():
    path = os.path.join(REPO, "config", "llama", "pretrain_argument.json")
    _, args = parse_arguments([path, "--global_batch_size", "64"])[1:]
    assert args.gradient_accumulation_steps == 64
    with pytest.raises(UserError, match=r"^global_batch_size: 0 is out of range"):
        parse_arguments([path, "--global_batch_size", "0"])
    with pytest.raises(UserError, match=r"per_device_train_batch_size 2 does not divide it"):
        parse_arguments([path, "--global_batch_size", "63", "--per_device_train_batch_size", "2"])
