"""Write files aside and rename them into place only on success, so no half-written file looks valid.

Durable as well as atomic: a file is flushed to disk (fsync) before it is renamed, and its folder
after, so that after a power loss a name either holds the complete file or the previous one.
``file_crc32c`` fingerprints a written file, to tell later whether it changed; ``write_json`` is
the one atomic JSON writer (run config, summary, loss history, checkpoint marker, tool results).
"""

import json
import mmap
import os
from contextlib import contextmanager

import crc32c

READ_BLOCK_BYTES = 64 * 2**20  # bytes checksummed at a time


def partial_path(path: str) -> str:
    """The temporary name a file is written under before it is renamed to ``path``."""
    return f"{path}.partial.{os.getpid()}"


def fsync_path(path: str) -> None:
    """Flush a file's or a folder's data and metadata to disk.

    Raises:
        OSError: ``path`` cannot be opened or flushed.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_crc32c(path: str) -> str:
    """CRC-32C of a file's bytes (in hardware where the CPU has it), as 8 hex digits.

    The file is memory-mapped, not copied: from the page cache this runs at 6-15 GB/s on one core,
    about twice a read() loop's rate.

    Raises:
        OSError: the file cannot be read.
    """
    value = 0
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:  # an empty file cannot be mapped
            return f"{value:08x}"
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
            for start in range(0, len(view), READ_BLOCK_BYTES):
                with view[start : start + READ_BLOCK_BYTES] as block:
                    value = crc32c.crc32c(block, value)
    return f"{value:08x}"


@contextmanager
def atomic_outputs(*paths: str):
    """Yield temporary paths for ``paths``; on success flush and rename each into place, on error delete them.

    The renames happen in the order given: put the file readers open first (e.g. ``.idx``) last.
    """
    tmp_paths = [partial_path(p) for p in paths]
    try:
        yield tmp_paths
    except BaseException:
        for tmp in tmp_paths:
            if os.path.exists(tmp):
                os.remove(tmp)
        raise
    for tmp in tmp_paths:
        fsync_path(tmp)
    for tmp, final in zip(tmp_paths, paths):
        os.replace(tmp, final)
    for folder in {os.path.dirname(os.path.abspath(p)) for p in paths}:
        fsync_path(folder)


def write_json(path: str, value, indent=None, end: str = "") -> None:
    """``value`` as JSON in ``path`` (``json.dump`` with ``indent``, then ``end``), written atomically
    (``atomic_outputs``): readers see the previous file or the complete new one, never part of it."""
    with atomic_outputs(path) as (tmp_path,):
        with open(tmp_path, "w", encoding="utf-8") as f:
            json.dump(value, f, indent=indent)
            f.write(end)
