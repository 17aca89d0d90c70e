"""The import map of the ``pretrain`` package: no cycles, and every import runs down the layers below.

Each module (or package) has a layer; a module imports only from its own layer or a lower one, and
the two application packages (fine-tuning, preprocessing) do not import each other. So the training
code imports nothing from the preprocessing package, the metrics import nothing of the run they
report on, and a cycle cannot form across layers. Within a layer, no two packages or modules
import each other, even through different modules (a loop in the package map). Imports inside
functions count: a lazy import is still a dependency.
"""

import ast
import os

from conftest import REPO

# Top to bottom; names are modules or packages (a package's modules inherit its layer).
LAYERS = (
    ("application", ("finetune", "preprocess")),
    ("rehearse", ("rehearsal", "support_matrix")),
    ("run", ("resolve", "preflight", "report", "forecast", "trainer", "hf_export", "finished", "use")),
    (
        "build",
        (
            "arguments",
            "data",
            "document_mask",
            "sample_log",
            "model",
            "model_config",
            "checkpoint",
            "nan_guard",
            "preemption",
            "recovery",
            "resume_layout",
            "run_lock",
            "tokenizers",
            "tokenizer_json",
            "tokenizer_folder",
            "routing",
            "bias_balancing",
            "checkpoint_manager",
            "step_verdict",
            "optimizer_chain",
            "moe_training",
        ),
    ),
    ("measure", ("metrics", "planner", "layout", "layout_rules", "param_count", "lr_schedule", "fused_ops")),
    ("facts", ("registry", "families", "models", "corpus", "precision", "hf_import", "compat", "mtp")),
    ("cluster", ("cluster", "cpu_comm")),
    ("foundation", ("errors", "log", "atomic", "enums", "schema", "upstream")),
)
APPLICATIONS = LAYERS[0][1]


def _modules() -> dict:
    """``{dotted module name (without "pretrain."): path}`` of every module of the package."""
    found = {}
    root = os.path.join(REPO, "pretrain")
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, root)[: -len(".py")].replace(os.sep, ".")
                found[dotted.removesuffix("__init__").rstrip(".")] = path
    return found


def _imports(path: str, modules: dict) -> set:
    """The package's modules ``path`` imports (``from pretrain.x import y``: ``x.y`` when that is a module)."""
    found = set()
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "pretrain":
            base = node.module.removeprefix("pretrain").lstrip(".")
            for alias in node.names:
                name = f"{base}.{alias.name}".lstrip(".")
                found.add(name if name in modules else base)
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("pretrain.") for a in node.names if a.name.startswith("pretrain.")}
    return found


def _layer(module: str) -> int:
    """Index of ``module``'s layer in LAYERS (0 = top); the package itself (``""``) is the foundation."""
    for index, (_, names) in enumerate(LAYERS):
        if module.split(".")[0] in names:
            return index
    raise AssertionError(f"pretrain.{module} has no layer: add it to LAYERS in tests/test_import_map.py")


def _upward(graph: dict) -> list:
    """``module -> imported`` edges that run up a layer or between the application packages."""
    found = []
    for module, imported in graph.items():
        for target in imported:
            if target == "" or module == "":
                continue
            top, other = module.split(".")[0], target.split(".")[0]
            between_applications = top in APPLICATIONS and other in APPLICATIONS and top != other
            if _layer(target) < _layer(module) or between_applications:
                found.append(f"pretrain.{module} -> pretrain.{target}")
    return sorted(found)


def _cycles(graph: dict) -> list:
    """Each import cycle once, as the list of its modules (depth-first search for back edges)."""
    found, state = [], {}

    def visit(module: str, stack: list) -> None:
        state[module] = "open"
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                found.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    return found


def _packages(graph: dict) -> dict:
    """``graph`` seen as the package map: each module's imports by top-level module or package."""
    found: dict = {}
    for module, imported in graph.items():
        top = module.split(".")[0]
        found.setdefault(top, set()).update(t.split(".")[0] for t in imported if t and t.split(".")[0] != top)
    return found


def _graph() -> dict:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def test_the_rules_see_a_violation():
    graph = {"corpus": {"preprocess.pipeline"}, "preprocess.pipeline": {"corpus"}, "finetune.run": {"preprocess.jsonl"}}
    assert _upward(graph) == [
        "pretrain.corpus -> pretrain.preprocess.pipeline",
        "pretrain.finetune.run -> pretrain.preprocess.jsonl",
    ]
    assert _cycles(graph) == [["corpus", "preprocess.pipeline", "corpus"]]
    modules_apart = {"errors": {"cluster.process_end"}, "cluster.agreement": {"errors"}, "cluster.process_end": set()}
    assert _cycles(modules_apart) == []
    assert _cycles(_packages(modules_apart)) == [["cluster", "errors", "cluster"]]


def test_every_import_runs_down_and_none_is_a_cycle():
    graph = _graph()
    assert {"corpus", "finetune.run", "metrics.board", "planner.estimate", "preprocess.pipeline"} <= set(graph)
    assert _upward(graph) == []
    assert _cycles(graph) == []
    assert _cycles(_packages(graph)) == []


def test_training_imports_nothing_from_the_preprocessing_package():
    graph = _graph()
    training = [name for name in graph if name.split(".")[0] not in APPLICATIONS]
    uses = {name: sorted(t for t in graph[name] if t.split(".")[0] == "preprocess") for name in training}
    assert {name: targets for name, targets in uses.items() if targets} == {}


def _documented(package_folder: str) -> set:
    """Names in the module map of a package's docstring: lines ``  name  -- what it does``."""
    with open(os.path.join(package_folder, "__init__.py"), encoding="utf-8") as f:
        docstring = ast.get_docstring(ast.parse(f.read())) or ""
    return {line.split()[0] for line in docstring.splitlines() if line.startswith("  ") and " -- " in line}


def test_every_module_map_and_the_readme_layout_match_the_tree():
    root = os.path.join(REPO, "pretrain")
    packages = [root] + [
        os.path.join(root, n) for n in sorted(os.listdir(root)) if os.path.isdir(os.path.join(root, n))
    ]
    packages = [folder for folder in packages if os.path.isfile(os.path.join(folder, "__init__.py"))]
    assert {os.path.basename(folder) for folder in packages} >= {
        "pretrain",
        "metrics",
        "finetune",
        "planner",
        "preprocess",
    }
    for folder in packages:
        names = {n[: -len(".py")] for n in os.listdir(folder) if n.endswith(".py") and n != "__init__.py"}
        names |= {n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n, "__init__.py"))}
        assert _documented(folder) == names, os.path.relpath(folder, REPO)
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    for folder in packages[1:]:
        assert f"| `{os.path.relpath(folder, REPO)}/` |" in readme
