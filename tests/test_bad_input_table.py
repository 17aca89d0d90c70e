"""Every bad input of tests/bad_input_table.py ends in one ``error:`` line, exit status 2, no traceback, no hang,
and nothing left behind; preprocessing workers die with their parent.

Cases run in this process through ``run_cli`` (as each script's ``__main__`` does), a few as child
processes. A full disk is a 64 KiB tmpfs and a read-only one a tmpfs mounted read-only (root only:
elsewhere a folder this user cannot write, or the case is skipped).
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager

import numpy as np
import pytest
from bad_input_table import CASES
from conftest import DEMO_DIR, REPO, TOKENIZERS_DIR, load_script, run_script, script_env
from tiny_finetune import save_random_adapter, save_random_model
from tiny_run import tiny_args

from pretrain.errors import run_cli

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

CASE_SECONDS = 120  # far above any case's time, so only a hang reaches it
LOCK_FILE = re.compile(r"\.run\.lock\.node\d+$")  # a run's lock file stays, by design (pretrain.run_lock)


class CaseTimeout(BaseException):  # not an OSError (as TimeoutError is), so run_cli cannot turn it into a line
    pass


@contextmanager
def time_limit(seconds: int):
    def expire(signum, frame):
        raise CaseTimeout(f"no answer within {seconds} s: the case hangs")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _mount_tmpfs(point: str, *options: str) -> bool:
    os.makedirs(point)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", point], capture_output=True)
    return result.returncode == 0


@pytest.fixture(scope="module")
def shared(tmp_path_factory, demo_dir):
    """A random tiny model and an adapter for it, made once (seconds)."""
    folder = tmp_path_factory.mktemp("bad_inputs_shared")
    model = save_random_model(str(folder / "model"))
    return {"model": model, "adapter": save_random_adapter(model, str(folder / "adapter"))}


class Resources(dict):
    """``{name}`` placeholders of a case, each made on first use in the case's folder (see bad_input_table.py)."""

    def __init__(self, tmp: str, shared: dict, stack: ExitStack):
        super().__init__(
            tmp=tmp,
            demo_dir=DEMO_DIR,
            demo_prefix=os.path.join(DEMO_DIR, "demo_text_document"),
            demo_tokenizer=os.path.join(DEMO_DIR, "tokenizer"),
            corpus=os.path.join(DEMO_DIR, "corpus.jsonl"),
            tokenizers=TOKENIZERS_DIR,
            lora_config=os.path.join(REPO, "config", "llama", "lora_demo_cpu.json"),
            **shared,
        )
        self.json_base = f'"model_name_or_path": "llama-debug", "input_dir": "{DEMO_DIR}", "output_dir": "{tmp}/out"'
        self.stack = stack

    def __missing__(self, name: str) -> str:
        value = getattr(self, f"make_{name}")(os.path.join(self["tmp"], name))
        self[name] = value
        return value

    def make_json_base(self, path: str) -> str:
        return self.json_base

    def make_file(self, path: str) -> str:
        path = os.path.join(os.path.dirname(path), "a_file")
        with open(path, "w") as f:
            f.write("not a folder\n")
        return path

    def make_read_only(self, path: str) -> str:
        if _mount_tmpfs(path, "ro", "size=64k"):
            self.stack.callback(subprocess.run, ["umount", "--lazy", path], check=True)
            return path
        os.chmod(path, 0o555)
        if os.access(path, os.W_OK):
            pytest.skip("cannot mount a read-only tmpfs, and this user writes to a chmod 555 folder")
        return path

    def make_full_disk(self, path: str) -> str:
        if not _mount_tmpfs(path, "size=64k"):
            pytest.skip("cannot mount a small tmpfs here: no full disk to test")
        self.stack.callback(subprocess.run, ["umount", "--lazy", path], check=True)
        return path

    def _adapter_copy(self, path: str, damage) -> str:
        shutil.copytree(self["adapter"], path)
        weights = os.path.join(path, "lora_model_state.pdparams")
        data = open(weights, "rb").read()
        with open(weights, "wb") as f:
            f.write(damage(data))
        return path

    def make_truncated_adapter(self, path: str) -> str:
        return self._adapter_copy(path, lambda data: data[: len(data) // 2])

    def make_garbage_adapter(self, path: str) -> str:
        return self._adapter_copy(path, lambda data: os.urandom(len(data)))

    def make_big_ids_dir(self, path: str) -> str:
        """A uint16 ``bad.bin/.idx`` holding token 65535 (beyond the demo model's 8064 rows)."""
        from paddlenlp.data.indexed_dataset import make_builder

        os.makedirs(path)
        prefix = os.path.join(path, "bad")
        builder = make_builder(prefix + ".bin", impl="mmap", save_dtype=np.uint16)
        for document in ([5, 65535, 9, 2], [11, 12, 2], [7, 8, 2]):
            builder.add_item(np.array(document, dtype=np.int64))
            builder.end_document()
        builder.finalize(prefix + ".idx")
        return path

    def make_bad_ids_dir(self, path: str) -> str:
        """``big_ids_dir``'s pair with a ``.stats.json`` that says the largest id is 7999."""
        self.make_big_ids_dir(path)
        with open(os.path.join(path, "bad.stats.json"), "w") as f:
            f.write('{"tokens": 10, "max_token_id": 7999, "vocab_size": 8000, "dtype": "uint16"}')
        return path


def _files(folder: str) -> set:
    return {
        os.path.relpath(os.path.join(root, name), folder)
        for root, _, names in os.walk(folder)
        for name in names
        if not LOCK_FILE.search(name)
    }


def _case_id(case) -> str:
    words = re.sub(r"[{}]|--", "", case[1]).split()
    return f"{case[0].split('/')[-1]}:{' '.join(words[-2:])}"


@pytest.mark.parametrize("case", CASES, ids=[f"{i:03d}-{_case_id(c)}" for i, c in enumerate(CASES)])
def test_bad_input_is_one_line(case, tmp_path, shared, capsys):
    script, arguments, pattern, files = (*case, {})[:4]
    with ExitStack() as stack:
        resources = Resources(str(tmp_path), shared, stack)
        for name, content in files.items():
            path = tmp_path / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content.format_map(resources))
        tiny = arguments.startswith("{tiny}")
        argv = [token.format_map(resources) for token in shlex.split(arguments.removeprefix("{tiny}"))]
        if tiny:
            argv = tiny_args(str(tmp_path / "out"), str(tmp_path / "cache"), *argv)
        before = _files(str(tmp_path))
        if script.startswith("!"):
            result = run_script(script[1:], *argv, timeout=CASE_SECONDS * 3)
            status, err = result.returncode, result.stderr
        else:
            with time_limit(CASE_SECONDS), pytest.raises(SystemExit) as exit_info:
                run_cli(load_script(script).main, argv)
            status, err = exit_info.value.code, capsys.readouterr().err
        left = _files(str(tmp_path)) - before
    assert status == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    error_lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, err[-3000:]
    assert re.search(pattern, err[err.index("error:") :]), err[-3000:]
    assert not left, f"left behind: {sorted(left)}"


def test_there_are_at_least_60_cases_over_every_tool():
    assert len(CASES) >= 60
    scripts = {case[0].lstrip("!") for case in CASES}
    tools = {f"tools/{name}" for name in os.listdir(os.path.join(REPO, "tools")) if name.endswith(".py")}
    tools |= {f"tools/preprocess/{name}" for name in os.listdir(os.path.join(REPO, "tools", "preprocess"))}
    # not covered: the two tools that download (the demo corpus and the published tokenizers)
    exempt = {"tools/preprocess/build_demo_corpus.py", "tools/preprocess/fetch_tokenizers.py"}
    assert {"run_pretrain.py", "run_finetune.py"} <= scripts
    assert tools - exempt - scripts == set()


def _children(pid: int) -> list:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(child) for child in f.read().split()]


