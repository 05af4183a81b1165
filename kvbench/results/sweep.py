"""Engine sweeps: one run per cache size, a summary row per size, and the TTFT-vs-miss-rate fit.

Prefill work is proportional to the uncached part of the prompt, so a sweep's TTFT p50 should sit on a
straight line in the miss rate::

    TTFT p50 = a + b x (1 - token hit rate)

``a`` is the warm floor (everything but the prefill of uncached tokens: the last prompt token,
scheduling, the first decode step) and ``a + b`` the full-prefill TTFT at hit rate 0. R^2 says how
well the line holds.

The summary file (Parquet, one row per cache size, :data:`SWEEP_SCHEMA`) carries ``"command":
"sweep"``, the fit and what the sweep ran in its metadata, so ``kvbench report`` can read it back::

    points = [SweepPoint.from_summary(size, summary, path) for size, summary, path in runs]
    write_sweep_summary(out, build_sweep_summary(points, context={"scenario": "shared_2k", ...}))
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kvbench.errors import InputError
from kvbench.results.parquet import read_metadata, write_rows
from kvbench.results.summary import RunSummary

SWEEP_SCHEMA = pa.schema(
    [
        pa.field("capacity_blocks", pa.int64()),
        pa.field("token_hit_rate", pa.float64()),  # cached prompt tokens / prompt tokens, measured requests
        pa.field("p50_ttft_ms", pa.float64()),  # warm measured requests (the cold first one excluded)
        pa.field("p90_ttft_ms", pa.float64()),
        pa.field("num_requests", pa.int64()),
        pa.field("num_errors", pa.int64()),
        pa.field("results_path", pa.string()),  # the run's own Parquet file (the first repeat's)
        pa.field("num_repeats", pa.int64()),  # runs at this size (--repeats); p50_ttft_ms is their median
        pa.field("min_p50_ttft_ms", pa.float64()),  # the spread of the repeats' TTFT p50s
        pa.field("max_p50_ttft_ms", pa.float64()),
        pa.field("repeat_p50_ttft_ms", pa.list_(pa.float64())),  # every repeat's TTFT p50, in run order
        pa.field("repeat_results_paths", pa.list_(pa.string())),
    ]
)


MIN_MEANINGFUL_POINTS = 3  # two points always sit on a line: 2 coefficients leave 0 degrees of freedom
INTERVAL = "95%, coefficient +- t(0.975, n - 2) x its OLS standard error"  # kvbench.results.ols


@dataclass(frozen=True)
class Fit:
    """Least-squares line ``TTFT p50 = a_ms + b_ms x (1 - hit rate)`` over a sweep's points.

    Attributes:
        a_ms: TTFT p50 at hit rate 1 (the warm floor).
        b_ms: what the uncached prefill adds at hit rate 0 (``a_ms + b_ms`` = full-prefill TTFT).
        r_squared: coefficient of determination, <= 1 (1.0 when every TTFT is equal and the line is flat).
        num_points: points fitted (>= 2).
        a_se_ms, b_se_ms: the coefficients' OLS standard errors (``None`` with 2 points, or in files
            written before they were recorded); :attr:`a_ci_ms` / :attr:`b_ci_ms` are the 95% intervals.
    """

    a_ms: float
    b_ms: float
    r_squared: float
    num_points: int
    a_se_ms: float | None = None
    b_se_ms: float | None = None

    def __post_init__(self) -> None:
        if self.num_points < 2:
            raise ValueError(f"a fit needs at least 2 points, got {self.num_points}")
        if not all(math.isfinite(v) for v in (self.a_ms, self.b_ms, self.r_squared)):
            raise ValueError(f"fit coefficients must be finite: {self}")
        if self.r_squared > 1 + 1e-9:
            raise ValueError(f"r_squared must be <= 1, got {self.r_squared}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Fit:
        """A fit from :meth:`as_dict` (its derived keys, ``caveats`` and the intervals, are recomputed)."""
        names = ("a_ms", "b_ms", "r_squared", "num_points", "a_se_ms", "b_se_ms")
        return cls(**{name: values[name] for name in names if name in values})

    def predict_ms(self, hit_rate: float) -> float:
        """The fitted TTFT p50 (ms) at ``hit_rate`` (0..1)."""
        return self.a_ms + self.b_ms * (1.0 - hit_rate)

    @property
    def a_ci_ms(self) -> tuple[float, float] | None:
        return self._interval(self.a_ms, self.a_se_ms)

    @property
    def b_ci_ms(self) -> tuple[float, float] | None:
        return self._interval(self.b_ms, self.b_se_ms)

    def _interval(self, value: float, se: float | None) -> tuple[float, float] | None:
        from kvbench.results.ols import interval_95

        return interval_95(value, se, self.num_points)

    @property
    def caveats(self) -> list[str]:
        """Why this line cannot be a finding (empty when none holds): too few points for its two
        coefficients (a line through two points fits them exactly, so R^2 says nothing), a negative
        slope (TTFT falling as more of each prompt is computed contradicts prefill cost), or a
        negative TTFT anywhere on hit rates [0, 1] (a loaded machine's ``-1,298.7 ms + 6,056.6 ms x (1 - hit
        rate)`` reaches 0 ms at hit rate 0.79). The timings are then noise, e.g. a loaded machine."""
        reasons = []
        if self.num_points < MIN_MEANINGFUL_POINTS:
            reasons.append(
                f"only {self.num_points} points: a line through {self.num_points} points says nothing "
                f"(at least {MIN_MEANINGFUL_POINTS} needed)"
            )
        if self.b_ms < -1e-9 * max(1.0, abs(self.a_ms)):
            reasons.append(
                "the slope is negative (TTFT falls as the miss rate rises): the timings are noise, "
                "not prefill cost; check the machine's load and rerun"
            )
        if (negative := self._negative_time()) is not None:
            reasons.append(negative)
        return reasons

    def _negative_time(self) -> str | None:
        """The line's lowest TTFT on hit rates [0, 1] when it is below 0 ms (at hit rate 1 or 0), in words."""
        low_hit, low_ms = min(((1.0, self.a_ms), (0.0, self.a_ms + self.b_ms)), key=lambda point: point[1])
        if low_ms >= 0:
            return None
        zero_hit = 1.0 + self.a_ms / self.b_ms if self.b_ms != 0 else math.nan
        crossing = f", 0 ms at hit rate {zero_hit:.2f}" if 0.0 <= zero_hit <= 1.0 else ""
        return (
            f"the line gives a negative TTFT ({low_ms:,.1f} ms at hit rate {low_hit:.0f}{crossing}): no "
            "time is "
            "negative, so the points do not lie on a line of prefill cost; check the machine's load and "
            "rerun"
        )

    @property
    def caveat(self) -> str | None:
        """:attr:`caveats` as one line, or ``None``."""
        return "; ".join(self.caveats) or None

    def describe(self) -> str:
        """One line for tables and captions, e.g. ``TTFT p50 = 41.0 ms + 1,250.3 ms x (1 - hit rate), R^2
        0.998
        (5 points); 95% CI a [35.2, 46.8] ms, b [1,201.0, 1,299.6] ms``; a fit with :attr:`caveats` says it
        is not meaningful, and why."""
        line = (
            f"TTFT p50 = {self.a_ms:,.1f} ms + {self.b_ms:,.1f} ms x (1 - hit rate), "
            f"R^2 {self.r_squared:.3f} ({self.num_points} points)"
        )
        if self.a_ci_ms is not None and self.b_ci_ms is not None:
            line += (
                f"; 95% CI a [{self.a_ci_ms[0]:,.1f}, {self.a_ci_ms[1]:,.1f}] ms, "
                f"b [{self.b_ci_ms[0]:,.1f}, {self.b_ci_ms[1]:,.1f}] ms"
            )
        return line if self.caveat is None else f"not meaningful: {line}; {self.caveat}"

    def as_dict(self) -> dict[str, Any]:
        """The coefficients, their standard errors and 95% intervals (``interval`` says how), and the
        ``caveats`` (a list of reasons; empty when the line can be true)."""
        return {
            **asdict(self),
            "a_ci_ms": self.a_ci_ms,
            "b_ci_ms": self.b_ci_ms,
            "interval": INTERVAL,
            "caveats": self.caveats,
        }


