"""Summaries of run results: vLLM's result keys, and kvbench's own numbers beside them.

vLLM's keys (what ``vllm bench serve --save-result`` writes; :mod:`kvbench.results.metrics`):
``duration``, ``completed``, ``failed``, ``total_input_tokens``, ``total_output_tokens``,
``request_throughput``, ``output_throughput``, ``total_token_throughput``, ``mean/median/std_{m}_ms``
for ttft, tpot, itl and e2el, ``p{X}_{m}_ms`` for the chosen percentiles and metrics
(:class:`SummaryOptions`), and ``request_goodput`` with ``--goodput`` (:mod:`kvbench.results.goodput`).

kvbench's extras keep their names: token hit rate (reported and expected), cached tokens, cold TTFT,
queue time, and ``per_stream_decode_tok_s``: decode tokens / decode time summed over requests, the
speed one stream decodes at, *not* the system's throughput (that is ``output_throughput``).

The first measured request of a run that had no warm-up met a cold cache: it is reported on its own
(``cold_ttft_ms``) and kept out of every TTFT statistic (mean, median, std, percentiles), so one
slow request does not hide in (or inflate) a p99. With ``--warmup`` >= 1 there is no such request
and the TTFT statistics are vLLM's. Goodput counts it (it met the SLO or it did not).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kvbench.results.goodput import DEFAULT_HIT_THRESHOLD, Goodput, goodput
from kvbench.results.metrics import (
    DEFAULT_PERCENTILES,
    METRICS,
    latency_stats,
    measured_duration_s,
    metric_values,
    throughput,
)
from kvbench.results.rows import ResultRow

PERCENTILES = (50, 90, 99)


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) of ``values``, linear interpolation; ``None`` if empty."""
    array = np.asarray([v for v in values if v is not None], dtype=np.float64)
    return float(np.percentile(array, q)) if array.size else None


def _parse_list(text: str, option: str) -> list[str]:
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise ValueError(f"{option}: {text!r}: give a comma-separated list")
    return items


def parse_metric_percentiles(text: str) -> tuple[float, ...]:
    """``"50,90,99.9"`` -> ``(50.0, 90.0, 99.9)``. Raises ``ValueError`` naming ``--metric-percentiles``."""
    items = _parse_list(text, "--metric-percentiles")
    try:
        return tuple(float(item) for item in items)
    except ValueError:
        raise ValueError(f"--metric-percentiles: {text!r}: give numbers, e.g. 50,90,99") from None


def parse_percentile_metrics(text: str) -> tuple[str, ...]:
    """``"ttft,itl"`` -> ``("ttft", "itl")``; checked by :class:`SummaryOptions`."""
    return tuple(_parse_list(text, "--percentile-metrics"))


@dataclass(frozen=True)
class SummaryOptions:
    """What a summary reports beyond the fixed keys (vLLM's reporting flags).

    Attributes:
        metric_percentiles: X of every ``p{X}_{m}_ms`` key, 0..100 (``--metric-percentiles``).
        percentile_metrics: the metrics with statistics, of ttft, tpot, itl, e2el (``--percentile-metrics``).
        goodput: ``(metric, SLO ms)`` pairs (``--goodput``); empty = no goodput keys.
        hit_threshold: the cached share of a prompt that makes a request a cache hit for the
            goodput split, in (0, 1].

    Raises:
        ValueError: a percentile outside 0..100, an unknown or repeated metric, a bad threshold.
    """

    metric_percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    percentile_metrics: tuple[str, ...] = METRICS
    goodput: tuple[tuple[str, float], ...] = ()
    hit_threshold: float = DEFAULT_HIT_THRESHOLD

    def __post_init__(self) -> None:
        object.__setattr__(self, "metric_percentiles", tuple(float(q) for q in self.metric_percentiles))
        object.__setattr__(self, "percentile_metrics", tuple(self.percentile_metrics))
        object.__setattr__(self, "goodput", tuple((str(m), float(v)) for m, v in self.goodput))
        if not self.metric_percentiles or any(not 0 <= q <= 100 for q in self.metric_percentiles):
            raise ValueError(f"--metric-percentiles: {self.metric_percentiles} must lie in 0..100")
        unknown = [m for m in self.percentile_metrics if m not in METRICS]
        if (
            unknown
            or not self.percentile_metrics
            or len(set(self.percentile_metrics)) < len(self.percentile_metrics)
        ):
            raise ValueError(
                f"--percentile-metrics: {','.join(self.percentile_metrics)}: give distinct names "
                f"of {', '.join(METRICS)}"
            )
        if not 0 < self.hit_threshold <= 1:
            raise ValueError(f"hit_threshold: {self.hit_threshold} must lie in (0, 1]")


