"""Report plots read as a user sees them: the figure objects are kept as they are
saved and checked for units on the axes, legends away from the data, tick labels apart and colours
that tell series apart; the HTML page says how each file was made."""

import numpy as np
import pytest

from kvbench.results import plots
from kvbench.results.files import load_results
from kvbench.results.parquet import record_command_line, write_rows
from kvbench.results.report import build_report, short_names
from kvbench.results.rows import rows_from_dicts
from kvbench.results.schema import RUN_SCHEMA, empty_row
from kvbench.results.summary import summarize
from kvbench.results.sweep import Fit, SweepPoint, build_sweep_summary, write_sweep_summary


@pytest.fixture
def figures(monkeypatch):
    """Every figure the plot functions save, by file name, drawn (so window extents are final)."""
    kept = {}
    original = plots._save

    def keep(figure, plt, path):
        result = original(figure, plt, path)
        figure.canvas.draw()
        kept[path.name] = figure
        return result

    monkeypatch.setattr(plots, "_save", keep)
    return kept


def _sim(path, name, capacities, ideal):
    rows = [
        {
            "capacity_blocks": c,
            "release_order": "tail-first",
            "cache_kind": "hash",
            "block_size": 16,
            "token_hit_rate": min(ideal, c / 5000),
            "block_hit_rate": 0.5,
            "evictions": 0,
        }
        for c in capacities
    ]
    return write_rows(
        path, rows, {"command": "sim", "ideal_token_hit_rate": ideal, "source": {"scenario": name}}
    )


def _sweep(path, block_size, hits=(0.1, 0.5, 0.95)):
    points = [
        SweepPoint(8 * 4**i, h, 100 + 1200 * (1 - h), f"run-{i}.parquet", num_requests=30)
        for i, h in enumerate(hits)
    ]
    context = {"scenario": "shared_2k", "cache": {"block_size": block_size}}
    return write_sweep_summary(path, build_sweep_summary(points, context))


def _run(path, enabled, num_warmup=0):
    rows = []
    for index in range(20):
        cached = 2000 if enabled and index else 0
        row = empty_row()
        row.update(
            run_id=path.stem,
            request_index=index,
            request_id=f"q{index}",
            session_id=f"s{index}",
            turn=0,
            phase="warmup" if index < num_warmup else "measure",
            backend="inprocess",
            model="tiny",
            cache_enabled=enabled,
            cache_kind="hash",
            block_size=16,
            prompt_tokens=2063,
            cached_prompt_tokens=cached,
            output_tokens=8,
            ttft_ms=100 + 1200 * (1 - cached / 2063) + index % 3,
            tpot_ms=50.0,
            e2e_ms=500.0,
            itl_ms=[50.0] * 7,
            status="ok",
        )
        rows.append(row)
    metadata = {
        "command": "run",
        "complete": True,
        "summary": summarize(rows_from_dicts(rows)).as_dict(),
        "run": {
            "run_id": path.stem,
            "backend": "inprocess",
            "model": "tiny",
            "scenario": "shared_2k",
            "trace": {"path": "shared_2k.jsonl", "content_hash": "sha256:" + "a1" * 32},
            "cache": {"enabled": enabled, "block_size": 16, "capacity_blocks": 1024},
            "max_tokens": 8,
            "concurrency": 3,
            "seed": 7,
        },
    }
    return write_rows(path, rows, metadata, schema=RUN_SCHEMA)


def _overlaps(a, b):
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _points_px(axis):
    return np.concatenate(
        [
            axis.transData.transform(np.column_stack(line.get_data()))
            for line in axis.get_lines()
            if len(line.get_xdata()) and not line.get_linestyle() == "--"
        ]
    )


