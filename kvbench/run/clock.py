"""Clocks for the send loop: the wall clock, and a virtual one whose sleeps take no real time.

The send loop (:mod:`kvbench.run.loop`) reads time only through a :class:`Clock`: ``now()`` for
timestamps and ``sleep()`` to wait for a due time. :data:`WALL_CLOCK` is ``time.perf_counter`` and
``asyncio.sleep``. :class:`VirtualClock` runs a coroutine on an event loop whose time is virtual:
when every task waits on a timer, the clock jumps to the earliest one instead of blocking, so tests
of arrival processes, session order and queue times run in microseconds, exactly, with no
threshold for scheduling noise. Waits on real I/O or threads still block for real.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Coroutine
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    """Seconds on some monotonic scale, and a way to wait."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class WallClock:
    """``time.perf_counter`` and ``asyncio.sleep``."""

    def now(self) -> float:
        return time.perf_counter()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0))


WALL_CLOCK = WallClock()


class VirtualClock:
    """Virtual seconds starting at ``start_s``; :meth:`run` drives a coroutine on them.

    Inside :meth:`run`, ``asyncio.sleep`` (and so :meth:`sleep`) and every ``call_later`` use the
    virtual time; ``now()`` reads it. Example::

        clock = VirtualClock()
        records = clock.run(send_requests(requests, backend, LoadConfig(concurrency=2), clock=clock))
    """

    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = float(start_s)

    def now(self) -> float:
        return self.now_s

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0))

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` to completion on a fresh event loop on this clock's time."""
        loop = _VirtualTimeLoop(self)
        try:
            return loop.run_until_complete(coroutine)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


class _AdvancingSelector(selectors.DefaultSelector):
    """A selector whose timed wait moves the virtual clock on instead of blocking."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None):
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:  # nothing scheduled: only I/O or a thread can wake the loop
            return super().select(None)
        self._clock.now_s += timeout
        return []


class _VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(_AdvancingSelector(clock))
        self._virtual_clock = clock

    def time(self) -> float:
        return self._virtual_clock.now_s
