"""Write files aside and rename them into place only on success, so no half-written file looks valid."""

import os
from contextlib import contextmanager


def partial_path(path: str) -> str:
    """The temporary name a file is written under before it is renamed to ``path``."""
    return f"{path}.partial.{os.getpid()}"


@contextmanager
def atomic_outputs(*paths: str):
    """Yield temporary paths for ``paths``; on success rename each into place, on error delete them.

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
    for tmp, final in zip(tmp_paths, paths):
        os.replace(tmp, final)
