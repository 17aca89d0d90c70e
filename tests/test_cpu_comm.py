"""pretrain.cpu_comm: each gloo stand-in against the definition of what it replaces (2 processes), and
only CPU runs with tensor or pipeline parallelism load it."""

import os
import sys
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from conftest import REPO
from paddle.distributed import collective
from tiny_run import run

from pretrain.layout import install_cpu_communication, install_cpu_group_stores
from pretrain.preflight import DeviceSupport, check_device

pytestmark = pytest.mark.launch  # its tests start processes (tests/conftest.py checks)

CHECKS = {
    "tensor": [
        *("all_reduce_on_calc_stream", "all_gather_into_tensor_on_calc_stream", "broadcast_on_calc_stream"),
        *("reduce_on_calc_stream", "send/recv_on_calc_stream", "reduce_scatter"),
        "reduce_scatter_tensor_on_calc_stream",
        *("all_to_all", "all_to_all_tensor_on_calc_stream", "alltoall_single (all_to_all_single_on_calc_stream)"),
        *("c_identity", "c_identity backward (all-reduce)"),
        *("c_split", "c_concat", "c_concat backward (c_split)", "c_softmax_with_cross_entropy loss"),
        *("c_softmax_with_cross_entropy softmax", "c_softmax_with_cross_entropy backward"),
        *("broadcast_input_data", "ParallelEnv().device_id"),
    ],
    "pipeline": ["batch_send_recv_on_calc_stream"],
}


@pytest.mark.parametrize("mode", sorted(CHECKS))
def test_each_replacement_matches_its_definition(tmp_path, mode):
    command = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2"]
    command += ["--log_dir", str(tmp_path), os.path.join(REPO, "tests", "cpu_comm_check.py"), mode]
    status = run(command, log_path=str(tmp_path / "launch.log"), timeout=120)
    for rank in (0, 1):
        with open(tmp_path / f"workerlog.{rank}") as f:
            passed = {line[3:].strip() for line in f if line.startswith("ok ")}
        assert set(CHECKS[mode]) <= passed, f"rank {rank}: see {tmp_path}/workerlog.{rank}"
    assert status == 0, f"see {tmp_path}"


@pytest.mark.parametrize(
    "device, cuda, degrees, processes",
    [("gpu", True, (2, 2), "4"), ("cpu", False, (1, 1), "2"), ("cpu", False, (-1, -1), "1")],
    ids=["GPU run with TP2 x PP2", "CPU data parallel", "one process"],
)
def test_only_cpu_runs_with_tensor_or_pipeline_parallelism_load_it(monkeypatch, device, cuda, degrees, processes):
    for name in [n for n in sys.modules if n.startswith("pretrain.cpu_comm")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(paddle, "is_compiled_with_cuda", lambda: cuda)
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", processes)
    monkeypatch.setattr(collective, "_new_process_group_impl", collective._new_process_group_impl)  # restored
    # the group stores: every CPU launch of several processes (before its layout is parsed)
    assert install_cpu_group_stores() == (device == "cpu" and processes != "1")
    args = SimpleNamespace(
        device=device,
        tensor_parallel_degree=degrees[0],
        pipeline_parallel_degree=degrees[1],
        sharding="stage2" if device == "gpu" else "",  # a GPU run with stage2 does not load the sharding patches
        sharding_parallel_degree=2 if device == "gpu" else 1,
        use_expert_parallel=False,
    )
    assert not install_cpu_communication(args)
    loaded = [n for n in sys.modules if n.startswith("pretrain.cpu_comm")]
    assert not loaded if device == "gpu" or processes == "1" else "pretrain.cpu_comm.groups" in loaded


def test_preflight_lets_tensor_pipeline_and_sequence_parallelism_run_on_cpu():
    layout = SimpleNamespace(
        tensor_parallel_degree=2, pipeline_parallel_degree=2, sep_parallel_degree=1, context_parallel_degree=1
    )
    cpu = DeviceSupport("cpu", False, False, False)
    args = SimpleNamespace(
        sequence_parallel=True,
        fp16=False,
        bf16=False,
        sharding="stage2",
        sharding_parallel_config="",
        max_grad_norm=1.0,
    )
    plan = SimpleNamespace(
        training_args=args, layout=SimpleNamespace(**vars(layout), sharding_stage=1, sharding_parallel_degree=2)
    )
    assert check_device(plan, cpu) == []
    args.use_flash_attention = True  # still GPU-only, as the CUDA fused ops
    plan.layout.sharding_stage = 2  # runs on CPU (pretrain.cpu_comm.sharding)
    problems = check_device(plan, cpu)
    assert [problem.split(":")[0] for problem in problems] == ["use_flash_attention"]


def test_the_pipeline_recompute_replays_the_segment_with_its_random_states():
    """``cpu_comm.recompute.recompute_segment`` (the pipeline layer's ``recompute_hybrid`` on CPU): a segment with
    dropout gives the output and gradients of running it plainly from the same random state, runs twice (the
    second time in the backward), and an integer output stops gradients, as recompute_hybrid marks it."""
    from pretrain.cpu_comm.recompute import recompute_segment

    paddle.seed(7)
    layer = paddle.nn.Linear(8, 8)
    calls = []

    def segment(x, ids):
        calls.append(1)
        return paddle.nn.functional.dropout(layer(x), p=0.5), ids + 1

    x = paddle.randn([4, 8])
    ids = paddle.arange(4)
    grads = []
    for run_segment in (segment, lambda *args: recompute_segment({"mp_group": None}, segment, *args)):
        layer.clear_gradients()
        state = paddle.get_rng_state()
        source = x.clone()
        source.stop_gradient = False
        out, next_ids = run_segment(source, ids)
        out.sum().backward()
        paddle.set_rng_state(state)
        grads.append((out.numpy(), layer.weight.grad.numpy(), source.grad.numpy(), next_ids.stop_gradient))
    assert len(calls) == 3  # once plainly; forward and backward under recompute
    for plain, recomputed in zip(*grads):
        np.testing.assert_array_equal(plain, recomputed)
    with pytest.raises(NotImplementedError):
        recompute_segment({"offload": True}, segment, x, ids)
