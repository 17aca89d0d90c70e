"""The optimizer state each rank keeps under sharding stage2, at the state-dict level (stage2 needs a GPU: paddle's
``GroupShardedOptimizerStage2`` asserts CUDA in its constructor, so the attributes it sets before that are set here,
and its own segmentation, ``state_dict`` and ``set_state_dict`` run on them, over a bf16 model and paddle's AdamW
with fp32 master weights, as paddlenlp builds them under bf16 O2).

- checkpoint-0 (``loss_spike_policy rollback``) creates Adam moments and master weights for this rank's own
  parameters only: the ranks' states are disjoint, their union is every parameter (it created them for every
  parameter on every rank, never freed: about +30 GB per card for Llama-2-7B TP2);
- resuming a stage2 x2 checkpoint on stage2 x3 gives each rank's optimizer its own parameters' entries only, as
  stage1 filters them (it loaded the union on every rank; the next save's shards overlapped).
"""

import os
from types import SimpleNamespace

import paddle
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_optimizer_stage2 import GroupShardedOptimizerStage2
from paddlenlp.trainer.trainer import SCHEDULER_NAME

from pretrain.checkpoint_manager import CheckpointManager
from pretrain.optimizer_chain import create_own_moments


def _model() -> paddle.nn.Layer:
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.Linear(16, 16), paddle.nn.Linear(16, 4))
    return model.to(dtype="bfloat16")


def _stage2(model, rank: int, degree: int) -> GroupShardedOptimizerStage2:
    """paddle's stage2 optimizer over AdamW (fp32 master weights) of ``model``, as rank ``rank`` of a sharding
    group of ``degree``, with what its constructor sets before its GPU-only part."""
    inner = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters(), multi_precision=True)
    stage2 = GroupShardedOptimizerStage2.__new__(GroupShardedOptimizerStage2)
    stage2._optim, stage2._local_params = inner, list(inner._parameter_list)
    stage2.world_size, stage2._rank = degree, rank
    stage2._param2rank, stage2._GroupShardedOptimizerStage2__segment_params = {}, []
    return stage2


def _own(stage2) -> set:
    return {name for name, rank in stage2.param2rank.items() if rank == stage2._rank}


def _parameters_with_state(state: dict, model) -> set:
    """Names of ``model``'s parameters an optimizer state holds entries of (accumulators ``<name>_...``, master
    weights)."""
    names = {p.name for p in model.parameters()}
    with_accumulators = {name for name in names if any(key.startswith(f"{name}_") for key in state)}
    return with_accumulators | set(state.get("master_weights", {}))


def _initial_states(model, degree: int) -> list:
    """Each rank's optimizer state as checkpoint-0 holds it (``CheckpointManager.save_initial`` creates the moments
    with ``create_own_moments``), as paddlenlp saves it (``optimizer.state_dict()``: ``optimizer.shard0<rank>``)."""
    states = []
    for rank in range(degree):
        stage2 = _stage2(model, rank, degree)
        create_own_moments(stage2)
        state = stage2.state_dict()
        assert _parameters_with_state(state, model) == set(state["master_weights"]) == _own(stage2), rank
        states.append(state)
    return states


def test_checkpoint_0_under_stage2_holds_each_ranks_own_moments_and_master_weights():
    model = _model()
    first, second = (_parameters_with_state(state, model) for state in _initial_states(model, 2))
    assert first and second and first.isdisjoint(second)
    assert first | second == {p.name for p in model.parameters()}


def _saved_over_stage2_x2(model, folder) -> None:
    """The optimizer shards of a stage2 x2 run in ``folder``: each rank's AdamW state of its own parameters."""
    for rank in range(2):
        stage2 = _stage2(model, rank, 2)
        own = [p for p in model.parameters() if p.name in _own(stage2)]
        stage2._optim._create_accumulators(paddle.static.default_main_program().global_block(), own)
        paddle.save(stage2.state_dict(), os.path.join(folder, f"optimizer.shard0{rank}.pdopt"))
    paddle.save({"last_epoch": 0}, os.path.join(folder, SCHEDULER_NAME))


