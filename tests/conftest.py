"""Shared fixtures: the repository root, the demo corpus (`make data`), data/tokenizers (`make tokenizers`),
entry scripts in-process."""

import contextlib
import functools
import importlib.util
import logging
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_DIR = os.path.join(REPO, "data", "demo")
TOKENIZERS_DIR = os.path.join(REPO, "data", "tokenizers")


def script_env(extra: dict = None) -> dict:
    """The environment for a child process: this checkout's ``pretrain`` first on the path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    env.update(extra or {})
    return env


def run_script(script: str, *args: str, cwd: str = REPO, env: dict = None, timeout: int = 900):
    """Run a repo script with this interpreter; return the CompletedProcess (text, both streams captured).

    ``env`` adds variables to ``script_env()``.
    """
    return subprocess.run(
        [sys.executable, os.path.join(REPO, script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=script_env(env),
        timeout=timeout,
    )


@functools.lru_cache(maxsize=None)
def load_script(script: str):
    """A repo script (e.g. ``run_pretrain.py``, ``tools/benchmark.py``) imported as a module, to call
    its ``main`` in this process (no second paddlenlp import: seconds saved per test)."""
    name = "script_" + os.path.splitext(script)[0].replace(os.sep, "_")
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, script))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def pretrain_log_records():
    """Collect the messages the ``pretrain`` logger emits inside the block (it does not propagate to
    pytest's caplog): ``with pretrain_log_records() as messages: ...``."""
    from pretrain.log import logger

    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


def resolve_plan(argv: list):
    """The ``RunPlan`` of ``run_pretrain.py ARGV`` (parsed and resolved, not checked)."""
    from pretrain.arguments import parse_arguments
    from pretrain.resolve import resolve_run

    return resolve_run(*parse_arguments(argv))


def count_parameters(model) -> tuple:
    """(total, input-embedding) parameters of a built model: the reference for pretrain.param_count."""
    total = sum(int(p.numel()) for p in model.parameters())
    embedding = int(model.get_input_embeddings().weight.numel())
    return total, embedding


@pytest.fixture(autouse=True)
def launches_are_marked(request, monkeypatch):
    """A test that starts a process (``subprocess.Popen``, ``multiprocessing``) is marked ``launch`` (itself or its
    file): ``-m "not launch"`` selects the unit tests, none of which starts one."""
    import multiprocessing.process

    started = []
    popen_init, process_start = subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start

    def counted_popen(self, *args, **kwargs):
        started.append(args[0] if args else kwargs.get("args"))
        popen_init(self, *args, **kwargs)

    def counted_start(self):
        started.append(self.name)
        process_start(self)

    monkeypatch.setattr(subprocess.Popen, "__init__", counted_popen)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", counted_start)
    yield
    if started and request.node.get_closest_marker("launch") is None:
        pytest.fail(f"{request.node.nodeid} started {started[0]!r} but is not marked launch", pytrace=False)


@pytest.fixture(scope="module", autouse=True)
def upstream_patches_undone():
    """Every process-wide patch of paddle/paddlenlp (the ledger, ``pretrain.upstream``) a test module installs is
    taken back when it ends: the next module in the same worker starts from upstream's code."""
    from upstream_patches import restore, snapshot

    taken = snapshot()
    yield
    restore(taken)


@pytest.fixture
def launches(tmp_path):
    """A test's ``tiny_run.Launches``: what is left of them is killed when the test ends."""
    from tiny_run import Launches  # tiny_run imports this module

    runs = Launches(tmp_path)
    yield runs
    runs.close()


def fixture_folder(request, tmp_path_factory, name: str) -> str:
    """A new folder for the runs of a module- or session-scoped fixture, deleted when that fixture is torn down
    unless a test failed meanwhile (then kept for its logs, as pytest.ini's ``tmp_path_retention_policy = failed``
    keeps a failed test's ``tmp_path``). The suite writes about 20 GiB of checkpoints in all: kept to the end, they
    filled a CI disk (preflight then refused the next runs: "output_dir: ... has 0.00 GiB free")."""
    folder, failed = str(tmp_path_factory.mktemp(name)), request.session.testsfailed

    def remove():
        if request.session.testsfailed == failed:
            shutil.rmtree(folder, ignore_errors=True)

    request.addfinalizer(remove)
    return folder


@pytest.fixture(scope="session")
def one_and_two_ranks(tmp_path_factory, demo_dir):
    """(1-process, 2-rank data-parallel) output folders of the tiny run at one global batch, evaluated
    (``tiny_run.run_on_one_and_two_ranks``): shared by the tests that compare the two layouts or resume them."""
    from tiny_run import run_on_one_and_two_ranks  # tiny_run imports this module

    return run_on_one_and_two_ranks(str(tmp_path_factory.mktemp("one_and_two_ranks")))


@pytest.fixture(scope="session")
def demo_dir():
    """data/demo with corpus.jsonl, tokenizer/ and demo_text_document.bin/.idx (made by `make data`)."""
    if not os.path.isfile(os.path.join(DEMO_DIR, "demo_text_document.idx")):
        pytest.fail("data/demo is missing: run `make data` (make test does it first)")
    return DEMO_DIR


@pytest.fixture(scope="session")
def real_tokenizers():
    """{name: folder} of the published tokenizers in data/tokenizers (fetched by `make tokenizers`, no network here)."""
    from pretrain.preprocess.fetch_tokenizers import SOURCES

    folders = {name: os.path.join(TOKENIZERS_DIR, name) for name in SOURCES}
    missing = [
        name for name, folder in folders.items() if not os.path.isfile(os.path.join(folder, "tokenizer_config.json"))
    ]
    if missing:
        pytest.fail(f"data/tokenizers/{{{','.join(missing)}}} missing: run `make tokenizers` (make test does it first)")
    return folders
