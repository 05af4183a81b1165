"""Goodput: requests per second that met every latency SLO, overall and split by cache outcome.

The definition is DistServe's (Zhong et al., OSDI 2024) as ``vllm bench serve --goodput`` computes
it (vllm/benchmarks/serve.py): a completed request is *good* when, for every SLO given, SLO >=
its value (inclusive), with ``ttft`` = TTFT, ``tpot`` = TPOT (0 for a one-token output, as vLLM
counts it) and ``e2el`` = end-to-end latency, all in ms; ``request_goodput`` = good requests /
the run's duration (s).

kvbench adds the split no peer makes: a request *hit the cache* when its cached prompt tokens are
at least ``hit_threshold`` (default 0.5: half) of its prompt tokens, and more than 0. Goodput and
SLO attainment (good / completed) are reported for hits and misses apart; the two goodputs add up
to ``request_goodput``. This says what the cache is worth under an SLO: how many more requests
meet it because their prefix was cached.

Every completed measured request counts, the cold first one too (it is a real request that
either met the SLO or did not), unlike the TTFT percentiles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvbench.results.rows import ResultRow

GOODPUT_METRICS = ("ttft", "tpot", "e2el")  # vLLM's valid --goodput names
DEFAULT_HIT_THRESHOLD = 0.5  # a hit = at least half the prompt came from the cache


def parse_goodput(values: Sequence[str], option: str = "--goodput") -> tuple[tuple[str, float], ...]:
    """``["ttft:200 tpot:50", "e2el:900"]`` (pairs split by spaces, commas or repeats of the flag)
    -> ``(("ttft", 200.0), ("tpot", 50.0), ("e2el", 900.0))``: SLOs in ms.

    Raises:
        ValueError: a pair without ``:``, an unknown metric, a repeated one, or a limit that is not
            a positive number (the message names ``option``).
    """
    slos: dict[str, float] = {}
    for pair in (p for value in values for p in value.replace(",", " ").split()):
        name, sep, number = pair.partition(":")
        if not sep or name not in GOODPUT_METRICS:
            raise ValueError(
                f"{option}: {pair!r}: give METRIC:MS with METRIC one of {', '.join(GOODPUT_METRICS)}"
            )
        try:
            limit = float(number)
        except ValueError:
            raise ValueError(f"{option}: {pair!r}: {number!r} is not a number of ms") from None
        if not limit > 0 or name in slos:
            raise ValueError(
                f"{option}: {pair!r}: " + ("given twice" if name in slos else "the SLO must be positive")
            )
        slos[name] = limit
    return tuple(slos.items())


def _value_ms(row: ResultRow, metric: str) -> float | None:
    if metric == "ttft":
        return row.ttft_ms
    if metric == "e2el":
        return row.e2e_ms
    return row.tpot_ms if (row.output_tokens or 0) > 1 else 0.0  # vLLM: tpot 0 for 1 token


def is_good(row: ResultRow, slos: Sequence[tuple[str, float]]) -> bool:
    """Whether a completed request met every SLO (SLO >= value); a missing value fails it."""
    for metric, limit_ms in slos:
        value = _value_ms(row, metric)
        if value is None or value > limit_ms:
            return False
    return True


def is_cache_hit(row: ResultRow, hit_threshold: float = DEFAULT_HIT_THRESHOLD) -> bool:
    """Cached prompt tokens >= ``hit_threshold`` x prompt tokens, and > 0."""
    cached, prompt = row.cached_prompt_tokens or 0, row.prompt_tokens or 0
    return cached > 0 and cached >= hit_threshold * prompt


@dataclass(frozen=True)
class Goodput:
    """Goodput of one run (rates in requests/s; attainment a fraction; ``None`` = no request or no
    duration). ``request_goodput`` is vLLM's key; the rest are kvbench's split."""

    request_goodput: float | None
    num_good_requests: int
    slo_attainment: float | None
    num_cache_hit_requests: int
    num_cache_miss_requests: int
    request_goodput_cache_hit: float | None
    request_goodput_cache_miss: float | None
    slo_attainment_cache_hit: float | None
    slo_attainment_cache_miss: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def goodput(
    completed: Sequence[ResultRow],
    slos: Sequence[tuple[str, float]],
    duration_s: float | None,
    hit_threshold: float = DEFAULT_HIT_THRESHOLD,
) -> Goodput:
    """Goodput of the ``completed`` (status ok, measured) rows under ``slos`` over ``duration_s``."""
    hits = [row for row in completed if is_cache_hit(row, hit_threshold)]
    misses = [row for row in completed if not is_cache_hit(row, hit_threshold)]
    good_hits = sum(is_good(row, slos) for row in hits)
    good_misses = sum(is_good(row, slos) for row in misses)

    def rate(count: int) -> float | None:
        return count / duration_s if duration_s else None

    def share(count: int, of: int) -> float | None:
        return count / of if of else None

    return Goodput(
        request_goodput=rate(good_hits + good_misses),
        num_good_requests=good_hits + good_misses,
        slo_attainment=share(good_hits + good_misses, len(completed)),
        num_cache_hit_requests=len(hits),
        num_cache_miss_requests=len(misses),
        request_goodput_cache_hit=rate(good_hits),
        request_goodput_cache_miss=rate(good_misses),
        slo_attainment_cache_hit=share(good_hits, len(hits)),
        slo_attainment_cache_miss=share(good_misses, len(misses)),
    )
