"""The files of a one-pass hit-rate curve: a Parquet row at every size (or TTL) where the hit count
changes, and its PNG, written beside a ``kvbench sim`` result file (``NAME.parquet`` -> ``NAME.curve.parquet``,
``NAME.curve.png``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvbench.extras import missing_extra
from kvbench.results.parquet import write_rows
from kvbench.results.plots import Curve, plot_hit_curve
from kvbench.sim.curve import HitCurve
from kvbench.sim.replay import SimResult
from kvbench.sim.ttl_curve import TtlCurve


def curve_paths(out: Path, kind: str = "curve") -> tuple[Path, Path]:
    """``(parquet, png)`` paths of the curve (``kind``: ``curve`` or ``ttl-curve``) that goes with
    the result file ``out``."""
    stem = out.name[: -len(".parquet")] if out.name.endswith(".parquet") else out.name
    return out.with_name(f"{stem}.{kind}.parquet"), out.with_name(f"{stem}.{kind}.png")


def write_curve(curve: HitCurve, out: Path, title: str, metadata: Mapping[str, Any],
                marks: Sequence[SimResult] = ()) -> tuple[Path, Path | None, int]:
    """Write the curve's rows (:meth:`HitCurve.results`, the columns of ``kvbench sim``'s rows) and its
    PNG (``marks``: the sized results, drawn as points). Returns ``(parquet, png, num_rows)``; ``png`` is
    ``None`` without matplotlib."""
    parquet, png = curve_paths(out)
    results = curve.results()
    rows = [result.as_row() for result in results]
    ideal = rows[-1]["token_hit_rate"] if rows else None
    write_rows(parquet, rows, {**metadata, "curve": "every size where the hit count changes",
                               "ideal_capacity_blocks": curve.ideal_capacity_blocks})
    points = Curve("one-pass LRU curve (exact)", tuple(r.capacity_blocks for r in results),
                   tuple(r.token_hit_rate for r in results))
    sizes = Curve("sizes in the table", tuple(r.capacity_blocks for r in marks), tuple(r.token_hit_rate for r in marks))
    return parquet, plotted_or_none(lambda: plot_hit_curve(points, png, title, ideal=ideal, marks=sizes), png), len(rows)


def write_ttl_curve(curve: TtlCurve, out: Path, title: str, metadata: Mapping[str, Any]) -> tuple[Path, Path | None, int]:
    """Write the TTL curve's rows (:meth:`TtlCurve.rows`) and its PNG beside ``out``
    (``NAME.ttl-curve.parquet``, ``NAME.ttl-curve.png``). Returns ``(parquet, png, num_rows)``."""
    parquet, png = curve_paths(out, "ttl-curve")
    rows = curve.rows()
    write_rows(parquet, rows, {**metadata, "curve": "hit rate vs TTL, unbounded cache"})
    points = Curve("unbounded cache, one pass (exact)", tuple(r["ttl_s"] for r in rows),
                   tuple(r["token_hit_rate"] for r in rows))
    return parquet, plotted_or_none(lambda: plot_hit_curve(points, png, title, ideal=rows[-1]["token_hit_rate"] if rows else None,
                                                    xlabel="TTL (seconds of trace time, log scale)"), png), len(rows)


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