def _resume_on_stage2_x3(model, folder, rank: int, **args) -> SimpleNamespace:
    """Resume ``folder`` as sharding rank ``rank`` of stage2 x3 (alone: the other ranks' collectives are not
    needed); ``args``: what differs (the data-parallel rank and degree). The optimizer it loaded into."""
    layout = dict(tensor_parallel_degree=1, pipeline_parallel_degree=1, virtual_pp_degree=1, sharding="stage2")
    layout.update(sharding_parallel_degree=3, data_parallel_degree=1, sep_parallel_degree=1)
    layout.update(context_parallel_degree=1, sequence_parallel=False, use_hybrid_parallel=True, local_rank=-1)
    resumed = dict(should_load_sharding_stage1_model=False, ignore_load_lr_and_optim=False, tensor_parallel_rank=0)
    resumed.update(pipeline_parallel_rank=0, data_parallel_rank=0, world_size=1)
    stage2 = _stage2(model, rank, 3)
    trainer = SimpleNamespace(
        args=SimpleNamespace(**{**layout, **resumed, **args}),
        model=model,
        optimizer=stage2,
        lr_scheduler=SimpleNamespace(set_state_dict=lambda state: None),
        do_grad_scaling=False,
    )
    manager = CheckpointManager(trainer, states=[])
    manager.output_dir_shared = True

    def paddlenlp_load():
        raise AssertionError("a checkpoint of another sharding degree went to paddlenlp's load")

    manager.load_optimizer_and_scheduler(str(folder), paddlenlp_load)
    return stage2


def test_resuming_on_another_stage2_degree_loads_only_this_ranks_own_state(tmp_path):
    model = _model()
    _saved_over_stage2_x2(model, tmp_path)
    for rank in range(3):
        stage2 = _resume_on_stage2_x3(model, tmp_path, rank)
        inner = stage2._optim  # what paddle's stage2 set_state_dict handed the whole state to
        assert set(inner._master_weights) == _own(stage2), rank
        assert _parameters_with_state(inner._accumulators_holder, model) == _own(stage2), rank


def test_a_data_parallel_replica_reads_no_optimizer_shard_and_takes_rank_0s_by_the_broadcast(tmp_path, monkeypatch):
    """Resumed over another sharding degree, data-parallel rank 0 alone reads the shards (as paddlenlp's own
    load does); a replica holds only what the broadcast brings. Before, every replica read every shard of its
    position too, and held two copies of its optimizer state while the broadcast landed (on 13B-class states,
    out of memory where rank 0 alone fits): this test read ``['optimizer.shard00.pdopt', 'optimizer.shard01.pdopt']``
    on data-parallel rank 1."""
    from pretrain import checkpoint_manager, resume_layout

    model = _model()
    _saved_over_stage2_x2(model, tmp_path)
    read, load = [], paddle.load

    def load_counted(path, **kwargs):  # the optimizer files read (the schedule is read by every rank)
        if path.endswith(".pdopt"):
            read.append(os.path.basename(path))
        return load(path, **kwargs)

    broadcast, sent = [], {}  # what data-parallel rank 0 sends: its merged state (paddlenlp's broadcast_dp_optimizer)

    def broadcast_dp_optimizer(state):
        broadcast.append(state)
        return state if state is not None else sent["state"]

    monkeypatch.setattr(resume_layout.paddle, "load", load_counted)
    monkeypatch.setattr(checkpoint_manager, "broadcast_dp_optimizer", broadcast_dp_optimizer)
    first = _resume_on_stage2_x3(model, tmp_path, 0, data_parallel_degree=2)
    assert read == ["optimizer.shard00.pdopt", "optimizer.shard01.pdopt"] and broadcast[-1] is not None
    read.clear()
    sent["state"] = broadcast[-1]
    replica = _resume_on_stage2_x3(model, tmp_path, 0, data_parallel_degree=2, data_parallel_rank=1)
    assert read == [] and broadcast[-1] is None  # nothing of its own: rank 0's state arrives
    assert set(replica._optim._master_weights) == set(first._optim._master_weights) == _own(first)
