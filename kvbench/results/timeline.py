"""A run's timeline from its rows: when requests were due, sent and ended (``due_ms``, ``sent_ms``,
``end_ms``, all ms from the run's start; :mod:`kvbench.results.schema`).

The **replay lag** of a request is ``sent_ms - due_ms``: how late the send loop put it on the wire
(waiting for its session's previous turn, a concurrency slot, or an overloaded client). A replay at
the trace's own times (``--schedule trace``) is faithful when its p99 lag is small next to the
trace's gaps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvbench.results.rows import ResultRow
from kvbench.results.summary import percentile
from kvbench.words import counted


@dataclass(frozen=True)
class ReplayLag:
    """Replay lag over the measured rows that were sent: ``num_requests``, p50 / p99 / max in ms."""

    num_requests: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None

    def describe(self) -> str:
        """One line for the run's notes."""
        if not self.num_requests:
            return "replay lag (sent - due): no request was sent"
        return (
            f"replay lag (sent - due) over {counted(self.num_requests, 'request')}: p50 {self.p50_ms:.1f} "
            "ms, "
            f"p99 {self.p99_ms:.1f} ms, max {self.max_ms:.1f} ms"
        )


def replay_lag(rows: Iterable[ResultRow]) -> ReplayLag:
    """The replay lag of the measured rows with both ``due_ms`` and ``sent_ms``."""
    lags = [
        row.sent_ms - row.due_ms
        for row in rows
        if row.phase == "measure" and row.due_ms is not None and row.sent_ms is not None
    ]
    return ReplayLag(len(lags), percentile(lags, 50), percentile(lags, 99), max(lags) if lags else None)
