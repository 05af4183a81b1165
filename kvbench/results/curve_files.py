"""The files of a one-pass hit-rate curve: a Parquet row at every size (or TTL) where the hit count
changes, and its PNG, written beside a ``kvbench sim`` result file (``NAME.parquet`` ->
``NAME.curve.parquet``,
``NAME.curve.png``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from kvbench.cache.base import CacheKind
from kvbench.extras import missing_extra
from kvbench.results.parquet import write_rows, write_table
from kvbench.results.plots import Curve, plot_hit_curve
from kvbench.sim.curve import HitCurve
from kvbench.sim.replay import SimResult
from kvbench.sim.ttl_curve import TtlCurve


def curve_paths(out: Path, kind: str = "curve") -> tuple[Path, Path]:
    """``(parquet, png)`` paths of the curve (``kind``: ``curve`` or ``ttl-curve``) that goes with
    the result file ``out``."""
    stem = out.name[: -len(".parquet")] if out.name.endswith(".parquet") else out.name
    return out.with_name(f"{stem}.{kind}.parquet"), out.with_name(f"{stem}.{kind}.png")


def write_curve(
    curve: HitCurve, out: Path, title: str, metadata: Mapping[str, Any], marks: Sequence[SimResult] = ()
) -> tuple[Path, Path | None, int]:
    """Write the curve's rows (:func:`curve_table`: a row at every change point, the columns of
    ``kvbench sim``'s rows) and its PNG (``marks``: the sized results, drawn as points). Returns
    ``(parquet, png, num_rows)``; ``png`` is ``None`` without matplotlib."""
    parquet, png = curve_paths(out)
    capacities = curve.change_points()
    table = curve_table(curve, capacities)
    rates = table.column("token_hit_rate").to_numpy()
    ideal = float(rates[-1]) if rates.size else None
    write_table(
        parquet,
        table,
        {
            **metadata,
            "curve": "every size where the hit count changes",
            "ideal_capacity_blocks": curve.ideal_capacity_blocks,
        },
    )
    x, y = _drawn(capacities, rates)
    points = Curve("one-pass LRU curve (exact)", tuple(x.tolist()), tuple(y.tolist()))
    sizes = Curve(
        "sizes in the table", tuple(r.capacity_blocks for r in marks), tuple(r.token_hit_rate for r in marks)
    )
    return (
        parquet,
        plotted_or_none(lambda: plot_hit_curve(points, png, title, ideal=ideal, marks=sizes), png),
        table.num_rows,
    )


MAX_DRAWN_POINTS = 8192  # a PNG is ~1,000 pixels wide: more steps than this are drawn at log-spaced sizes


def _drawn(capacities: np.ndarray, rates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The step curve to draw: every change point, or past :data:`MAX_DRAWN_POINTS` the curve's value
    at that many log-spaced sizes (the last change point included)."""
    if capacities.size <= MAX_DRAWN_POINTS:
        return capacities, rates
    sizes = np.unique(
        np.append(
            np.geomspace(capacities[0], capacities[-1], MAX_DRAWN_POINTS).astype(np.int64), capacities[-1]
        )
    )
    return sizes, rates[np.searchsorted(capacities, sizes, side="right") - 1]


def curve_table(curve: HitCurve, capacities_blocks: np.ndarray) -> pa.Table:
    """The rows :meth:`HitCurve.results` gives at ``capacities_blocks`` (``SimResult.as_row``'s
    columns, types and values), built from :meth:`HitCurve.totals` without a Python object a row."""
    capacities = np.asarray(capacities_blocks, dtype=np.int64)
    totals, num = curve.totals(capacities), capacities.size
    block_size, tokens, queried = curve.trace.block_size, curve.num_prompt_tokens, curve.num_queried_blocks
    hits = totals["num_hit_blocks"]
    columns = {
        "capacity_blocks": capacities,
        "release_order": [curve.release_order.value] * num,
        "cache_kind": [CacheKind.HASH.value] * num,
        "block_size": np.full(num, block_size, dtype=np.int64),
        "ttl_s": pa.nulls(num),
        "num_requests": np.full(num, curve.trace.num_requests, dtype=np.int64),
        "prompt_tokens": np.full(num, tokens, dtype=np.int64),
        "cached_prompt_tokens": hits * block_size,
        "token_hit_rate": hits * block_size / tokens if tokens else np.zeros(num),
        "block_hit_rate": hits / queried if queried else np.zeros(num),
        "hit_blocks": hits,
        "queried_blocks": np.full(num, queried, dtype=np.int64),
        "inserted_blocks": totals["num_inserted_blocks"],
        "evictions": totals["num_evicted_blocks"],
        "expirations": np.zeros(num, dtype=np.int64),
        "refused_inserts": totals["num_refused_blocks"],
        "method": ["one-pass"] * num,
    }
    return pa.table(columns)


def write_ttl_curve(
    curve: TtlCurve, out: Path, title: str, metadata: Mapping[str, Any]
) -> tuple[Path, Path | None, int]:
    """Write the TTL curve's rows (:meth:`TtlCurve.rows`) and its PNG beside ``out``
    (``NAME.ttl-curve.parquet``, ``NAME.ttl-curve.png``). Returns ``(parquet, png, num_rows)``."""
    parquet, png = curve_paths(out, "ttl-curve")
    rows = curve.rows()
    write_rows(parquet, rows, {**metadata, "curve": "hit rate vs TTL, unbounded cache"})
    points = Curve(
        "unbounded cache, one pass (exact)",
        tuple(r["ttl_s"] for r in rows),
        tuple(r["token_hit_rate"] for r in rows),
    )
    return (
        parquet,
        plotted_or_none(
            lambda: plot_hit_curve(
                points,
                png,
                title,
                ideal=rows[-1]["token_hit_rate"] if rows else None,
                xlabel="TTL (seconds of trace time, log scale)",
            ),
            png,
        ),
        len(rows),
    )


def plotted_or_none(draw: Callable[[], Any], png: Path) -> Path | None:
    """``png`` once ``draw()`` wrote it; ``None`` when matplotlib (the [plots] extra) is not installed,
    so a core install still writes the curve's Parquet rows."""
    try:
        draw()
    except ModuleNotFoundError as exc:
        if missing_extra(exc) is None:
            raise
        return None
    return png
