"""What this application relies on in the pinned paddle and paddlenlp, checked in one place, so that an
upgrade fails here, naming the hook, instead of minutes into a run.

- ``pretrain.trainer.PretrainingTrainer`` overrides methods of paddlenlp's ``Trainer``, private ones
  included: each must still exist, with the parameters our override takes, in the same order.
- It reads attributes paddlenlp's ``Trainer`` sets (``self.state``, ``self.do_grad_scaling``, ...):
  each must still be a class attribute or be assigned in paddlenlp's trainer module.
- ``pretrain.layout.simulated_launch`` stubs ``fleet.init``, ``paddle.distributed.init_parallel_env`` and
  ``get_world_size``, and sets the launcher's variables: each must still exist with the parameters
  paddlenlp's ``TrainingArguments`` calls it with, and paddlenlp must still call or read it there.
"""

import ast
import inspect
import os

import paddle
import pytest
from conftest import REPO
from paddle.distributed import fleet
from paddlenlp.trainer import Trainer, trainer, training_args

from pretrain import checkpoint_manager, step_verdict
from pretrain.trainer import PretrainingTrainer

OURS = {name for name, value in vars(PretrainingTrainer).items() if callable(value)}
OVERRIDES = sorted(name for name in OURS if hasattr(Trainer, name))


def _parameters(function) -> list:
    """Names of a function's named parameters, in order (not ``*args`` / ``**kwargs``)."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in inspect.signature(function).parameters.values() if p.kind in kinds]


def test_the_trainers_hook_table_names_every_override():
    """pretrain/trainer.py opens with a table: paddlenlp hook -> what changes -> the owning module."""
    table = inspect.getmodule(PretrainingTrainer).__doc__.split("paddlenlp hook -> what changes")[1]
    listed = {
        name for line in table.splitlines() if line.startswith("- ") for name in line.split("->")[0].split("``")[1::2]
    }
    assert listed == {*OVERRIDES, "on_optimizer_begin"}


def test_the_hooks_we_override_are_the_ones_we_expect():
    # A new override is added here on purpose; a hook paddlenlp renamed leaves our method unused: both show.
    assert OVERRIDES == [
        "__init__",
        "_check_loss_valid",
        "_get_train_sampler",
        "_load_from_checkpoint",
        "_load_optimizer_and_scheduler",
        "_maybe_log_save_evaluate",
        "_print_timer",
        "_rotate_checkpoints",
        "_save_checkpoint",
        "compute_loss",
        "create_optimizer",
        "create_scheduler",
        "evaluate",
        "get_eval_dataloader",
        "get_train_dataloader",
        "log",
        "prediction_step",
        "save_model",
        "train",
        "training_step",
    ]


@pytest.mark.parametrize("name", [name for name in OVERRIDES if name != "__init__"])
def test_each_override_takes_paddlenlp_parameters_in_order(name):
    ours = _parameters(getattr(PretrainingTrainer, name))
    theirs = _parameters(getattr(Trainer, name))
    assert theirs[: len(ours)] == ours, f"paddlenlp's Trainer.{name}{inspect.signature(getattr(Trainer, name))}"


def _attributes_read(cls) -> set:
    """``self.<name>`` names the class's source reads."""
    tree = ast.parse(inspect.getsource(inspect.getmodule(cls)))
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
    return {
        n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
    }


def _attributes_assigned(source: str, class_name: str) -> set:
    """``self.<name> = ...`` targets inside the class ``class_name`` of ``source``."""
    tree = ast.parse(source)
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    found = set()
    for n in ast.walk(node):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                found.add(target.attr)
    return found


def _trainer_attributes_read(module) -> set:
    """``trainer.<name>`` and ``self.trainer.<name>`` names a component module of the trainer reads."""
    tree = ast.parse(inspect.getsource(module))

    def is_trainer(node) -> bool:
        return (isinstance(node, ast.Name) and node.id == "trainer") or (
            isinstance(node, ast.Attribute) and node.attr == "trainer"
        )

    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and is_trainer(n.value)} - {"trainer"}


def test_every_trainer_attribute_we_read_is_paddlenlps_or_ours():
    """Read by the trainer itself and by the components it hands itself to (the checkpoint manager, the step
    verdict)."""
    ours = set(vars(PretrainingTrainer)) | _attributes_assigned(
        inspect.getsource(inspect.getmodule(PretrainingTrainer)), "PretrainingTrainer"
    )
    theirs = _attributes_assigned(inspect.getsource(trainer), "Trainer")
    read = _attributes_read(PretrainingTrainer) - ours
    read |= (_trainer_attributes_read(checkpoint_manager) | _trainer_attributes_read(step_verdict)) - ours
    assert {"state", "do_grad_scaling", "_skip_steps_since_last_logged", "_enable_delay_scale_loss"} <= read
    assert sorted(name for name in read if not hasattr(Trainer, name) and name not in theirs) == []


@pytest.mark.parametrize(
    "stubbed, parameters, call",
    [
        (fleet.init, ["role_maker", "is_collective", "strategy"], "fleet.init(is_collective=True, strategy=strategy)"),
        (paddle.distributed.init_parallel_env, [], "paddle.distributed.init_parallel_env()"),
        (paddle.distributed.get_world_size, ["group"], "paddle.distributed.get_world_size()"),
    ],
    ids=["fleet.init", "init_parallel_env", "get_world_size"],
)
def test_what_simulated_launch_stubs_exists_and_paddlenlp_calls_it(stubbed, parameters, call):
    assert _parameters(stubbed)[: len(parameters)] == parameters
    assert call in inspect.getsource(training_args)


def test_the_launcher_variables_simulated_launch_sets_are_the_ones_paddle_sets_and_reads():
    """``simulated_launch`` sets what ``python -m paddle.distributed.launch`` sets for each rank."""
    from paddle.distributed.launch.controllers import collective

    assert 'os.environ.get("PADDLE_RANK_IN_NODE"' in inspect.getsource(training_args)
    launcher = inspect.getsource(collective)
    with open(os.path.join(REPO, "pretrain", "layout.py"), encoding="utf-8") as f:
        layout = f.read()
    for name in ("PADDLE_RANK_IN_NODE", "PADDLE_NNODES", "PADDLE_LOCAL_SIZE"):
        assert f'"{name}"' in launcher and f'"{name}"' in layout, name
