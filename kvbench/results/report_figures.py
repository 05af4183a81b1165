"""The report's PNG plots, drawn from result files: hit rate vs cache size, TTFT vs hit rate, load
sweeps, and per trace TTFT CDF, TTFT per request, cached tokens per turn.

:func:`draw_figures` writes them in page order; :mod:`kvbench.results.report` embeds them in its page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvbench.results import plots
from kvbench.results.files import ResultFile, group_by_trace, split_ttft
from kvbench.results.sweep import fit_ttft_vs_miss_rate


@dataclass(frozen=True)
class Figure:
    """One written PNG and the sentence under it."""

    path: Path
    caption: str


def draw_figures(results: Sequence[ResultFile], out_dir: Path) -> list[Figure]:
    """Every PNG the inputs allow, written into ``out_dir``, in page order: hit rate vs cache size,
    the TTFT-vs-hit-rate fits, a load sweep's PNGs, then each trace group's run figures."""
    figures = (
        _hit_rate_figure(results, out_dir)
        + _fit_figures(results, out_dir)
        + _load_sweep_figures(results, out_dir)
    )
    for index, group in enumerate(group_by_trace(results), start=1):
        figures += _run_figures(group, index, out_dir)
    return figures


def _group_title(group: Sequence[ResultFile]) -> str:
    first = group[0]
    name = first.scenario or Path((first.run.get("trace") or {}).get("path") or first.name).stem
    return f"{name} (trace {first.content_hash[:15]}...)" if first.content_hash else name


def _hit_rate_figure(results: Sequence[ResultFile], out_dir: Path) -> list[Figure]:
    """Hit rate against capacity in tokens (blocks x block size): sims of 16-token and sweeps of
    512-token blocks compare at the same memory, never at the same block count."""
    curves, ideals = [], {}
    for result in results:
        if result.kind == "sim":
            curves += _sim_curves(result, ideals)
        elif result.kind == "sweep":
            points = [p for p in result.sweep.points if p.token_hit_rate is not None]
            block = (result.sweep.context.get("cache") or {}).get("block_size")
            size = f"{block}-token blocks" if block else "x in blocks: block size not recorded"
            curves.append(
                plots.Curve(
                    f"{result.sweep.name} engine sweep ({size})",
                    tuple(p.capacity_blocks * (block or 1) for p in points),
                    tuple(p.token_hit_rate for p in points),
                )
            )
    if not curves:
        return []
    path = plots.plot_hit_rate_vs_size(
        curves, out_dir / "hit_rate_vs_cache_size.png", "Token hit rate vs cache size", ideals
    )
    return [
        Figure(
            path,
            "Token hit rate (cached / prompt tokens) at each cache capacity in tokens (blocks x "
            "block size); dashed, in the series' colour: an unbounded cache (the trace's ideal).",
        )
    ]


def _sim_curves(result: ResultFile, ideals: dict[str, float]) -> list[plots.Curve]:
    """One curve per release order of a sim file; its unbounded-cache rate keyed by the first curve's
    label."""
    curves = []
    orders = sorted({point.get("release_order") or "" for point in result.table_rows})
    for order in orders:
        points = sorted(
            (point for point in result.table_rows if (point.get("release_order") or "") == order),
            key=lambda point: point["capacity_blocks"],
        )
        blocks = sorted({point.get("block_size") or 1 for point in points})
        label = (
            f"{result.scenario or result.name} sim"
            + (f", {order}" if len(orders) > 1 else "")
            + f" ({'/'.join(map(str, blocks))}-token blocks)"
        )
        curves.append(
            plots.Curve(
                label,
                tuple(point["capacity_blocks"] * (point.get("block_size") or 1) for point in points),
                tuple(point["token_hit_rate"] for point in points),
            )
        )
    if curves and result.metadata.get("ideal_token_hit_rate") is not None:
        ideals[curves[0].label] = result.metadata["ideal_token_hit_rate"]
    return curves


def _fit_figures(results: Sequence[ResultFile], out_dir: Path) -> list[Figure]:
    figures = []
    for index, result in enumerate(r for r in results if r.kind == "sweep"):
        points = [p for p in result.sweep.points if p.fittable]
        if not points:
            continue
        curve = plots.Curve(
            f"{result.sweep.name}: one run per cache size",
            tuple(p.token_hit_rate for p in points),
            tuple(p.p50_ttft_ms for p in points),
        )
        path = plots.plot_ttft_vs_hit_rate(
            [curve],
            out_dir / f"ttft_vs_hit_rate_sweep{index + 1}.png",
            f"TTFT p50 vs hit rate: {result.sweep.name} sweep",
            result.sweep.fit,
        )
        figures.append(Figure(path, plots.fit_caption(result.sweep.fit)))
    for index, group in enumerate(group_by_trace(results)):
        runs = [
            r for r in group if r.summary.token_hit_rate is not None and r.summary.p50_ttft_ms is not None
        ]
        if len({r.summary.token_hit_rate for r in runs}) < 2:
            continue
        fit = fit_ttft_vs_miss_rate(
            [r.summary.token_hit_rate for r in runs], [r.summary.p50_ttft_ms for r in runs]
        )
        curves = [plots.Curve(r.label, (r.summary.token_hit_rate,), (r.summary.p50_ttft_ms,)) for r in runs]
        path = plots.plot_ttft_vs_hit_rate(
            curves,
            out_dir / f"ttft_vs_hit_rate_runs{index + 1}.png",
            f"TTFT p50 vs hit rate: {_group_title(group)}",
            fit,
        )
        figures.append(Figure(path, f"Runs of one trace: {plots.fit_caption(fit)}"))
    return figures


def _caches_in_words(caching: set[bool | None]) -> str:
    """``cache off vs on``, ``cache on``, ``cache off`` (:attr:`WhatRan.caching` of the runs), or
    ``server's own cache`` where a server run did not record its state."""
    if caching == {True, False}:
        return "cache off vs on"
    if None in caching:
        return "server's own cache"
    return "cache on" if True in caching else "cache off"


