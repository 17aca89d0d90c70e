"""The ledger of upstream patches (``pretrain.upstream``): complete, resolvable, guarded by version, installed
in order, and undone between test modules."""

import ast
import os
from types import SimpleNamespace

import paddle
import paddlenlp
import pytest
from conftest import REPO, pretrain_log_records
from test_import_map import _modules
from upstream_patches import resolve, restore, snapshot

from pretrain import upstream
from pretrain.errors import UserError

UPSTREAM_PACKAGES = ("paddle", "paddlenlp")


def upstream_assignments(source: str) -> list:
    """``[(line, "root.attr...")]``: assignments (and ``setattr`` calls) to an attribute of a name the source binds
    by importing it from paddle or paddlenlp (a module, class or function of theirs)."""
    tree = ast.parse(source)
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UPSTREAM_PACKAGES:
            imported |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            imported |= {
                (alias.asname or alias.name).split(".")[0]
                for alias in node.names
                if alias.name.split(".")[0] in UPSTREAM_PACKAGES
            }

    def root(node):
        while isinstance(node, ast.Attribute):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            targets = [node.args[0]]
        for target in targets:
            if isinstance(target, (ast.Attribute, ast.Name)) and root(target) in imported:
                if isinstance(target, ast.Attribute) or node.func.id == "setattr":  # type: ignore[union-attr]
                    found.append((node.lineno, ast.unparse(target)))
    return found


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_every_patch_of_paddle_or_paddlenlp_is_in_a_module_the_ledger_names():
    sites = {patch.site for patch in upstream.PATCHES}
    unlisted = {
        f"{os.path.relpath(path, REPO)}:{line} {target}"
        for module, path in _modules().items()
        if module not in sites
        for line, target in upstream_assignments(_read(path))
    }
    assert unlisted == set()


def test_the_scanner_finds_a_patch_outside_the_ledger():
    """The deliberately broken piece: a module that patches paddle without a ledger row is found."""
    source = (
        "from paddle.distributed import collective\nimport paddle\ncollective.x = 1\nsetattr(paddle._C_ops, 'y', 2)\n"
    )
    assert upstream_assignments(source) == [(3, "collective.x"), (4, "paddle._C_ops")]
    assert upstream_assignments("import os\nos.environ = {}\n") == []


@pytest.mark.parametrize("patch", upstream.PATCHES, ids=lambda patch: patch.name)
def test_every_row_names_an_installer_and_targets_that_exist(patch):
    import importlib

    module = importlib.import_module(f"pretrain.{patch.site}")
    assert callable(getattr(module, patch.installer.split(".")[0])), patch.installer
    for target in patch.targets:
        owner, name = resolve(target)
        assert patch.scope == "instance" or hasattr(owner, name) or name == "_device_id", target
    assert patch.upstream and patch.why and patch.on_other_versions in ("skip", "warn", "refuse")


def test_the_installed_stack_is_the_one_the_patches_were_verified_on():
    """The pinned CPU stack (requirements-cpu.txt) is the ledger's versions, and those are installed."""
    with open(os.path.join(REPO, "requirements-cpu.txt"), encoding="utf-8") as f:
        pins = dict(line.strip().split("==") for line in f if line.startswith(("paddlepaddle==", "paddlenlp==")))
    assert pins == {"paddlepaddle": upstream.PADDLE_VERSION, "paddlenlp": upstream.PADDLENLP_VERSION}
    assert upstream.installed() == {"paddle": upstream.PADDLE_VERSION, "paddlenlp": upstream.PADDLENLP_VERSION}


def test_on_another_version_a_fix_is_left_out_a_needed_patch_warns_and_a_cpu_stand_in_refuses(monkeypatch):
    monkeypatch.setattr(upstream, "_WARNED", set())
    monkeypatch.setattr(paddlenlp, "__version__", "3.1.0")
    with pretrain_log_records() as messages:
        assert not upstream.verified("moe-routing")
        assert not upstream.verified("moe-routing")  # one warning per process
        assert upstream.verified("stage3-weight-decay-and-expert-parallel-clip")
    assert messages == [
        "moe-routing: paddle 3.3.1 / paddlenlp 3.1.0 is not paddlepaddle==3.3.1 paddlenlp==3.0.0b4, whose "
        "paddlenlp/transformers/moe_gate.py:213, :498; paddlenlp/transformers/mixtral/modeling.py:500 the patch was "
        "written for; left unpatched",
        "stage3-weight-decay-and-expert-parallel-clip: paddle 3.3.1 / paddlenlp 3.1.0 is not paddlepaddle==3.3.1 "
        "paddlenlp==3.0.0b4, whose paddlenlp/trainer/trainer.py:create_optimizer (decay_parameters); "
        "paddle/nn/clip.py ClipGradByGlobalNorm the patch was written for; applied unverified",
    ]
    monkeypatch.setattr(paddle, "__version__", "3.4.0")
    with pytest.raises(UserError, match=r"^cpu-collectives: .* install paddlepaddle==3.3.1 paddlenlp==3.0.0b4 for CPU"):
        upstream.verified("cpu-collectives")
    monkeypatch.undo()
    assert upstream.verified("moe-routing")


def test_the_cpu_collectives_refuse_to_go_in_after_the_byte_counter():
    """The counter wraps the methods the collectives replace: installed the other way round, every reduce_scatter
    and all_to_all would go uncounted."""
    from pretrain.cpu_comm.collectives import install_collectives
    from pretrain.metrics.comm_volume import install_counter

    taken = snapshot()
    try:
        install_counter(SimpleNamespace(device="cpu", world_size=2))
        with pytest.raises(RuntimeError, match="install the collectives first"):
            install_collectives()
        restore(taken)
        install_collectives()  # the right order
        install_counter(SimpleNamespace(device="cpu", world_size=2))
    finally:
        restore(taken)


def test_what_a_module_installs_is_undone_for_the_next():
    """conftest's module fixture: the snapshot taken before this module is what restore puts back."""
    from paddle.base import core

    from pretrain.cpu_comm.collectives import install_collectives

    before, upstreams = snapshot(), dict(vars(core.ProcessGroupGloo))
    install_collectives()
    assert "all_to_all_single" in vars(core.ProcessGroupGloo) and "all_to_all_single" not in upstreams
    restore(before)
    assert dict(vars(core.ProcessGroupGloo)) == upstreams
