"""Watch servers' KV cache events: one subscriber, one fleet block map, a summary every interval.

The library side of ``kvbench events watch`` (the command renders; nothing here prints).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from kvbench.events.blockmap import FleetBlocks, FleetSummary
from kvbench.events.subscriber import EventSource, Subscriber

SETTLE_S = 0.5  # --once: how long to read live batches after the replay before the one summary


def watch(
    sources: Sequence[EventSource],
    duration_s: float | None,
    on_summary: Callable[[FleetSummary], None],
    on_note: Callable[[str], None] = lambda line: None,
    bytes_per_block: int | None = None,
    interval_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> FleetSummary:
    """Subscribe to ``sources`` (history replayed where a replay socket exists), apply every batch,
    and call ``on_summary`` every ``interval_s`` until ``duration_s`` has passed (``0``: one summary
    after :data:`SETTLE_S`; ``None``: until interrupted). Returns the last summary.

    Raises:
        InputError: two sources share a name.
    """
    fleet = FleetBlocks(bytes_per_block)
    for source in sources:
        fleet.replica(source.name)
    subscriber = Subscriber(sources, lambda name, seq, batch: fleet.apply(name, seq, batch, clock()), on_note)
    try:
        if duration_s == 0:
            subscriber.poll(SETTLE_S)
            return fleet.summary(clock())
        deadline = None if duration_s is None else clock() + duration_s
        while True:
            left_s = interval_s if deadline is None else min(interval_s, deadline - clock())
            subscriber.poll(max(left_s, 0.0))
            summary = fleet.summary(clock())
            on_summary(summary)
            if deadline is not None and clock() >= deadline:
                return summary
    finally:
        subscriber.close()
