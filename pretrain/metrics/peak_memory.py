"""Peak memory of this process's card, in GiB (2**30 bytes).

GPU: paddle's allocator peaks, ``max_memory_allocated`` (what tensors held: the figure PaddleNLP's
benchmark table quotes) and ``max_memory_reserved`` (what the caching allocator took from the
driver: closer to what nvidia-smi shows). CPU: the process's peak resident set size.
"""

from __future__ import annotations

import resource

import paddle

GIB = 2**30  # bytes in a GiB: the one definition (memory figures, checkpoint sizes, the planner)


def peak_memory_gib() -> dict:
    """Peak memory of this process since it started.

    Returns:
        On GPU ``{"peak_memory_gib": allocated, "peak_memory_reserved_gib": reserved,
        "peak_memory_kind": "gpu_max_allocated"}``; on CPU ``{"peak_memory_gib": peak RSS,
        "peak_memory_kind": "cpu_peak_rss"}`` (``ru_maxrss`` is in KiB on Linux).
    """
    if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
        return {
            "peak_memory_gib": paddle.device.cuda.max_memory_allocated() / GIB,
            "peak_memory_reserved_gib": paddle.device.cuda.max_memory_reserved() / GIB,
            "peak_memory_kind": "gpu_max_allocated",
        }
    return {
        "peak_memory_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB,
        "peak_memory_kind": "cpu_peak_rss",
    }
