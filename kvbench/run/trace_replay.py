"""``--schedule trace``: how long the replay will take, said before it starts, and gaps no replay
should wait out refused (a line with ``timestamp: 1e308`` once imported, and the run waited
until it was killed).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvbench.errors import InputError
from kvbench.request import Request

MAX_REPLAY_GAP_S = 86_400.0  # a day of wall time between two requests: a unit mix-up or a bad timestamp


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:,.1f} s"
    return f"{seconds / 60:,.1f} min" if seconds < 7_200 else f"{seconds / 3_600:,.1f} h"


def replay_plan(measured: Sequence[Request], time_scale: float) -> str:
    """One line: how many requests the replay sends over how long (wall time, after ``time_scale``).

    Raises:
        InputError: two consecutive due times are more than ``MAX_REPLAY_GAP_S`` apart after
            scaling, naming the later request, its arrival and what to do.
    """
    ordered = sorted(measured, key=lambda request: request.arrival_s)
    for before, after in zip(ordered, ordered[1:]):
        gap_s = (after.arrival_s - before.arrival_s) / time_scale
        if gap_s > MAX_REPLAY_GAP_S:
            raise InputError(
                f"--schedule trace: request {after.request_id} arrives {gap_s:,.4g} s after request "
                f"{before.request_id} (arrival {after.arrival_s:.6g} s, time scale {time_scale:g}); a replay "
                f"would wait that long: gaps over {MAX_REPLAY_GAP_S:,.0f} s (a day) are refused. Fix its "
                "timestamp, or replay faster with --time-scale"
            )
    span_s = (ordered[-1].arrival_s - ordered[0].arrival_s) / time_scale if ordered else 0.0
    return (
        f"--schedule trace: {len(ordered):,} requests at their own times over {_duration(span_s)} of replay "
        f"(time scale {time_scale:g}), plus the last requests' service time"
    )