@dataclass(frozen=True)
class RunSummary:
    """The numbers a run is judged by. Times in ms, ``duration`` in s, throughputs per second, rates
    fractions; ``None`` = not measured. ``latency`` holds the ``mean/median/std/p{X}_{m}_ms`` keys
    of the chosen metrics; :meth:`as_dict` flattens it (and ``goodput``) into one mapping."""

    num_requests: int
    num_warmup: int
    num_errors: int
    prompt_tokens: int
    cached_prompt_tokens: int
    token_hit_rate: float | None
    expected_hit_rate: float | None
    cold_ttft_ms: float | None
    mean_ttft_ms: float | None
    p50_ttft_ms: float | None
    p90_ttft_ms: float | None
    p99_ttft_ms: float | None
    p50_tpot_ms: float | None
    p50_itl_ms: float | None
    p50_e2e_ms: float | None
    p99_e2e_ms: float | None
    p50_queue_ms: float | None
    per_stream_decode_tok_s: float | None
    output_tokens: int
    num_mismatched_outputs: int
    duration: float | None = None
    completed: int = 0
    failed: int = 0
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    request_throughput: float | None = None
    output_throughput: float | None = None
    total_token_throughput: float | None = None
    latency: dict[str, float | None] = field(default_factory=dict)
    goodput: Goodput | None = None
    num_cached_unreported: int = 0  # ok requests without cached_tokens (missing, not 0: kept out of the rate)
    num_cached_impossible: int = (
        0  # ok requests reporting cached_tokens < 0 or > prompt_tokens (kept out too)
    )

    def as_dict(self) -> dict[str, Any]:
        """Every key, flat: the fields, then the latency statistics, then goodput (when asked for)."""
        flat = {k: v for k, v in asdict(self).items() if k not in ("latency", "goodput")}
        flat.update(self.latency)
        if self.goodput is not None:
            flat.update(self.goodput.as_dict())
        return flat


def _ok(row: ResultRow) -> bool:
    return row.status == "ok"


def _latency(
    ok: Sequence[ResultRow], warm: Sequence[ResultRow], options: SummaryOptions
) -> dict[str, float | None]:
    stats: dict[str, float | None] = {}
    for metric in options.percentile_metrics:
        values = metric_values(warm if metric == "ttft" else ok, metric)
        stats.update(latency_stats(values, metric, options.metric_percentiles))
    return stats


