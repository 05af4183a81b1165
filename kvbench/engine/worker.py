"""The worker thread both engines run their requests on, started on demand, joined at exit.

An engine queues work under its own lock and calls :meth:`Worker.wake`; the worker thread asks the
engine for its next task (``next_task()``, under that lock) and runs it outside the lock, until the
engine has nothing left (``None``): then the thread ends, so an idle engine holds no thread and can be
garbage-collected with its KV, and the next ``wake`` starts a new one.

A worker thread still inside torch, or still tearing down its thread state, when the interpreter
finalizes aborts the process (``terminate called without an active exception``, exit status 134):
seen when a server, benchmark or interrupted run leaves with requests in flight, and after an
interrupt even once the engine was collected. :func:`_stop_workers_at_exit` stops every live worker at
a task boundary and joins every worker thread (atexit handlers run before finalization; a task is at
most one forward of the paged engine, or one request of the copy engine).
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future

Task = Callable[[], None]

EXIT_JOIN_S = 60.0  # the longest the interpreter's exit waits for one worker thread
WAIT_IDLE_S = (
    60.0  # before a memory reading: work ends within a task once nothing runs; never hang an interrupt on it
)

# every thread not known to have ended -> its worker
_WORKERS: dict[threading.Thread, weakref.ref[Worker]] = {}


@atexit.register
def _stop_workers_at_exit() -> None:
    """Stop every live worker at its next task boundary, then join every worker thread (module docstring)."""
    for worker in [ref() for ref in list(_WORKERS.values())]:
        if worker is not None:
            worker.stopping = True
    for thread in list(_WORKERS):
        thread.join(timeout=EXIT_JOIN_S)


class RequestFuture(Future):
    """A future of one request's :class:`~kvbench.request.RequestRecord`, as both engines' ``submit``
    return it; ``seq_id`` names it for the engine's ``abort`` (``None``: refused at submit)."""

    seq_id: int | None = None


class Worker:
    """One on-demand thread running an engine's tasks (module docstring).

    Args:
        lock: the engine's lock; held by the caller of :meth:`wake` and around every ``next_task()``.
        next_task: a bound method of the engine: its next task, or ``None`` when it has nothing left
            (the thread ends). Held weakly between threads, strongly while a thread runs.
            An exception a task raises is swallowed: tasks hand their errors to their futures.
        name: the thread's name (``kvbench-paged``, ``kvbench-copy``).
    """

    def __init__(self, lock: threading.Lock, next_task: Callable[[], Task | None], name: str) -> None:
        self._lock = lock
        self._next_task = weakref.WeakMethod(next_task)  # no cycle: an idle engine is freed by its ref count
        self._name = name
        self._thread: threading.Thread | None = None
        self.stopping = False  # set at interpreter exit: the thread ends after its current task

    def wake(self) -> None:
        """Start the thread if none runs (and the interpreter is not exiting). Call with the lock held."""
        if self._thread is not None or self.stopping:
            return
        # the thread holds the engine (its next_task) while it runs, as a caller waiting on a future expects
        self._thread = threading.Thread(
            target=self._run, args=(self._next_task(),), name=self._name, daemon=True
        )
        for ended in [thread for thread in _WORKERS if not thread.is_alive()]:
            del _WORKERS[ended]
        _WORKERS[self._thread] = weakref.ref(self)
        self._thread.start()

    def join(self, timeout_s: float | None = None) -> None:
        """Block until the thread has ended (nothing left to run), at most ``timeout_s`` seconds."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _run(self, next_task: Callable[[], Task | None]) -> None:
        while True:
            with self._lock:
                task = None if self.stopping else next_task()
                if task is None:
                    self._thread = None
                    return
            try:
                task()
            except Exception:  # noqa: BLE001 - a task's errors went to its futures
                continue
