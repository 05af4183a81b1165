"""Summaries of run results: hit rate, TTFT/TPOT/ITL/E2E percentiles, decode rate, errors.

One rule for keys (after vLLM's ``bench serve`` results): ``p{q}_{metric}_ms`` for percentiles
(linear interpolation, numpy's default, as vLLM uses), ``mean_{metric}_ms`` for means.

The first measured request of a run that had no warm-up met a cold cache: it is reported on its own
(``cold_ttft_ms``) and kept out of the warm TTFT percentiles, so one slow request does not hide in
(or inflate) a p99.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

PERCENTILES = (50, 90, 99)


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) of ``values``, linear interpolation; ``None`` if empty."""
    array = np.asarray([v for v in values if v is not None], dtype=np.float64)
    return float(np.percentile(array, q)) if array.size else None


@dataclass(frozen=True)
class RunSummary:
    """The numbers a run is judged by. Times in ms; rates are fractions; ``None`` = not measured."""

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
    decode_tok_s: float | None
    output_tokens: int
    num_mismatched_outputs: int
    num_cached_unreported: int = 0  # ok requests without cached_tokens (missing, not 0: kept out of the rate)
    num_cached_impossible: int = 0  # ok requests reporting cached_tokens < 0 or > prompt_tokens (kept out too)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ok(row: Mapping[str, Any]) -> bool:
    return row.get("status") == "ok"


def summarize(rows: Iterable[Mapping[str, Any]]) -> RunSummary:
    """Summarize result rows (dicts with the :mod:`kvbench.results.schema` columns), in serve order."""
    rows = list(rows)
    measured = [r for r in rows if r.get("phase", "measure") == "measure"]
    num_warmup = len(rows) - len(measured)
    ok = [r for r in measured if _ok(r)]
    cold = ok[0] if ok and not num_warmup and ok[0] is measured[0] else None
    warm = [r for r in ok if r is not cold]
    prompt = sum(r["prompt_tokens"] or 0 for r in ok)
    reported = [r for r in ok if r["cached_prompt_tokens"] is not None]
    counted = [r for r in reported if plausible_cached(r)]
    cached = sum(r["cached_prompt_tokens"] for r in counted)
    counted_prompt = sum(r["prompt_tokens"] or 0 for r in counted)
    expected_rows = [r for r in ok if r.get("expected_cached_tokens") is not None]
    expected = sum(r["expected_cached_tokens"] for r in expected_rows)
    expected_prompt = sum(local_prompt_tokens(r) for r in expected_rows)  # the expectation's own units
    ttft = [r["ttft_ms"] for r in warm]
    decode_tokens = sum(max((r["output_tokens"] or 0) - 1, 0) for r in ok)
    decode_ms = sum((r["e2e_ms"] - r["ttft_ms"]) for r in ok
                    if r.get("e2e_ms") is not None and r.get("ttft_ms") is not None and (r["output_tokens"] or 0) > 1)
    return RunSummary(
        num_requests=len(measured),
        num_warmup=num_warmup,
        num_errors=len(measured) - len(ok),
        prompt_tokens=prompt,
        cached_prompt_tokens=cached,
        token_hit_rate=cached / counted_prompt if counted_prompt else None,
        expected_hit_rate=expected / expected_prompt if expected_prompt else None,
        cold_ttft_ms=cold["ttft_ms"] if cold else None,
        mean_ttft_ms=float(np.mean(ttft)) if ttft else None,
        p50_ttft_ms=percentile(ttft, 50),
        p90_ttft_ms=percentile(ttft, 90),
        p99_ttft_ms=percentile(ttft, 99),
        p50_tpot_ms=percentile((r.get("tpot_ms") for r in ok), 50),
        p50_itl_ms=percentile((gap for r in ok for gap in (r.get("itl_ms") or [])), 50),
        p50_e2e_ms=percentile((r.get("e2e_ms") for r in ok), 50),
        p99_e2e_ms=percentile((r.get("e2e_ms") for r in ok), 99),
        p50_queue_ms=percentile((r.get("queue_ms") for r in ok), 50),
        decode_tok_s=decode_tokens / (decode_ms / 1000.0) if decode_ms > 0 else None,
        output_tokens=sum(r["output_tokens"] or 0 for r in ok),
        num_mismatched_outputs=sum(1 for r in measured if r.get("output_matches_reference") is False),
        num_cached_unreported=len(ok) - len(reported), num_cached_impossible=len(reported) - len(counted),
    )


def plausible_cached(row: Mapping[str, Any]) -> bool:
    """``0 <= cached_prompt_tokens <= prompt_tokens`` (a server reporting more cached tokens than the
    prompt has, or fewer than none, is wrong about this request; its value is kept in the row but not
    in any rate)."""
    return 0 <= row["cached_prompt_tokens"] <= (row["prompt_tokens"] or 0)


def local_prompt_tokens(row: Mapping[str, Any]) -> int:
    """The prompt as kvbench's tokenizer counts it (the units of ``expected_cached_tokens``); the
    server's ``prompt_tokens`` for rows written before the ``local_prompt_tokens`` column existed."""
    local = row.get("local_prompt_tokens")
    return int(local) if local is not None else int(row["prompt_tokens"] or 0)
