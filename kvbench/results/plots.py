"""PNG plots of result files: hit rate vs cache size, TTFT vs hit rate, TTFT CDF, TTFT per request,
cached tokens per turn.

Every function takes plain data (:class:`Curve`, lists of ms values), writes one PNG with a title,
axis labels carrying units and a legend, and returns its path. matplotlib is imported inside the
functions with the Agg backend (no display needed), so commands that draw nothing start fast.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kvbench.results.sweep import Fit

if TYPE_CHECKING:
    from kvbench.sim.tier_ttft import TierPoint

_DPI = 110
_SIZE_IN = (8.0, 4.8)  # width, height in inches: 880 x 528 px at _DPI


@dataclass(frozen=True)
class Curve:
    """One labelled series: ``x`` and ``y`` of equal length."""

    label: str
    x: tuple[float, ...]
    y: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"curve {self.label!r}: {len(self.x)} x values but {len(self.y)} y values")


@dataclass(frozen=True)
class RequestSeries:
    """TTFT per request of one run: measured and warm-up requests, and the cold first request if any."""

    label: str
    measured: Curve
    warmup: Curve | None = None
    cold: tuple[float, float] | None = None  # (request index, TTFT ms)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bare_figure():
    """A figure on the Agg canvas without pyplot (no backend selection, no figure manager): what
    :func:`plot_hit_curve` draws on, since ``kvbench sim`` writes that PNG on every run."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=_SIZE_IN)
    FigureCanvasAgg(figure)
    return figure