def test_hit_rate_plot_puts_both_block_sizes_on_one_token_axis(tmp_path, figures):
    inputs = [
        _sim(tmp_path / "mooncake.parquet", "mooncake", (250, 500, 1000, 1024, 2000, 4096), 0.91),
        _sim(tmp_path / "zipf.parquet", "zipf", (64, 256, 1000, 1024), 0.82),
        _sweep(tmp_path / "sweep.parquet", 512),
    ]
    build_report(load_results(inputs), tmp_path / "out")
    figure = figures["hit_rate_vs_cache_size.png"]
    axis = figure.axes[0]
    assert "tokens" in axis.get_xlabel()
    lines = {line.get_label(): line for line in axis.get_lines()}
    sweep = lines["shared_2k engine sweep (512-token blocks)"]
    assert list(sweep.get_xdata()) == [8 * 512, 32 * 512, 128 * 512]  # blocks x 512, not blocks
    assert list(lines["zipf sim (16-token blocks)"].get_xdata()) == [64 * 16, 256 * 16, 1000 * 16, 1024 * 16]
    # two unbounded lines, each dashed in its own series' colour
    ideal_m, ideal_z = (
        lines[f"{name} sim (16-token blocks): unbounded cache ({v:.3f})"]
        for name, v in (("mooncake", 0.91), ("zipf", 0.82))
    )
    assert ideal_m.get_color() == lines["mooncake sim (16-token blocks)"].get_color()
    assert ideal_z.get_color() == lines["zipf sim (16-token blocks)"].get_color()
    assert ideal_m.get_color() != ideal_z.get_color() and ideal_m.get_linestyle() == "--"
    # tick labels (1,000 x 16 and 1,024 x 16 both present) do not overlap
    labels = [t for t in axis.get_xticklabels() if t.get_text()]
    boxes = sorted((t.get_window_extent() for t in labels), key=lambda b: b.x0)
    assert len(boxes) >= 4 and all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:]))
    # the legend sits under the axes: it covers no point and no line
    legend = axis.get_legend().get_window_extent()
    assert legend.y1 <= axis.get_window_extent().y0


def test_spaced_ticks_drop_near_neighbours():
    assert plots.spaced_ticks([16_000, 16_384, 32_768, 64_000, 65_536]) == [16_000, 32_768, 64_000]
    assert len(plots.spaced_ticks([2.0**k for k in range(40)])) <= 12


def test_sweep_fit_legend_hides_no_point_and_two_points_draw_no_line(tmp_path, figures):
    build_report(
        load_results([_sweep(tmp_path / "a.parquet", 16), _sweep(tmp_path / "b.parquet", 16, (0.1, 0.6))]),
        tmp_path / "out",
    )
    for name in ("ttft_vs_hit_rate_sweep1.png", "ttft_vs_hit_rate_sweep2.png"):
        axis = figures[name].axes[0]
        legend = axis.get_legend().get_window_extent()
        markers = [line for line in axis.get_lines() if line.get_linestyle() == "None"]
        points = axis.transData.transform(np.column_stack(markers[0].get_data()))
        assert len(points) and not any(legend.contains(x, y) for x, y in points)
        assert legend.y1 <= axis.get_window_extent().y0
    two_point = [
        t.get_text() for t in figures["ttft_vs_hit_rate_sweep2.png"].axes[0].get_legend().get_texts()
    ]
    assert not any("fit" in t or "R^2" in t for t in two_point)  # a 2-point line is not meaningful: not drawn
    assert [line.get_linestyle() for line in figures["ttft_vs_hit_rate_sweep2.png"].axes[0].get_lines()] == [
        "None"
    ]
    three_point = figures["ttft_vs_hit_rate_sweep1.png"].axes[0].get_legend().get_texts()
    assert any(t.get_text().startswith("fit: ") and "R^2" in t.get_text() for t in three_point)


def test_ttft_by_request_with_two_runs_keeps_the_axes_full_height(tmp_path, figures):
    names = ["2026-12-01T10-11-12_shared_2k_run_aaaa", "2026-12-01T10-11-13_shared_2k_run_bbbb"]
    inputs = [
        _run(tmp_path / f"{name}.parquet", enabled, num_warmup=2)
        for name, enabled in zip(names, (False, True))
    ]
    build_report(load_results(inputs), tmp_path / "out")
    figure = figures["ttft_by_request_1.png"]
    axis = figure.axes[0]
    assert len(axis.get_legend().get_texts()) == 4  # measured + warm-up, per run
    position = axis.get_position()  # figure fractions; the legend squeezed them to 0.70 x 0.71 before
    assert position.height > 0.75 and position.width > 0.8
    legend = axis.get_legend().get_window_extent()
    assert legend.y1 <= axis.get_window_extent().y0
    assert not any(legend.contains(x, y) for x, y in _points_px(axis))


