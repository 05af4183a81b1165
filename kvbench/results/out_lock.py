"""One live run per results file: a lock beside ``--out``, so two runs never write the same file.

Two ``kvbench run`` with the same ``--out`` each rewrote the file at every checkpoint; the file held
one run and the other's rows were lost while both said "wrote N rows" (60,000 of 80,000 rows
lost in a 4-way race). Now the first run holds ``.NAME.lock`` (an advisory ``flock`` on it,
with its process id inside for the message) from its first row to its last write; a second run
that reaches the same file is refused in one line.

The kernel drops a ``flock`` when its process dies (SIGKILL included), so the lock file a dead run
leaves behind is stale and simply taken over; a live holder is never ignored. Where ``fcntl`` does
not exist (Windows), no lock is taken.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from kvbench.errors import InputError

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux or macOS
    fcntl = None  # type: ignore[assignment]


def lock_path(path: Path) -> Path:
    """The lock file of the results file ``path`` (hidden, beside it)."""
    return path.with_name(f".{path.name}.lock")


class OutLock:
    """The lock of one results file, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, path: Path) -> None:
        self.path = lock_path(Path(path))
        self.results_path = Path(path)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock. Raises ``InputError`` (exit 2) when a live process holds it."""
        if fcntl is None or self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise InputError(
                    f"--out {self.results_path}: another kvbench run (process {holder}) is writing "
                    "this file; give another --out or wait until it ends"
                ) from None
            if self._same_file(fd):  # not a file its last holder removed while we opened it
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def _same_file(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self._fd)
        self._fd = None