def _save(figure, plt, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    legends = [axis.get_legend() for axis in figure.axes if axis.get_legend() is not None]
    figure.savefig(
        path,
        dpi=_DPI,
        bbox_inches="tight",  # keeps legends placed outside the axes
        bbox_extra_artists=[*figure.get_default_bbox_extra_artists(), *legends],
    )
    plt.close(figure)
    return path


def plot_hit_rate_vs_size(
    curves: Sequence[Curve],
    path: Path,
    title: str,
    ideals: Mapping[str, float] | None = None,
    xlabel: str = "cache capacity (tokens = blocks x block size, log scale)",
) -> Path:
    """Token hit rate (y, 0..1) against cache capacity (x, log 2 scale; in tokens, so that curves of
    different block sizes share one axis), one line per curve; ``ideals`` (curve label -> hit rate of
    an unbounded cache) are drawn as dashed horizontal lines in their curve's colour (grey for a label
    that names no curve). The legend sits under the axes, so it never covers a line."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=_SIZE_IN)
    colors = {}
    for curve in curves:
        (line,) = axis.plot(curve.x, curve.y, marker="o", label=curve.label)
        colors.setdefault(curve.label, line.get_color())
    for label, value in (ideals or {}).items():
        axis.axhline(
            value,
            ls="--",
            lw=1.0,
            color=colors.get(label, "grey"),
            label=f"{label}: unbounded cache ({value:.3f})",
        )
    axis.set_xscale("log", base=2)
    ticks = spaced_ticks(sorted({x for curve in curves for x in curve.x}))
    if ticks:
        axis.set_xticks(ticks, [_size_text(s) for s in ticks])
        axis.minorticks_off()
    axis.set_ylim(0, 1.02)
    axis.set_xlabel(xlabel)
    axis.set_ylabel("token hit rate (cached / prompt tokens)")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    _legend_below(axis, len(axis.get_legend_handles_labels()[0]))
    return _save(figure, plt, path)


def spaced_ticks(values: Sequence[float], min_ratio: float = 1.5, max_ticks: int = 12) -> list[float]:
    """The values to label on a log axis: each at least ``min_ratio`` times the last kept one (1,000
    and 1,024 would print on top of each other), thinned to at most ``max_ticks``."""
    kept: list[float] = []
    for value in values:
        if value > 0 and (not kept or value >= kept[-1] * min_ratio):
            kept.append(value)
    step = -(-len(kept) // max_ticks) if kept else 1
    return kept[::step]


def _size_text(value: float) -> str:
    """``512``, ``16K``, ``1.5M``: a short tick label for a size in tokens."""
    for suffix, scale in (("M", 1e6), ("K", 1e3)):
        if value >= scale * 10 or (value >= scale and value % scale == 0):
            return f"{value / scale:,.3g}{suffix}"
    return f"{int(value):,}"


def _legend_below(axis, num_entries: int) -> None:
    """A legend under the axes (outside the data), two columns once there are more than three short
    entries."""
    longest = max((len(label) for label in axis.get_legend_handles_labels()[1]), default=0)
    legend = axis.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        ncol=2 if num_entries > 3 and longest <= 40 else 1,
        fontsize=8,
        frameon=False,
    )
    legend.set_in_layout(False)  # tight_layout must not shrink the axes for it; the saved bbox takes it in


def plot_ttft_vs_hit_rate(points: Sequence[Curve], path: Path, title: str, fit: Fit | None = None) -> Path:
    """TTFT p50 (y, ms) against token hit rate (x, 0..1): one marker series per curve, and the fitted
    line ``a + b x (1 - hit rate)`` over [0, 1] when ``fit`` is given and can be true: a fit with a
    :attr:`~kvbench.results.sweep.Fit.caveat` (2 points, a negative slope or TTFT) is not drawn, its
    caption (:func:`fit_caption`) says why."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=_SIZE_IN)
    for curve in points:
        axis.plot(curve.x, curve.y, marker="o", ls="none", markersize=7, label=curve.label)
    if fit is not None and fit.caveat is None:  # a line its caption calls not meaningful is not drawn
        hits = np.linspace(0.0, 1.0, 50)
        axis.plot(
            hits,
            [fit.predict_ms(h) for h in hits],
            color="black",
            lw=1.0,
            ls="--",
            label=f"fit: {fit.a_ms:,.1f} + {fit.b_ms:,.1f} x (1 - hit), R^2 {fit.r_squared:.3f}",
        )
    axis.set_xlim(-0.02, 1.02)
    axis.set_ylim(bottom=0)
    axis.set_xlabel("token hit rate (cached / prompt tokens)")
    axis.set_ylabel("TTFT p50 (ms)")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    _legend_below(axis, len(axis.get_legend_handles_labels()[0]))  # under the axes: never over a point
    return _save(figure, plt, path)


def fit_caption(fit: Fit | None) -> str:
    """The sentence under a TTFT-vs-hit-rate plot: the fit (:meth:`~kvbench.results.sweep.Fit.describe`),
    and "no line drawn" when it is not meaningful (:func:`plot_ttft_vs_hit_rate` leaves it out)."""
    if fit is None:
        return "too few distinct hit rates to fit"
    return fit.describe() if fit.caveat is None else f"no line drawn, {fit.describe()}"


def plot_ttft_cdf(samples: Mapping[str, Sequence[float]], path: Path, title: str) -> Path:
    """Empirical CDF of TTFT (x, ms; log scale when the values span more than 20x), one step line per
    label in ``samples``."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=_SIZE_IN)
    values = [np.sort(np.asarray(v, dtype=np.float64)) for v in samples.values()]
    for label, sorted_ms in zip(samples, values):
        if sorted_ms.size:
            fraction = np.arange(0, sorted_ms.size + 1) / sorted_ms.size  # from 0 at the smallest value
            axis.step(
                np.concatenate([sorted_ms[:1], sorted_ms]),
                fraction,
                where="post",
                label=f"{label} (n={sorted_ms.size:,})",
            )
    positive = np.concatenate([v[v > 0] for v in values]) if values else np.array([])
    if positive.size and positive.max() > 20 * positive.min():
        axis.set_xscale("log")
        _log_ms_ticks(axis, float(np.log10(positive.max() / positive.min())))
    axis.set_ylim(0, 1.02)
    axis.set_xlabel("TTFT (ms)")
    axis.set_ylabel("fraction of requests (TTFT <= x)")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(loc="best", fontsize=8)
    return _save(figure, plt, path)


def _log_ms_ticks(axis, decades: float) -> None:
    """Label a log x axis in plain ms (``20``, ``50``, ``100``, ``1,000``): 1, 2 and 5 of each decade
    when the data span at most 3 ``decades``, the powers of 10 beyond; minor ticks unlabelled.
    matplotlib's own labels ``3x10^2`` and ``4x10^2`` at minor ticks, side by side, touch or overlap."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 3 else (1.0,)))
    axis.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}" if x >= 1 else f"{x:.3g}"))
    axis.xaxis.set_minor_formatter(NullFormatter())