def test_preprocessing_workers_die_with_their_parent_and_the_next_run_removes_its_partial_file(tmp_path):
    corpus = tmp_path / "big.jsonl"
    with open(os.path.join(DEMO_DIR, "corpus.jsonl"), "rb") as f:
        corpus.write_bytes(f.read() * 4)  # about 40 MB: several seconds of work for two workers
    prefix = str(tmp_path / "out")
    command = [
        sys.executable,
        os.path.join(REPO, "tools", "preprocess", "create_pretraining_data.py"),
        *("--input_path", str(corpus), "--tokenizer_name_or_path", os.path.join(DEMO_DIR, "tokenizer")),
        *("--output_prefix", prefix, "--workers", "2", "--progress", "false"),
    ]
    parent = subprocess.Popen(command, env=script_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = []
    try:
        deadline = time.monotonic() + 120
        while len(_children(parent.pid)) < 2 or not list(tmp_path.glob("out.bin.partial.*")):
            assert parent.poll() is None and time.monotonic() < deadline, "the workers never started"
            time.sleep(0.2)
        workers = _children(parent.pid)
        parent.kill()  # SIGKILL, as the OOM killer sends
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{pid}") and _state(pid) != "Z" for pid in workers):
            assert time.monotonic() < deadline, "a worker outlived its parent"
            time.sleep(0.1)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for pid in workers:  # only when the test fails: leave no process behind
            if _state(pid) not in ("gone", "Z"):
                os.kill(pid, signal.SIGKILL)
    (partial,) = tmp_path.glob("out.bin.partial.*")  # the killed parent could not remove it ...
    small = tmp_path / "small.jsonl"
    small.write_text('{"text": "a short document"}\n')
    result = run_script(
        "tools/preprocess/create_pretraining_data.py",
        *("--input_path", str(small), "--tokenizer_name_or_path", os.path.join(DEMO_DIR, "tokenizer")),
        *("--output_prefix", prefix),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert not partial.exists() and f"removed {partial}" in result.stdout + result.stderr  # ... the next run does
    assert not list(tmp_path.glob("*.partial.*"))


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"
