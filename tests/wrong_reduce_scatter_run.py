"""run_pretrain.py with a deliberately wrong ``pretrain.cpu_comm`` reduce_scatter: each rank gets the next
rank's chunk of the sum. The golden comparison (test_parallel_layouts.py) must catch it."""

import os
import runpy
import sys

import paddle

from pretrain.cpu_comm import collectives


def next_ranks_chunk(self, out, tensor, op, sync_op=True):
    reduced = tensor.clone()
    task = self.all_reduce(reduced, op, True)
    paddle.assign(paddle.split(reduced, self.size(), axis=0)[(self.rank() + 1) % self.size()], output=out)
    return task


if __name__ == "__main__":
    collectives.reduce_scatter = next_ranks_chunk  # before run_pretrain.py installs the layer
    sys.argv[0] = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "run_pretrain.py")
    runpy.run_path(sys.argv[0], run_name="__main__")