def plot_ttft_by_request(series: Sequence[RequestSeries], path: Path, title: str) -> Path:
    """TTFT (y, ms) of every request against its index in the trace (x), one colour per run; warm-up
    requests hollow, the cold first request of a run circled and labelled."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=_SIZE_IN)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, run in enumerate(series):
        color = colors[index % len(colors)]
        axis.plot(run.measured.x, run.measured.y, marker=".", ls="-", lw=0.6, color=color, label=run.label)
        if run.warmup is not None and run.warmup.x:
            axis.plot(
                run.warmup.x,
                run.warmup.y,
                marker="o",
                ls="none",
                mfc="none",
                color=color,
                label=f"{run.label}: warm-up",
            )
        if run.cold is not None:
            axis.plot(
                *run.cold,
                marker="o",
                markersize=12,
                mfc="none",
                mew=1.5,
                color=color,
                ls="none",
                label=f"{run.label}: cold first request ({run.cold[1]:,.0f} ms)",
            )
    axis.set_ylim(bottom=0)
    axis.xaxis.get_major_locator().set_params(integer=True)  # request indices, never 0.5
    axis.set_xlabel("request index in the trace")
    axis.set_ylabel("TTFT (ms)")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    _legend_below(axis, len(axis.get_legend_handles_labels()[0]))  # the axes keep their full height
    return _save(figure, plt, path)


def plot_cached_per_turn(
    curves: Sequence[Curve], path: Path, title: str, prompt: Curve | None = None
) -> Path:
    """Mean cached prompt tokens (y, tokens) per conversation turn or agent step (x), one line per
    run; ``prompt`` (mean prompt tokens per turn) drawn dashed as the ceiling."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=_SIZE_IN)
    if prompt is not None:
        axis.plot(prompt.x, prompt.y, ls="--", color="grey", marker="x", label=prompt.label)
    for curve in curves:
        axis.plot(curve.x, curve.y, marker="o", label=curve.label)
    turns = sorted({x for curve in (*curves, *([prompt] if prompt else [])) for x in curve.x})
    if turns and len(turns) <= 30:
        axis.set_xticks(turns, [str(int(t)) for t in turns])
    axis.set_ylim(bottom=0)
    axis.set_xlabel("turn (chat) or step (agent)")
    axis.set_ylabel("tokens per request (mean)")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(loc="upper left", fontsize=8)
    return _save(figure, plt, path)


def plot_hit_curve(
    curve: Curve,
    path: Path,
    title: str,
    ideal: float | None = None,
    marks: Curve | None = None,
    xlabel: str = "cache capacity (blocks, log scale)",
) -> Path:
    """Token hit rate (y, 0..1) at every cache capacity (x, blocks, log 2 scale) as a step line (the
    one-pass LRU curve: the rate is constant between the sizes in ``curve.x``); ``marks`` are drawn
    as points (sizes also listed in a table), ``ideal`` as a dashed line. ``xlabel`` names another x
    (the TTL curve: seconds). The legend sits inside the axes and the margins are fixed, so the
    figure is rendered once (no tight layout pass)."""
    figure = _bare_figure()
    axis = figure.add_subplot()
    figure.subplots_adjust(left=0.09, right=0.98, bottom=0.11, top=0.92)
    axis.step(curve.x, curve.y, where="post", label=curve.label)
    if marks is not None and marks.x:
        axis.plot(marks.x, marks.y, "o", label=marks.label)
    if ideal is not None:
        axis.axhline(ideal, ls="--", lw=0.9, color="grey", label=f"unbounded cache ({ideal:.3f})")
    axis.set_xscale("log", base=2)
    axis.set_ylim(0, 1.02)
    axis.set_xlabel(xlabel)
    axis.set_ylabel("token hit rate (cached / prompt tokens)")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=_DPI)
    return path


def plot_tier_sweep(points: Sequence[TierPoint], path: Path, title: str, tier_name: str) -> Path:
    """Hit rate over all levels (left axis, 0..1) and, where estimated, TTFT p50 / p99 (right axis, ms)
    against the tier's size in blocks (linear: the sweep starts at 0, the tier off). Raises
    ``ModuleNotFoundError`` without matplotlib (the [plots] extra)."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7.5, 4.5))
    sizes = [p.tier_blocks for p in points]
    axis.plot(sizes, [p.total_hit_rate for p in points], marker="o", label="token hit rate, all levels")
    axis.plot(sizes, [p.token_hit_rates[0] for p in points], ls=":", color="grey", label="from the GPU")
    axis.set_ylim(0, 1.02)
    positive = [size for size in sizes if size > 0]
    if positive:  # 0 (the tier off) stays on the axis, the sizes above it spread out
        axis.set_xscale("symlog", linthresh=min(positive))
    axis.set_xlabel(f"{tier_name} tier size (blocks, log scale above {min(positive, default=0):,})")
    axis.set_ylabel("token hit rate (cached / prompt tokens)")
    axis.grid(alpha=0.3)
    handles, labels = axis.get_legend_handles_labels()
    if points and points[0].ttft_p50_ms is not None:
        other = axis.twinx()
        other.plot(
            sizes, [p.ttft_p50_ms for p in points], color="tab:red", marker=".", label="TTFT p50 (estimate)"
        )
        other.plot(
            sizes, [p.ttft_p99_ms for p in points], color="tab:red", ls="--", label="TTFT p99 (estimate)"
        )
        other.set_ylabel("TTFT estimate (ms)")
        other.set_ylim(bottom=0)
        more_handles, more_labels = other.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    axis.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    axis.set_title(title)
    return _save(figure, plt, path)
