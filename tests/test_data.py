"""Datasets over the demo corpus and the collator's one-token shift."""

import os

import numpy as np
import pytest
from paddlenlp.data.indexed_dataset import MMapIndexedDataset

from pretrain.data import DataSource, collate_causal_lm, paddlenlp_data_prefix, resolve_data_sources
from pretrain.errors import UserError


def test_collator_shifts_labels_by_one_token():
    samples = [{"text": np.arange(10, 19)}, {"text": np.arange(100, 109)}]  # seq_len + 1 = 9 tokens each
    batch = collate_causal_lm(samples)
    assert batch["input_ids"].shape == (2, 8) and batch["labels"].shape == (2, 8)
    assert batch["input_ids"].dtype == np.int64
    np.testing.assert_array_equal(batch["input_ids"][0], np.arange(10, 18))
    np.testing.assert_array_equal(batch["labels"][0], np.arange(11, 19))
    np.testing.assert_array_equal(batch["labels"][:, :-1], batch["input_ids"][:, 1:])


def test_folder_resolves_to_its_single_prefix(demo_dir):
    prefix = os.path.join(demo_dir, "demo_text_document")
    sources = resolve_data_sources(demo_dir)
    assert sources == [DataSource(1.0, prefix)]
    assert paddlenlp_data_prefix(sources) == [prefix]  # one source: paddlenlp takes the bare prefix


def test_weighted_list_is_parsed(demo_dir):
    prefix = os.path.join(demo_dir, "demo_text_document")
    sources = resolve_data_sources(f"0.7 {prefix} 0.3 {prefix}")
    assert sources == [DataSource(0.7, prefix), DataSource(0.3, prefix)]
    assert paddlenlp_data_prefix(sources) == [0.7, prefix, 0.3, prefix]


@pytest.mark.parametrize(
    "input_dir, message",
    [
        ("does/not/exist", r"neither a folder nor a data prefix"),
        ("1.0 does/not/exist", r"no does/not/exist.bin/.idx"),
        ("x {prefix}", r"weight 'x' .* is not a number"),
        ("0.5", r"neither a folder"),
    ],
)
def test_bad_input_dir_is_one_clear_error(demo_dir, input_dir, message):
    prefix = os.path.join(demo_dir, "demo_text_document")
    with pytest.raises(UserError, match=message):
        resolve_data_sources(input_dir.format(prefix=prefix))


def test_empty_folder_says_how_to_make_data(tmp_path):
    with pytest.raises(UserError, match=r"holds no .bin/.idx.*create_pretraining_data.py"):
        resolve_data_sources(str(tmp_path))


def test_demo_corpus_documents_end_with_eos(demo_dir):
    dataset = MMapIndexedDataset(os.path.join(demo_dir, "demo_text_document"))
    assert len(dataset) > 1000
    assert all(dataset[i][-1] == 2 for i in range(0, len(dataset), 97))  # </s> is id 2
