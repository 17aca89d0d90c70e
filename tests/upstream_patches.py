"""What the ledger's process-wide patches replace, snapshot and put back (``tests/conftest.py`` does it around
every test module, so a module that installs a patch leaves none for the next one in the same worker)."""

import importlib

from pretrain.upstream import PATCHES


def resolve(target: str) -> tuple:
    """``"module:Obj.attr"`` -> (the object holding the last name, that name); ``"module:Obj"`` -> (module, "Obj")."""
    module_name, _, path = target.partition(":")
    owner = importlib.import_module(module_name)
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    return owner, name


def snapshot() -> list:
    """``[(owner, name, value or None, its attributes or None)]`` for every process-scope target: the value of an
    attribute, and of a class or module named whole (``ProcessGroupGloo``, ``_C_ops``) its own attributes."""
    taken = []
    for patch in PATCHES:
        if patch.scope != "process":
            continue
        for target in patch.targets:
            owner, name = resolve(target)
            value = vars(owner).get(name) if hasattr(owner, "__dict__") else getattr(owner, name, None)
            whole = dict(vars(value)) if isinstance(value, type) or type(value).__name__ == "module" else None
            taken.append((owner, name, value, whole))
    return taken


def restore(taken: list) -> None:
    """Put back what ``snapshot`` took: attributes added since are removed, changed ones set back."""
    for owner, name, value, whole in taken:
        if whole is not None:
            current = vars(value)
            for key in [key for key in current if key not in whole]:
                delattr(value, key)
            for key, original in whole.items():
                if current.get(key) is not original and not key.startswith("__"):
                    setattr(value, key, original)
        elif value is None:
            if name in vars(owner):
                delattr(owner, name)
        elif getattr(owner, name, None) is not value:
            setattr(owner, name, value)
