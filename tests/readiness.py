"""The one way tests wait for a server, a model, a process or an engine: on readiness, not a short clock.

A loaded 2-core machine (load 3-6, eight developers) once took more than 180 s to import torch, build
the default model and bind ``kvbench serve`` (three fixtures in tests/backends/
test_anthropic.py failed on a 180 s deadline; the file passed alone in 32 s). So a wait ends when the
thing is ready, at once when the thing waited on has died (its exit code and whole log in the
error), and only past ``LIMIT_S`` otherwise: a bound for a hung process, not a guess at a speed.

Imported by its bare name (``from readiness import wait_until``): tests/ is on ``sys.path`` through
tests/conftest.py and is not a package (tests/test_layers.py)."""

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

LIMIT_S = 600.0  # the overall bound: > 3x the slowest start seen under load (180+ s), < pytest's patience
REPO = Path(__file__).resolve().parents[1]


class NotReady(AssertionError):
    """What was waited for never became ready: it died (``exit code ...``) or ``LIMIT_S`` passed."""


def wait_until(
    ready: Callable[[], T],
    what: str,
    *,
    ended: Callable[[], str | None] = lambda: None,
    log: Callable[[], str] = lambda: "",
    limit_s: float = LIMIT_S,
    poll_s: float = 0.05,
) -> T:
    """Call ``ready()`` every ``poll_s`` seconds until it returns something truthy, and return that.

    ``ended()`` says why the thing waited on can no longer become ready (``"exit code 2"``) or None
    while it lives; ``log()`` is its whole output, put in the error. Raises :class:`NotReady` naming
    ``what`` as soon as ``ended()`` says so, or after ``limit_s`` seconds of neither."""
    deadline = time.monotonic() + limit_s
    while True:
        if value := ready():
            return value
        if (reason := ended()) is not None:
            if value := ready():  # it became ready and then ended: still ready
                return value
            raise NotReady(f"{what}: ended before it was ready ({reason})\n--- its log ---\n{log()}")
        if time.monotonic() > deadline:
            raise NotReady(
                f"{what}: not ready after {limit_s:.0f} s and still running\n--- its log ---\n{log()}"
            )
        time.sleep(poll_s)


def process_ended(process: subprocess.Popen) -> Callable[[], str | None]:
    """``ended`` for :func:`wait_until`: ``"exit code N"`` once ``process`` has exited."""
    return lambda: None if process.poll() is None else f"exit code {process.returncode}"


def thread_ended(thread: threading.Thread) -> Callable[[], str | None]:
    """``ended`` for :func:`wait_until`: a message once ``thread`` has stopped running."""
    return lambda: None if thread.is_alive() else f"thread {thread.name} stopped"


def process_log(process: subprocess.Popen) -> Callable[[], str]:
    """``log`` for :func:`wait_until` over a process with piped output: what it printed once it has
    exited (its pipes cannot be read while it runs without blocking)."""

    def log() -> str:
        if process.poll() is None:
            return "(still running: its output is read when it exits)"
        stdout, stderr = process.communicate()
        return f"--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"

    return log


def communicate(process: subprocess.Popen, limit_s: float = LIMIT_S) -> tuple[str, str]:
    """``process.communicate()`` bounded by ``limit_s``; on the bound, kill it and raise
    :class:`NotReady` with what it printed (a hung process, not a slow one)."""
    try:
        return process.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        raise NotReady(
            f"{process.args!r}: still running after {limit_s:.0f} s\n--- stdout ---\n{stdout}"
            f"\n--- stderr ---\n{stderr}"
        ) from None


def interrupted_kvbench(args: list, checkpoint: Path, sig: int) -> tuple[int, str, str]:
    """Start ``python -m kvbench.cli ARGS`` in the repository, send it ``sig`` once ``checkpoint``
    exists (a run writes its first checkpoint 10 s in, so some requests have finished and others are
    in the engine: minutes on a loaded machine), and wait; returns (exit code, stdout, stderr)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "kvbench.cli", *map(str, args)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until(
        checkpoint.exists,
        "the first checkpoint (10 s into the run)",
        ended=process_ended(process),
        log=process_log(process),
        poll_s=0.2,
    )
    process.send_signal(sig)
    stdout, stderr = communicate(process)
    return process.returncode, stdout, stderr
