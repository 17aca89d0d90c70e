"""Bad input to the entry scripts ends in one line, `error: ...`, exit status 2, and no traceback.

One case per entry script runs it as a subprocess (what a user sees); the others call its ``main``
in this process and check the UserError that ``run_cli`` would print.
"""

import json
import re
import subprocess
import sys

import pytest
from conftest import load_script, run_script, script_env

from pretrain.errors import UserError

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)


def assert_one_line_error(result, pattern):
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ")
    assert re.search(pattern, last), last


def demo_args(tmp_path, *extra):
    return (
        "config/llama/pretrain_demo_cpu.json",
        "--output_dir",
        str(tmp_path / "out"),
        "--data_cache",
        str(tmp_path / "cache"),
        *extra,
    )


def test_bad_input_dir(tmp_path, demo_dir):
    with pytest.raises(UserError, match=r"input_dir: .*missing.* is neither a folder nor a data prefix"):
        load_script("run_pretrain.py").main(list(demo_args(tmp_path, "--input_dir", str(tmp_path / "missing"))))


def test_json_typo(tmp_path, demo_dir):
    with open("config/llama/pretrain_demo_cpu.json") as f:
        config = json.load(f)
    config["per_device_train_batchsize"] = config.pop("per_device_train_batch_size")
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(config))
    result = run_script("run_pretrain.py", str(path), "--output_dir", str(tmp_path / "out"))
    assert_one_line_error(
        result, r"unknown key 'per_device_train_batchsize'; did you mean 'per_device_train_batch_size'"
    )


def test_empty_corpus_is_refused_by_preprocessing(tmp_path, demo_dir):
    corpus = tmp_path / "empty.jsonl"
    corpus.write_text('{"text": ""}\n{"text": "   "}\n')
    prefix = tmp_path / "empty_text_document"
    result = run_script(
        "tools/preprocess/create_pretraining_data.py",
        "--input",
        str(corpus),
        "--tokenizer_name_or_path",
        f"{demo_dir}/tokenizer",
        "--output_prefix",
        str(prefix),
    )
    assert_one_line_error(result, r"empty.jsonl: no document with text under 'text'")
    assert not list(tmp_path.glob("empty_text_document*"))  # nothing half-written left behind


def test_empty_data_files_are_refused_by_training(tmp_path, demo_dir):
    data = tmp_path / "data"
    data.mkdir()
    (data / "empty.bin").write_bytes(b"")
    (data / "empty.idx").write_bytes(b"")
    with pytest.raises(UserError, match=r"empty\.idx: 0 bytes, shorter than the 34-byte header"):
        load_script("run_pretrain.py").main(list(demo_args(tmp_path, "--input_dir", str(data))))


LAUNCHED_SCRIPT = """
import atexit, logging, sys
from pretrain.cluster.launched import run_launched
from pretrain.errors import UserError
logging.basicConfig(stream=sys.stdout)
atexit.register(lambda: print("interpreter teardown ran"))

def main(argv):
    if argv:
        raise UserError("bad input")
    print("main finished", end="")  # left in the buffer: must still reach the pipe
    logging.getLogger("x").warning("logged")

run_launched(main, sys.argv[1:])
"""


@pytest.mark.parametrize("ranks, teardown", [("2", False), ("1", True)])
def test_a_launched_rank_ends_without_interpreter_teardown(tmp_path, ranks, teardown):
    """paddle's gloo/TCP-store destructors occasionally abort (exit -6) a finished rank at teardown;
    a rank of a multi-rank launch skips it, its output flushed; a single process exits as usual."""
    script = tmp_path / "launched.py"
    script.write_text(LAUNCHED_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script)], env=script_env({"PADDLE_TRAINERS_NUM": ranks}), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "main finished" in result.stdout and "logged" in result.stdout
    assert ("interpreter teardown ran" in result.stdout) is teardown
    bad = subprocess.run(
        [sys.executable, str(script), "x"],
        env=script_env({"PADDLE_TRAINERS_NUM": ranks}),
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stderr.strip() == "error: bad input"