def fit_ttft_vs_miss_rate(hit_rates: Sequence[float], ttft_p50_ms: Sequence[float]) -> Fit:
    """Fit ``TTFT p50 = a + b x (1 - hit rate)`` by ordinary least squares
    (:func:`kvbench.results.ols.ols_line`).

    Args:
        hit_rates: token hit rates, fractions in [0, 1], one per run.
        ttft_p50_ms: the TTFT p50 of each run, in ms, same order.

    Raises:
        ValueError: different lengths, fewer than 2 points, a missing or non-finite value, a hit rate
            outside [0, 1], or fewer than 2 distinct hit rates (the slope is then undefined).
    """
    from kvbench.results.ols import ols_line

    if len(hit_rates) != len(ttft_p50_ms):
        raise ValueError(f"{len(hit_rates)} hit rates but {len(ttft_p50_ms)} TTFT values")
    if any(v is None for v in (*hit_rates, *ttft_p50_ms)):
        raise ValueError("hit rates and TTFT values must all be present (no None)")
    hits = np.asarray(hit_rates, dtype=np.float64)
    ttft = np.asarray(ttft_p50_ms, dtype=np.float64)
    if hits.size < 2:
        raise ValueError(f"a fit needs at least 2 points, got {hits.size}")
    if not (np.isfinite(hits).all() and np.isfinite(ttft).all()):
        raise ValueError("hit rates and TTFT values must be finite")
    if ((hits < 0) | (hits > 1)).any():
        raise ValueError(f"hit rates must lie in [0, 1], got {hits.tolist()}")
    if np.ptp(hits) == 0:
        raise ValueError("a fit needs at least 2 distinct hit rates")
    line = ols_line(1.0 - hits, ttft)
    return Fit(
        a_ms=line.intercept,
        b_ms=line.slope,
        r_squared=line.r_squared,
        num_points=line.num_points,
        a_se_ms=line.intercept_se,
        b_se_ms=line.slope_se,
    )


