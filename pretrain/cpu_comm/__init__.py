"""Communication and device patches that let paddle's GPU-only parallel code run on CPU processes (gloo).

Loaded only by CPU runs of the layouts that need them; a GPU run never imports this package.
``pretrain.cpu_comm.sharding``: sharding stage2 and stage3.
"""
