"""vLLM's latency statistics and throughputs, computed from result rows.

The keys are the ones ``vllm bench serve --save-result`` writes (vllm/benchmarks/serve.py,
``calculate_metrics``), so a kvbench summary can sit in the same spreadsheet as a vLLM one:

* per metric m in ``--percentile-metrics`` (``ttft``, ``tpot``, ``itl``, ``e2el``):
  ``mean_{m}_ms``, ``median_{m}_ms``, ``std_{m}_ms`` (population std, numpy's default, as vLLM) and
  ``p{X}_{m}_ms`` for every X in ``--metric-percentiles`` (``p99``, ``p99.9``: an integral X loses
  its ``.0``, as vLLM writes it); percentiles by linear interpolation (numpy's default).
* ``duration`` (s, first measured send to last measured end), ``request_throughput`` (completed
  requests/s), ``output_throughput`` (output tokens/s) and ``total_token_throughput`` ((prompt +
  output) tokens/s), all over that duration.

Values: ``ttft`` is ``ttft_ms``, ``tpot`` is ``tpot_ms`` (requests with >= 2 output tokens),
``itl`` every inter-token gap of every request, ``e2el`` is ``e2e_ms``. An empty set gives ``None``
(vLLM writes 0), never a made-up number.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.results.rows import ResultRow

METRICS = ("ttft", "tpot", "itl", "e2el")  # vLLM's --percentile-metrics names
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
_COLUMN = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms"}


def percentile_key(q: float, metric: str) -> str:
    """vLLM's key for the ``q``-th percentile of ``metric``: ``p99_ttft_ms``, ``p99.9_itl_ms``."""
    word = str(int(q)) if int(q) == q else str(q)
    return f"p{word}_{metric}_ms"


def stat_keys(metric: str, percentiles: Sequence[float]) -> list[str]:
    """Every key :func:`latency_stats` writes for ``metric``, in vLLM's order."""
    return [
        f"mean_{metric}_ms",
        f"median_{metric}_ms",
        f"std_{metric}_ms",
        *(percentile_key(q, metric) for q in percentiles),
    ]


def metric_values(rows: Iterable[ResultRow], metric: str) -> list[float]:
    """The values of ``metric`` (one of :data:`METRICS`) over ``rows``, in ms; nulls skipped."""
    if metric == "itl":
        return [float(gap) for row in rows for gap in (row.itl_ms or ()) if gap is not None]
    column = _COLUMN[metric]
    values = (getattr(row, column) for row in rows)
    return [float(value) for value in values if value is not None]


def latency_stats(
    values: Sequence[float], metric: str, percentiles: Sequence[float]
) -> dict[str, float | None]:
    """``mean/median/std/p{X}_{metric}_ms`` of ``values`` (ms); all ``None`` when ``values`` is empty."""
    keys = stat_keys(metric, percentiles)
    if not values:
        return dict.fromkeys(keys)
    array = np.asarray(values, dtype=np.float64)
    numbers = [array.mean(), np.median(array), array.std(), *(np.percentile(array, q) for q in percentiles)]
    return {key: float(number) for key, number in zip(keys, numbers)}


@dataclass(frozen=True)
class Throughput:
    """The run's clock and the rates over it. ``None`` when the rows carry no send/end times."""

    duration: float | None  # s
    request_throughput: float | None  # completed requests / s
    output_throughput: float | None  # output tokens / s
    total_token_throughput: float | None  # (prompt + output) tokens / s


def measured_duration_s(measured: Sequence[ResultRow]) -> float | None:
    """Seconds from the first measured request sent (``sent_ms``) to the last one ended
    (``end_ms``), failed requests included, as vLLM's benchmark duration; ``None`` for files
    written before ``end_ms`` existed, or an empty set."""
    sent = [r.sent_ms for r in measured if r.sent_ms is not None]
    ended = [r.end_ms for r in measured if r.end_ms is not None]
    if not sent or not ended:
        return None
    return max(max(ended) - min(sent), 0.0) / 1e3


def throughput(duration_s: float | None, completed: int, input_tokens: int, output_tokens: int) -> Throughput:
    """Rates over ``duration_s``; ``None`` rates when the duration is unknown or zero."""
    if not duration_s:
        return Throughput(duration_s, None, None, None)
    return Throughput(
        duration_s,
        completed / duration_s,
        output_tokens / duration_s,
        (input_tokens + output_tokens) / duration_s,
    )