@dataclass(frozen=True)
class SweepPoint:
    """One cache size of a sweep: what its run measured and where its rows are.

    ``token_hit_rate`` and ``p50_ttft_ms`` are ``None`` when no request succeeded (or every one met a
    cold cache); such points are kept in the table but left out of the fit.

    With ``num_repeats`` R > 1 (:meth:`from_repeats`): ``p50_ttft_ms``, ``p90_ttft_ms`` and
    ``token_hit_rate`` are medians over the repeats (the fit reads ``p50_ttft_ms``, so it fits the
    medians), ``min_p50_ttft_ms`` / ``max_p50_ttft_ms`` the spread, ``num_requests`` / ``num_errors``
    totals over the repeats.
    """

    capacity_blocks: int
    token_hit_rate: float | None
    p50_ttft_ms: float | None
    results_path: str
    p90_ttft_ms: float | None = None
    num_requests: int = 0
    num_errors: int = 0
    num_repeats: int = 1
    min_p50_ttft_ms: float | None = None
    max_p50_ttft_ms: float | None = None
    repeat_p50_ttft_ms: tuple[float | None, ...] = ()
    repeat_results_paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.capacity_blocks <= 0:
            raise ValueError(f"capacity_blocks must be positive, got {self.capacity_blocks}")
        if self.token_hit_rate is not None and not 0.0 <= self.token_hit_rate <= 1.0:
            raise ValueError(f"token_hit_rate must lie in [0, 1], got {self.token_hit_rate}")
        for name in ("p50_ttft_ms", "p90_ttft_ms"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.num_requests < 0 or self.num_errors < 0:
            raise ValueError("num_requests and num_errors must be >= 0")

    @classmethod
    def from_summary(cls, capacity_blocks: int, summary: RunSummary, results_path: str | Path) -> SweepPoint:
        """The point of one run: its :class:`RunSummary` and the Parquet file it wrote."""
        return cls.from_repeats(capacity_blocks, [(summary, results_path)])

    @classmethod
    def from_repeats(cls, capacity_blocks: int, runs: Sequence[tuple[RunSummary, str | Path]]) -> SweepPoint:
        """The point of R >= 1 runs at one size, ``(summary, results file)`` in run order (class docstring).

        Raises:
            ValueError: no runs.
        """
        if not runs:
            raise ValueError("a sweep point needs at least one run")
        summaries = [summary for summary, _ in runs]
        p50s = [s.p50_ttft_ms for s in summaries]
        measured = [v for v in p50s if v is not None]
        return cls(
            capacity_blocks=capacity_blocks,
            token_hit_rate=_median([s.token_hit_rate for s in summaries]),
            p50_ttft_ms=_median(p50s),
            results_path=str(runs[0][1]),
            p90_ttft_ms=_median([s.p90_ttft_ms for s in summaries]),
            num_requests=sum(s.num_requests for s in summaries),
            num_errors=sum(s.num_errors for s in summaries),
            num_repeats=len(runs),
            min_p50_ttft_ms=min(measured) if measured else None,
            max_p50_ttft_ms=max(measured) if measured else None,
            repeat_p50_ttft_ms=tuple(p50s),
            repeat_results_paths=tuple(str(path) for _, path in runs),
        )

    @property
    def fittable(self) -> bool:
        return self.token_hit_rate is not None and self.p50_ttft_ms is not None

    def as_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["repeat_p50_ttft_ms"], row["repeat_results_paths"] = (
            list(self.repeat_p50_ttft_ms),
            list(self.repeat_results_paths),
        )
        return row


def _median(values: Sequence[float | None]) -> float | None:
    """The median of the values present (``None`` if none is)."""
    present = [v for v in values if v is not None]
    return float(np.median(present)) if present else None


@dataclass(frozen=True)
class SweepSummary:
    """A whole sweep: points sorted by capacity, the fit (``None`` when < 2 distinct hit rates).

    Attributes:
        context: what the sweep ran, JSON values only. Suggested keys: ``scenario`` (name), ``trace``
            (the runs' ``run.trace`` dict, with its ``content_hash``), ``cache`` (the runs' cache config
            without ``capacity_blocks``), ``backend``, ``model``.
        complete: False when the sweep was interrupted before its last size.
    """

    points: tuple[SweepPoint, ...]
    fit: Fit | None
    context: Mapping[str, Any] = field(default_factory=dict)
    complete: bool = True

    def __post_init__(self) -> None:
        capacities = [p.capacity_blocks for p in self.points]
        if capacities != sorted(capacities):
            raise ValueError(f"points must be sorted by capacity_blocks, got {capacities}")

    @property
    def name(self) -> str:
        """The scenario name from the context, or ``"sweep"``."""
        return str(self.context.get("scenario") or "sweep")


def build_sweep_summary(
    points: Sequence[SweepPoint], context: Mapping[str, Any] | None = None, complete: bool = True
) -> SweepSummary:
    """Sort ``points`` by capacity and fit TTFT p50 against the miss rate over the fittable ones.

    The fit is ``None`` when fewer than 2 points have distinct measured hit rates.
    """
    ordered = tuple(sorted(points, key=lambda p: p.capacity_blocks))
    usable = [p for p in ordered if p.fittable]
    fit = None
    if len({p.token_hit_rate for p in usable}) >= 2:
        fit = fit_ttft_vs_miss_rate([p.token_hit_rate for p in usable], [p.p50_ttft_ms for p in usable])
    return SweepSummary(points=ordered, fit=fit, context=dict(context or {}), complete=complete)


def write_sweep_summary(path: str | Path, summary: SweepSummary) -> Path:
    """Write the summary (one row per cache size) with ``command``, ``sweep``, ``fit``, ``complete``
    in the metadata. Returns the path."""
    metadata = {
        "command": "sweep",
        "sweep": dict(summary.context),
        "fit": summary.fit.as_dict() if summary.fit else None,
        "complete": summary.complete,
    }
    return write_rows(path, [p.as_row() for p in summary.points], metadata, schema=SWEEP_SCHEMA)


def read_sweep_summary(path: str | Path) -> SweepSummary:
    """Read a file written by :func:`write_sweep_summary`.

    Raises:
        InputError: not a readable Parquet file, or not a sweep summary.
    """
    metadata = read_metadata(path)
    if metadata.get("command") != "sweep":
        raise InputError(
            f"{path}: not a sweep summary (its metadata says command "
            f"{metadata.get('command')!r}, expected 'sweep')"
        )
    try:
        points = tuple(_point_from_row(row) for row in pq.read_table(path).to_pylist())
        fit = Fit.from_dict(metadata["fit"]) if metadata.get("fit") else None
        return SweepSummary(
            points=points,
            fit=fit,
            context=metadata.get("sweep") or {},
            complete=bool(metadata.get("complete", True)),
        )
    except (TypeError, ValueError, KeyError) as exc:
        raise InputError(f"{path}: malformed sweep summary ({exc})") from None


def _point_from_row(point: Mapping[str, Any]) -> SweepPoint:
    return SweepPoint(
        capacity_blocks=point["capacity_blocks"],
        token_hit_rate=point.get("token_hit_rate"),
        p50_ttft_ms=point.get("p50_ttft_ms"),
        results_path=point.get("results_path") or "",
        p90_ttft_ms=point.get("p90_ttft_ms"),
        num_requests=point.get("num_requests") or 0,
        num_errors=point.get("num_errors") or 0,
        num_repeats=point.get("num_repeats") or 1,
        min_p50_ttft_ms=point.get("min_p50_ttft_ms"),
        max_p50_ttft_ms=point.get("max_p50_ttft_ms"),
        repeat_p50_ttft_ms=tuple(point.get("repeat_p50_ttft_ms") or ()),
        repeat_results_paths=tuple(point.get("repeat_results_paths") or ()),
    )