def _run_figures(group: Sequence[ResultFile], index: int, out_dir: Path) -> list[Figure]:
    title = _group_title(group)
    split = {r.label: split_ttft(r.rows) for r in group}
    cdf_title = f"TTFT CDF, {_caches_in_words({r.what_ran.caching for r in group})}: {title}"
    figures = [
        Figure(
            plots.plot_ttft_cdf(
                {label: s.warm_ms for label, s in split.items()}, out_dir / f"ttft_cdf_{index}.png", cdf_title
            ),
            "Measured requests that succeeded; the cold first request of a run without warm-up is left "
            "out, as in the TTFT percentiles.",
        )
    ]
    series = [
        plots.RequestSeries(
            label,
            plots.Curve(label, s.warm_index, s.warm_ms),
            plots.Curve(label, tuple(i for i, _ in s.warmup), tuple(t for _, t in s.warmup))
            if s.warmup
            else None,
            s.cold,
        )
        for label, s in split.items()
    ]
    figures.append(
        Figure(
            plots.plot_ttft_by_request(
                series, out_dir / f"ttft_by_request_{index}.png", f"TTFT per request: {title}"
            ),
            "TTFT of each request in trace order; circled: the cold first request.",
        )
    )
    turn_figure = _turn_figure(group, title, out_dir / f"cached_tokens_per_turn_{index}.png")
    return figures + ([turn_figure] if turn_figure else [])


def _turn_figure(group: Sequence[ResultFile], title: str, path: Path) -> Figure | None:
    ok_rows = {
        r.label: [row for row in r.rows if row.status == "ok" and row.turn is not None and row.measured]
        for r in group
    }
    if all(len({row.turn for row in rows}) < 2 for rows in ok_rows.values()):
        return None  # one-shot prompts: nothing to show per turn
    curves, prompt = [], None
    for label, rows in ok_rows.items():
        turns = sorted({row.turn for row in rows})
        by_turn = {t: [row for row in rows if row.turn == t] for t in turns}
        curves.append(
            plots.Curve(
                f"{label}: cached",
                tuple(turns),
                tuple(
                    sum(row.cached_prompt_tokens or 0 for row in by_turn[t]) / len(by_turn[t]) for t in turns
                ),
            )
        )
        if prompt is None:
            prompt = plots.Curve(
                "prompt tokens",
                tuple(turns),
                tuple(sum(row.prompt_tokens or 0 for row in by_turn[t]) / len(by_turn[t]) for t in turns),
            )
    path = plots.plot_cached_per_turn(curves, path, f"Cached prompt tokens per turn: {title}", prompt)
    return Figure(path, "Mean cached prompt tokens per turn (or agent step), against the mean prompt length.")


def _load_sweep_figures(results: Sequence[ResultFile], out_dir: Path) -> list[Figure]:
    from kvbench.results.load_sweep_report import load_sweep_figures, read_points

    sweeps = [r for r in results if r.kind == "load-sweep"]
    return [
        figure
        for index, r in enumerate(sweeps, start=1)
        for figure in load_sweep_figures(
            read_points(r.metadata),
            r.metadata["sweep"]["axis"],
            out_dir,
            f"load_sweep{index}_" if len(sweeps) > 1 else "",
        )
    ]
