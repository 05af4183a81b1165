"""Where a file is written before it is renamed into place (atomic writes of traces and results).

A write goes to ``.NAME.partial`` beside ``NAME`` and is then renamed (``os.replace``), so a reader
never sees half a file. If the process is killed mid-write (SIGKILL, power loss), what is left is a
hidden file that the next write to the same ``NAME`` overwrites; older kvbench versions left a
visible ``NAME.partial``, which :func:`partial_path` removes.
"""

from __future__ import annotations

import contextlib
from pathlib import Path


def partial_path(path: Path) -> Path:
    """The temporary path for writing ``path`` (see the module docstring); removes a stale visible one."""
    with contextlib.suppress(OSError):
        path.with_name(path.name + ".partial").unlink(missing_ok=True)
    return path.with_name(f".{path.name}.partial")
