"""``compare`` and ``report`` name each real run by what it measured (engine, caching on or off, pool,
detected or given, host tier), warn in one line when runs ran under different load, and draw no fit
line their caption calls not meaningful. Runs are real: the copy and paged engines on a tiny scenario,
and ``kvbench run --backend openai`` against a real ``kvbench serve`` with caching on and off."""

import pytest
from serve_process import ServeProcess
from tiny_scenarios import SHARED_PREFIX

from kvbench.results import plots
from kvbench.results.files import load_result, load_results
from kvbench.results.report import build_report

RUN = ("--requests", "3", "--max-tokens", "4")


def run(scenario, out, *flags):
    from kvbench.cli import main

    try:
        main(["run", str(scenario), *RUN, *flags, "--out", str(out)])
    except SystemExit as exit_:
        assert exit_.code in (0, None)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """off: copy engine, caching off; on: copy engine at concurrency 2; paged: a 64-block pool with a
    16-block host tier; served / served_off: a kvbench serve with a 20-block cache / caching off."""
    folder = tmp_path_factory.mktemp("runs")
    scenario = folder / "tiny.toml"
    scenario.write_text(SHARED_PREFIX)
    paths = {
        "off": run(scenario, folder / "off.parquet", "--cache", "off"),
        "on": run(scenario, folder / "on.parquet", "--concurrency", "2"),
        "paged": run(scenario, folder / "paged.parquet", "--engine", "paged", "--host-tier", "16"),
    }
    for name, serve_flags in (("served", ("--cache-size", "20")), ("served_off", ("--cache", "off"))):
        process = ServeProcess(*serve_flags)
        try:
            flags = ("--backend", "openai", "--base-url", process.url)
            paths[name] = run(scenario, folder / f"{name}.parquet", *flags)
        finally:
            process.stop()
    return paths


def test_each_run_is_named_by_what_it_measured(runs):
    labels = {name: load_result(path).label for name, path in runs.items()}
    assert labels == {
        "off": "off (copy engine: prefix caching off)",
        "on": "on (copy engine: hash cache of 64 blocks of 16)",
        "paged": "paged (paged engine: KV pool of 64 blocks of 16, host tier of 16 blocks)",
        "served": "served (server: hash cache of 20 blocks of 16 (detected))",
        "served_off": "served_off (server: prefix caching off (detected))",
    }


def test_compare_names_both_server_runs_apart_and_warns_of_no_load_difference(kvbench, runs):
    code, out, err = kvbench("compare", runs["served_off"], runs["served"])
    assert code == 0, err
    text = " ".join(out.split())
    assert "server: prefix caching off (detected))" in text
    assert "server: hash cache of 20 blocks of 16 (detected))" in text
    assert "ran under different load" not in err  # same flags, same requests


def test_compare_warns_in_one_line_when_the_load_differs(kvbench, runs):
    code, _, err = kvbench("compare", runs["off"], runs["on"])
    assert code == 0, err
    assert " ".join(err.split()) == (
        "warning: ran under different load: concurrency 1 (A) vs 2 (B): their latencies are not comparable"
    )


def test_report_names_runs_in_its_table_and_legends_and_draws_no_meaningless_fit(runs, tmp_path, monkeypatch):
    kept = {}
    original = plots._save

    def keep(figure, plt, path):
        kept[path.name] = figure
        return original(figure, plt, path)

    monkeypatch.setattr(plots, "_save", keep)
    report = build_report(load_results([runs["off"], runs["on"]]), tmp_path / "out")
    [table] = [t for t in report.tables if t.title == "Runs"]
    assert dict((row[0], row[1:]) for row in table.rows)["what ran"] == (
        "copy engine: prefix caching off",
        "copy engine: hash cache of 64 blocks of 16",
    )
    loads = [note for note in report.notes if "different load" in note]  # others: the machine's own load
    assert loads == [
        "runs of tiny: ran under different load: concurrency 1 (off) vs 2 (on): their latencies are not "
        "comparable"
    ]
    fit = next(f for f in report.figures if f.path.name == "ttft_vs_hit_rate_runs1.png")
    assert fit.caption.startswith("Runs of one trace: no line drawn, not meaningful: TTFT p50 = ")
    axis = kept["ttft_vs_hit_rate_runs1.png"].axes[0]
    assert [line.get_linestyle() for line in axis.get_lines()] == ["None"] * 2  # 2 points: no line
    assert [t.get_text() for t in axis.get_legend().get_texts()] == [
        "off (copy engine: prefix caching off)",
        "on (copy engine: hash cache of 64 blocks of 16)",
    ]
    cdf = kept["ttft_cdf_1.png"].axes[0]
    assert [t.get_text() for t in cdf.get_legend().get_texts()] == [
        "off (copy engine: prefix caching off) (n=2)",  # the warm measured requests (3, the cold one out)
        "on (copy engine: hash cache of 64 blocks of 16) (n=2)",
    ]
