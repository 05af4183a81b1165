"""What people look at first: ``kvbench report``'s page puts the summary table and the plots before
the per-request listings (folded) and the setup table; the titles of ``kvbench run``'s summary and
``kvbench explain``'s waterfall read whole at 80 columns. Real runs of the built-in model; the page
parsed in document order, as a browser lays it out."""

from html.parser import HTMLParser

import pytest
from rich.console import Console
from tiny_scenarios import SHARED_PREFIX

from kvbench.commands.run_tables import summary_table
from kvbench.results.files import load_result


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A cache-off and a cache-on run (8,192 blocks) of one 8-request trace."""
    from kvbench.cli import main

    folder = tmp_path_factory.mktemp("runs")
    scenario = folder / "tiny.toml"
    text = SHARED_PREFIX.replace("num_requests = 4", "num_requests = 8")
    scenario.write_text(text.replace('cache_size = "64"', 'cache_size = "8192"'))
    paths = {"off": folder / "off.parquet", "on": folder / "on.parquet"}
    for name, extra in (("off", ["--cache", "off"]), ("on", [])):
        try:
            main(["run", str(scenario), *extra, "--out", str(paths[name])])
        except SystemExit as exit_:
            assert exit_.code in (0, None)
    return paths


class _Outline(HTMLParser):
    """The page's headings and images in document order: ``("h2", text, folded)``, ``("img", alt,
    folded)``; folded: inside a ``<details>`` that is not open."""

    def __init__(self):
        super().__init__()
        self.items, self._folded, self._heading = [], [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "details":
            self._folded.append("open" not in attrs)
        elif tag == "h2":
            self._heading = ""
        elif tag == "img":
            self.items.append(("img", attrs.get("alt", ""), any(self._folded)))

    def handle_endtag(self, tag):
        if tag == "details":
            self._folded.pop()
        elif tag == "h2":
            self.items.append(("h2", self._heading, any(self._folded)))
            self._heading = None

    def handle_data(self, data):
        if self._heading is not None:
            self._heading += data


def test_the_page_shows_the_summary_and_plots_first(kvbench, runs, tmp_path):
    code, _, stderr = kvbench("report", runs["off"], runs["on"], "--explain", "--out", tmp_path / "r")
    assert code == 0, stderr
    outline = _Outline()
    outline.feed((tmp_path / "r" / "report.html").read_text(encoding="utf-8"))
    order = [(kind, text) for kind, text, _ in outline.items]
    position = {item: index for index, item in enumerate(order)}
    first_plots = ("img", "ttft_cdf_1"), ("img", "ttft_by_request_1")
    per_request = [item for item in outline.items if item[0] == "h2" and ": per request" in item[1]]
    assert [text for _, text, _ in per_request] == [  # the first request had nothing earlier to share
        f"explain: {name}: per request (the 7 that lost most)" for name in ("off", "on")
    ]
    assert order[0] == ("h2", "Runs")  # the summary heads the page
    assert all(position[plot] < position[("h2", text)] for plot in first_plots for _, text, _ in per_request)
    assert all(folded for _, _, folded in per_request)  # folded, each under its own title
    assert not any(folded for kind, _, folded in outline.items if kind == "img")  # every plot in view
    assert order[-1] == ("h2", "Setup")  # how each file was made: last


def _title_lines(table, width=80):
    console = Console(width=width, record=True)
    console.print(table)
    lines = console.export_text().splitlines()
    return [line.strip() for line in lines[: next(i for i, line in enumerate(lines) if line.startswith("┏"))]]


def test_the_run_title_reads_whole_at_80_columns(runs):
    for name, what in (
        ("on", "copy engine: hash cache of 8,192 blocks of 16"),
        ("off", "copy engine: prefix caching off"),
    ):
        result = load_result(runs[name])
        lines = _title_lines(summary_table(result.name, result.run, result.summary))
        assert lines == [f"kvbench run: {name}", f"inprocess, {result.run['model']}", what]
        assert all(line.count("(") == line.count(")") for line in lines)
    served = load_result(runs["on"])
    run = {
        **served.run,
        "backend": "openai",
        "base_url": "http://127.0.0.1:8000/v1",
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "hygiene": "per-run salt (cache_salt)",
    }
    lines = _title_lines(summary_table("chat", run, served.summary))
    assert lines == [
        "kvbench run: chat",
        "openai http://127.0.0.1:8000/v1",
        "meta-llama/Llama-3.1-8B-Instruct, hygiene per-run salt (cache_salt)",
    ]


def test_the_explain_title_reads_whole_at_80_columns(runs):
    from kvbench.commands.explain_tables import waterfall_table
    from kvbench.explain.sources import ExplainConfig, FixConfig, explain_and_fix

    explanation = explain_and_fix(ExplainConfig(runs["on"]), FixConfig()).explanation
    assert _title_lines(waterfall_table(explanation)) == [
        "kvbench explain: on (8 requests)",
        "copy engine: hash cache of 8,192 blocks of 16",
    ]