def test_run_headings_are_short_and_distinct():
    stamps = ["2026-12-01T10-11-12_shared_2k_run_aaaa", "2026-12-01T10-11-13_shared_2k_run_bbbb"]
    assert short_names(stamps) == ["aaaa", "bbbb"]
    assert short_names(["off", "on"]) == ["off", "on"]
    assert short_names(["x" * 30, "x" * 30]) == ["run 1", "run 2"]
    assert short_names(["sim", *stamps], fallback="file") == ["sim", "aaaa", "bbbb"]
    assert short_names(["2026-12-01T10-11-12_a_run_same", "2026-12-01T10-11-13_a_run_same"]) == [
        "2026-12-01T10-11-12",
        "2026-12-01T10-11-13",
    ]


def test_html_page_shows_setup_block_sizes_and_distinct_run_columns(tmp_path):
    record_command_line(["kvbench", "run", "shared_2k", "--concurrency", "3"])
    try:
        names = ["2026-12-01T10-11-12_shared_2k_run_aaaa", "2026-12-01T10-11-13_shared_2k_run_bbbb"]
        inputs = [_run(tmp_path / f"{n}.parquet", e) for n, e in zip(names, (False, True))]
    finally:
        record_command_line([])
    inputs.append(_sim(tmp_path / "zipf.parquet", "zipf", (64, 256), 0.82))
    report = build_report(load_results(inputs), tmp_path / "out")
    page = report.html_path.read_text()
    assert "<h2>Setup</h2>" in page and "kvbench run shared_2k --concurrency 3" in page
    assert "pyarrow " in page and "numpy " in page  # versions from the footer
    assert "concurrency 3" in page and "seed 7" in page  # the run's settings
    assert "cores" in page  # the machine
    runs = next(t for t in report.tables if t.title == "Runs")
    assert runs.columns == ("", "aaaa", "bbbb")
    assert f"aaaa = {names[0]}" in runs.caption
    sim = next(t for t in report.tables if t.title.startswith("Sim"))
    assert sim.columns[1] == "block size (tokens)" and [row[1] for row in sim.rows] == ["16", "16"]


def test_two_point_fit_label_and_caveat_agree():
    fit = Fit(a_ms=100.0, b_ms=1000.0, r_squared=1.0, num_points=2)
    assert fit.caveat is not None and "not meaningful" in fit.describe()


@pytest.mark.parametrize(
    ("fastest_ms", "slowest_ms"),
    [
        (15, 500),  # cache hits at ~15 ms, misses at 200-500 ms: 3x10^2 and 4x10^2 touched
        (15, 800),  # ... and overlapped
        (200, 500),  # a linear axis
        (1, 1000),
        (0.5, 50_000),  # six decades
    ],
)
def test_ttft_cdf_tick_labels_stand_apart(tmp_path, figures, fastest_ms, slowest_ms):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    misses = np.linspace(200 if slowest_ms < 1000 else fastest_ms, slowest_ms, 28)
    samples = {"cache off": misses.tolist(), "cache on": [fastest_ms, *misses[1:]]}
    plots.plot_ttft_cdf(samples, tmp_path / "cdf.png", "TTFT CDF")
    figure = figures["cdf.png"]
    FigureCanvasAgg(figure).draw()
    renderer = figure.canvas.get_renderer()
    axis = figure.axes[0]
    low, high = axis.get_xlim()
    labels = sorted(
        (
            (label.get_window_extent(renderer), label.get_text())
            for label in axis.xaxis.get_majorticklabels() + axis.xaxis.get_minorticklabels()
            if label.get_visible() and label.get_text() and low <= label.get_position()[0] <= high
        ),
        key=lambda item: item[0].x0,
    )
    assert len(labels) >= 3, [text for _, text in labels]
    gap_px = 0.5 * labels[0][0].height  # half a line's height between neighbours, at least
    for (left, left_text), (right, right_text) in zip(labels, labels[1:]):
        assert right.x0 - left.x1 >= gap_px, (left_text, right_text, right.x0 - left.x1)
    assert not any("times" in text or "^" in text for _, text in labels)  # plain ms, not 3x10^2