def summarize(rows: Iterable[ResultRow], options: SummaryOptions | None = None) -> RunSummary:
    """Summarize result rows (dicts with the :mod:`kvbench.results.schema` columns), in serve order."""
    options = options or SummaryOptions()
    rows = list(rows)
    measured = [r for r in rows if r.measured]
    num_warmup = len(rows) - len(measured)
    ok = [r for r in measured if _ok(r)]
    cold = ok[0] if ok and not num_warmup and ok[0] is measured[0] else None
    warm = [r for r in ok if r is not cold]
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    reported = [r for r in ok if r.cached_prompt_tokens is not None]
    counted = [r for r in reported if plausible_cached(r)]
    cached = sum(r.cached_prompt_tokens for r in counted)
    counted_prompt = sum(r.prompt_tokens or 0 for r in counted)
    ttft = [r.ttft_ms for r in warm]
    output = sum(r.output_tokens or 0 for r in ok)
    rates = throughput(measured_duration_s(measured), len(ok), prompt, output)
    return RunSummary(
        num_requests=len(measured),
        num_warmup=num_warmup,
        num_errors=len(measured) - len(ok),
        prompt_tokens=prompt,
        cached_prompt_tokens=cached,
        token_hit_rate=cached / counted_prompt if counted_prompt else None,
        expected_hit_rate=_expected_hit_rate(ok),
        cold_ttft_ms=cold.ttft_ms if cold else None,
        mean_ttft_ms=float(np.mean(ttft)) if ttft else None,
        p50_ttft_ms=percentile(ttft, 50),
        p90_ttft_ms=percentile(ttft, 90),
        p99_ttft_ms=percentile(ttft, 99),
        p50_tpot_ms=percentile((r.tpot_ms for r in ok), 50),
        p50_itl_ms=percentile((gap for r in ok for gap in (r.itl_ms or [])), 50),
        p50_e2e_ms=percentile((r.e2e_ms for r in ok), 50),
        p99_e2e_ms=percentile((r.e2e_ms for r in ok), 99),
        p50_queue_ms=percentile((r.queue_ms for r in ok), 50),
        per_stream_decode_tok_s=_per_stream_decode_tok_s(ok),
        output_tokens=output,
        num_mismatched_outputs=sum(1 for r in measured if r.output_matches_reference is False),
        duration=rates.duration,
        completed=len(ok),
        failed=len(measured) - len(ok),
        total_input_tokens=prompt,
        total_output_tokens=output,
        request_throughput=rates.request_throughput,
        output_throughput=rates.output_throughput,
        total_token_throughput=rates.total_token_throughput,
        latency=_latency(ok, warm, options),
        goodput=goodput(ok, options.goodput, rates.duration, options.hit_threshold)
        if options.goodput
        else None,
        num_cached_unreported=len(ok) - len(reported),
        num_cached_impossible=len(reported) - len(counted),
    )


def _expected_hit_rate(ok: list[ResultRow]) -> float | None:
    """Expected cached / prompt tokens over the successful rows that carry an expectation."""
    expected_rows = [r for r in ok if r.expected_cached_tokens is not None]
    expected = sum(r.expected_cached_tokens for r in expected_rows)
    expected_prompt = sum(local_prompt_tokens(r) for r in expected_rows)  # the expectation's own units
    return expected / expected_prompt if expected_prompt else None


def _per_stream_decode_tok_s(ok: list[ResultRow]) -> float | None:
    """Tokens after the first over the time after the first token, summed over successful rows."""
    decode_tokens = sum(max((r.output_tokens or 0) - 1, 0) for r in ok)
    decode_ms = sum(
        (r.e2e_ms - r.ttft_ms)
        for r in ok
        if r.e2e_ms is not None and r.ttft_ms is not None and (r.output_tokens or 0) > 1
    )
    return decode_tokens / (decode_ms / 1000.0) if decode_ms > 0 else None


def plausible_cached(row: ResultRow) -> bool:
    """``0 <= cached_prompt_tokens <= prompt_tokens`` (a server reporting more cached tokens than the
    prompt has, or fewer than none, is wrong about this request; its value is kept in the row but not
    in any rate)."""
    return 0 <= row.cached_prompt_tokens <= (row.prompt_tokens or 0)


def local_prompt_tokens(row: ResultRow) -> int:
    """The prompt as kvbench's tokenizer counts it (the units of ``expected_cached_tokens``); the
    server's ``prompt_tokens`` for rows written before the ``local_prompt_tokens`` column existed."""
    local = row.local_prompt_tokens
    return int(local) if local is not None else int(row.prompt_tokens or 0)
