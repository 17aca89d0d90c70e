"""Communication and device patches that let paddle's GPU-only parallel code run on CPU processes (gloo).

Loaded only by CPU runs of the layouts that need them; a GPU run never imports this package.
Modules:

  sharding     -- paddle's group-sharded stage2/stage3 wrappers built on a CPU device.
"""
