"""Tensor, sequence and pipeline parallelism on CPU processes: what NCCL provides and gloo lacks.

paddle 3.3.1's hybrid-parallel layers (``paddle.distributed.fleet``) and paddlenlp 3.0.0b4's
models on top of them are written for NCCL. On a CPU build (gloo) they stop at:

- process-group methods gloo does not implement (``collectives``): every ``*_on_calc_stream``
  variant, reduce_scatter (sequence parallelism), all_to_all and all_to_all_single (expert parallelism);
- tensor-parallel ops without a CPU kernel (``kernels``): c_identity, c_split, c_concat and the
  parallel cross-entropy c_softmax_with_cross_entropy (``tensor_parallel_output``);
- two GPU-place assumptions (``places``): ``broadcast_input_data``, ``ParallelEnv().device_id``;
- batched pipeline P2P that relies on NCCL's non-blocking sends and one tag sequence per pair of
  ranks (``pipeline``);
- the pipeline layer's recompute, which saves the random states only on GPU, XPU and custom devices
  (``recompute``);
- creating gloo groups of different members, as fleet does for any hybrid layout of 4 or more ranks
  (``groups``);
- group-sharded stage2/stage3 wrappers and optimizer that accept only GPU, XPU and custom devices
  (``sharding``).

Modules:

  collectives  -- process-group methods gloo lacks (calc-stream variants, reduce_scatter, all_to_all).
  kernels      -- CPU versions of c_identity, c_split, c_concat and the parallel cross-entropy.
  places       -- broadcast_input_data and ParallelEnv().device_id on a CPU place.
  pipeline     -- pipeline P2P on 2-rank groups per neighbouring pair, in a deadlock-free order.
  recompute    -- the pipeline layer's recompute_interval segments through paddle's reentrant recompute.
  groups       -- one rendezvous store per gloo group (groups of different members collide in the job's).
  sharding     -- paddle's group-sharded stage2/stage3 wrappers built on a CPU device.

Each replacement keeps the contract of what it replaces (written beside it) and only moves data,
except the parallel cross-entropy, which computes the loss as the GPU kernel does. GPU runs never
import the package. A CPU launch of several processes installs ``groups`` before ``fleet.init``
(``pretrain.layout.install_cpu_group_stores``); the rest is installed only when the tensor or
pipeline degree is above 1 or experts are spread over ranks (``use_expert_parallel``;
``pretrain.layout.install_cpu_communication``); ``sharding`` when the run uses sharding stage2/3 over
several ranks (also ``install_cpu_communication``).
"""

from __future__ import annotations

from pretrain.cpu_comm.collectives import install_collectives
from pretrain.cpu_comm.kernels import install_kernels
from pretrain.cpu_comm.pipeline import install_pipeline
from pretrain.cpu_comm.places import install_places
from pretrain.cpu_comm.recompute import install_recompute


def install(hcg) -> None:
    """Install every replacement for this process; ``hcg`` is fleet's ``HybridCommunicateGroup``
    (after ``fleet.init``). Collective when the pipeline degree is above 1 (creates groups)."""
    install_collectives()
    install_kernels()
    install_places()
    if hcg.get_pipe_parallel_world_size() > 1:
        install_pipeline(hcg)
        install_recompute()
