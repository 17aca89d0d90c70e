"""Weighted blends (pretrain.data): realized share of tokens per source, index cache per blend, and a
source with an empty split left out of that split's blend (paddlenlp's BlendableDataset would assert)."""

import json
import os

import numpy as np
import pytest
from conftest import REPO, load_script, pretrain_log_records, resolve_plan

from pretrain.corpus import IndexedWriter, read_index
from pretrain.data import build_datasets, data_mix, index_cache_folder
from pretrain.preflight import check_data
from pretrain.sample_log import SAMPLE_IDS_FILE

CONFIG = os.path.join(REPO, "config", "llama", "pretrain_demo_cpu.json")
SIZES = {"a": 300, "b": 3000, "c": 300}  # documents; split 949,50,1 leaves a and c no test document
STEPS, BATCH = 1000, 4


@pytest.fixture(scope="module")
def sources(tmp_path_factory, demo_dir):
    """Three corpora of 300, 3,000 and 300 demo documents (each cut to 48 tokens), as prefixes."""
    folder = tmp_path_factory.mktemp("blend")
    demo = os.path.join(demo_dir, "demo_text_document")
    index = read_index(demo + ".idx")
    tokens = np.memmap(demo + ".bin", dtype=index.dtype, mode="r")
    starts = np.concatenate([[0], np.cumsum(index.sizes, dtype=np.int64)])
    documents = len(index.sizes)
    prefixes = {}
    for name, count in SIZES.items():
        prefix = str(folder / name)
        writer = IndexedWriter(prefix + ".bin", index.dtype)
        for i in range(count):
            j = (i * 7 + len(prefixes)) % documents  # a different walk through the demo per source
            document = np.asarray(tokens[starts[j] : starts[j] + min(index.sizes[j], 48)])
            writer.add_documents(document, np.array([document.size]), np.array([1]))
        writer.finalize(prefix + ".idx")
        prefixes[name] = prefix
    return prefixes


def _input_dir(sources, weights) -> str:
    return " ".join(f"{weight} {sources[name]}" for name, weight in weights.items())


def _plan(tmp_path, sources, weights, *extra):
    return resolve_plan(
        [
            CONFIG,
            *("--input_dir", _input_dir(sources, weights), "--output_dir", str(tmp_path / "out")),
            *("--data_cache", str(tmp_path / "cache"), "--max_seq_length", "32"),
            *("--max_steps", str(STEPS), "--per_device_train_batch_size", str(BATCH), "--eval_iters", "2"),
            *extra,
        ]
    )


def test_three_source_blend_with_empty_test_splits_builds_and_realizes_its_weights(tmp_path, sources):
    weights = {"a": 0.2, "b": 0.5, "c": 0.3}
    plan = _plan(tmp_path, sources, weights)
    assert check_data(plan) == []
    with pretrain_log_records() as messages:
        train, valid, test = build_datasets(plan)
    assert any(f"the test split of {sources['a']}, {sources['c']} holds no documents" in m for m in messages)
    assert test.sources == [sources["b"]] and valid.sources == list(sources.values())
    assert len(train) == STEPS * BATCH
    mix = data_mix(train, STEPS * BATCH)
    assert mix.keys() == {sources[name] for name in weights}
    for name, weight in weights.items():
        assert mix[sources[name]] == pytest.approx(weight, abs=0.01)
    assert sum(mix.values()) == pytest.approx(1.0)


def test_changing_the_weights_gives_another_index_cache(tmp_path, sources):
    first = _plan(tmp_path, sources, {"a": 0.2, "b": 0.5, "c": 0.3})
    same_blend = _plan(tmp_path, sources, {"a": 2, "b": 5, "c": 3})  # the same normalised weights
    other = _plan(tmp_path, sources, {"a": 0.6, "b": 0.2, "c": 0.2})
    first_cache = index_cache_folder(first.data_args, first.data)
    assert first_cache == index_cache_folder(same_blend.data_args, same_blend.data)
    assert first_cache != index_cache_folder(other.data_args, other.data)
    # built one after the other under the same data_cache: the second blend is not served the first's index
    assert data_mix(build_datasets(first)[0], STEPS * BATCH)[sources["a"]] == pytest.approx(0.2, abs=0.01)
    first_files = sorted(os.listdir(first_cache))
    assert data_mix(build_datasets(other)[0], STEPS * BATCH)[sources["a"]] == pytest.approx(0.6, abs=0.01)
    assert data_mix(build_datasets(same_blend)[0], STEPS * BATCH)[sources["a"]] == pytest.approx(0.2, abs=0.01)
    assert sorted(os.listdir(first_cache)) == first_files  # the same blend reads the index it built


def test_a_blend_needs_validation_documents_in_one_source_only(tmp_path, sources):
    plan = _plan(tmp_path, sources, {"a": 1, "c": 1}, "--split", "99,1,0")  # 300 x 1% = 3 each: fine
    assert check_data(plan) == []
    plan = _plan(tmp_path, sources, {"a": 1, "c": 1}, "--split", "999,1,0")  # 0.3 each: none anywhere
    assert check_data(plan) == [
        "split: '999,1,0' leaves the validation split of every source empty; raise its share of split "
        "or set do_eval false"
    ]


@pytest.mark.slow
@pytest.mark.launch  # a whole run in this process: its host description runs `file` (platform.architecture)
def test_run_header_and_summary_report_the_realized_mix(tmp_path, sources):
    weights = {"a": 0.2, "b": 0.5, "c": 0.3}
    argv = [
        CONFIG,
        *("--input_dir", _input_dir(sources, weights), "--output_dir", str(tmp_path / "out")),
        *("--data_cache", str(tmp_path / "cache"), "--max_seq_length", "32", "--max_steps", "3"),
        *("--per_device_train_batch_size", "4", "--eval_iters", "1", "--eval_steps", "3", "--save_steps", "1000"),
        *("--num_hidden_layers", "1", "--hidden_size", "64", "--intermediate_size", "128"),
        *("--log_sample_ids", "true"),
    ]
    with pretrain_log_records() as messages:
        summary = load_script("run_pretrain.py").main(argv)
    (line,) = [m for m in messages if m.startswith("data mix (realized share of training tokens): ")]
    with open(tmp_path / "out" / "run_summary.json") as f:
        assert json.load(f)["data_mix"] == summary["data_mix"]
    # the shares are those of the samples the run trained on, by their ids (pretrain.sample_log)
    with open(tmp_path / "out" / SAMPLE_IDS_FILE) as f:
        trained = [i for step in f for i in json.loads(step)["ids"]]
    assert len(trained) == 3 * 4
    blend = build_datasets(resolve_plan(argv))[0]
    source_of = np.asarray(blend.dataset.dataset.dataset_index)[trained]  # CheckedDataset -> Subset -> blend
    counts = np.bincount(source_of, minlength=3)
    assert summary["data_mix"] == {prefix: count / len(trained) for prefix, count in zip(blend.sources, counts)}
    assert blend.sources == [sources[name] for name in weights]
    share_a = 100 * summary["data_mix"][sources["a"]]
    assert f"{sources['a']} {share_a:.1f}% (weight 20.0%)" in line
