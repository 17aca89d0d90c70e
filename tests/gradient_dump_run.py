"""run_pretrain.py saving, at each optimizer step, the gradients the optimizer is about to apply:
``<output_dir>/gradients/step<N>_rank<R>.npz`` ``{single-model name: float32 array}`` of the parameters
that rank's optimizer updates (all of them in one process or data parallel; under expert parallelism its
own experts and the replicated weights; under sharding the weights of its shard), after the gradients'
reduction and before clipping. ``rank_gradients`` merges the ranks' files of one step."""

import glob
import os
import runpy
import sys

import numpy as np
import paddle

import pretrain.model

GRADIENTS = "gradients"  # the folder under output_dir
_build_model = pretrain.model.build_model
_apply_optimize = paddle.optimizer.Optimizer._apply_optimize
_built = {}  # "model": the model run_pretrain.py built
_steps = [0]


def _keep_model(plan):
    _built["model"] = _build_model(plan)
    return _built["model"]


def _dump_then_apply(self, loss, startup_program, params_grads, *args, **kwargs):
    _steps[0] += 1
    names = {param.name: name for name, param in _built["model"].named_parameters()}
    gradients = {names[param.name]: grad.numpy() for param, grad in params_grads if grad is not None}
    folder = os.path.join(sys.argv[sys.argv.index("--output_dir") + 1], GRADIENTS)
    os.makedirs(folder, exist_ok=True)
    np.savez(os.path.join(folder, f"step{_steps[0]}_rank{paddle.distributed.get_rank()}.npz"), **gradients)
    return _apply_optimize(self, loss, startup_program, params_grads, *args, **kwargs)


def rank_gradients(output_dir: str, step: int) -> dict:
    """``{name: array}`` of ``step``'s gradients over every rank of a run of this script (a weight that
    several ranks update has the same gradient on each: the first rank's is kept).

    Raises:
        AssertionError: no rank saved that step.
    """
    files = sorted(glob.glob(os.path.join(output_dir, GRADIENTS, f"step{step}_rank*.npz")))
    assert files, f"no gradients of step {step} under {output_dir}"
    merged = {}
    for file in files:
        with np.load(file) as saved:
            merged.update({name: saved[name] for name in saved.files if name not in merged})
    return merged


if __name__ == "__main__":
    pretrain.model.build_model = _keep_model  # before run_pretrain.py imports it
    paddle.optimizer.Optimizer._apply_optimize = _dump_then_apply  # AdamW's, under sharding's too
    sys.argv[0] = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "run_pretrain.py")
    runpy.run_path(sys.argv[0], run_name="__main__")
