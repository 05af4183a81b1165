"""``kvbench explain`` end to end: a scenario, a trace, --lint, a PNG, bad input, and the Parquet of
a run on the in-process engine and against a real ``kvbench serve``."""

from browser import assert_renders_in_chromium
from cli_and_rows import file_fixture
from tiny_scenarios import PROMPT_TOKENS, SHARED_BLOCK_TOKENS
from tiny_scenarios import SHARED_PREFIX as SCENARIO

scenario = file_fixture(SCENARIO, "tiny.toml")


def waterfall_line(stdout, label):
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and cells[0].startswith(label):
            return cells
    raise AssertionError(f"no waterfall row {label!r} in:\n{stdout}")


def test_explain_a_scenario_prints_a_waterfall_that_sums_and_writes_a_png(kvbench, scenario, tmp_path):
    code, stdout, stderr = kvbench("explain", scenario, "--png", tmp_path / "w.png")
    assert code == 0, stderr
    total = 4 * PROMPT_TOKENS
    assert waterfall_line(stdout, "prompt tokens") == ["prompt tokens", f"{total}", "100.00%", f"{total}"]
    assert waterfall_line(stdout, "hit")[1] == f"{3 * SHARED_BLOCK_TOKENS}"
    floor = int(waterfall_line(stdout, "lost to partial blocks")[1])  # >= 72 shared tokens, 64 in full blocks
    assert floor % 3 == 0 and 3 * (72 - SHARED_BLOCK_TOKENS) <= floor < 3 * 16
    assert int(waterfall_line(stdout, "an ideal cache could hit")[1]) == 3 * SHARED_BLOCK_TOKENS + floor
    assert "new message" in stdout and (tmp_path / "w.png").stat().st_size > 10_000


def test_explain_lint_and_bad_input(kvbench, scenario, tmp_path):
    code, stdout, stderr = kvbench("explain", scenario, "--lint")
    assert code == 0, stderr
    assert "later turns that resend the previous prompt whole" in stdout
    code, _, stderr = kvbench("explain", scenario, "--cache-size", "2GiB")
    assert code == 2 and "--cache-size 2GiB: explain takes a number of blocks" in stderr
    assert len(stderr.strip().splitlines()) == 1
    code, _, stderr = kvbench("explain", tmp_path / "missing.jsonl")
    assert code == 2 and "no such file" in stderr
    code, _, stderr = kvbench("explain", scenario, "--min-cacheable-tokens", "0")
    assert code == 2 and "--min-cacheable-tokens" in stderr


def test_explain_the_parquet_of_an_engine_run_and_of_a_served_run(kvbench, server, scenario, tmp_path):
    for args, name in (((), "here"), (("--backend", "openai", "--base-url", server.url), "http")):
        code, _, stderr = kvbench("run", scenario, *args, "--out", tmp_path / f"{name}.parquet")
        assert code == 0, stderr
        code, stdout, stderr = kvbench("explain", tmp_path / f"{name}.parquet")
        assert code == 0, stderr
        # reported = what the cache allows
        assert waterfall_line(stdout, "hit")[1] == f"{3 * SHARED_BLOCK_TOKENS}"
        assert waterfall_line(stdout, "lost to the server")[1] == "0"
    code, _, stderr = kvbench("report", tmp_path / "here.parquet", "--explain", "--out", tmp_path / "report")
    assert code == 0, stderr
    page = (tmp_path / "report" / "report.html").read_text(encoding="utf-8")
    assert "explain: here: waterfall" in page and "explain: here: per request" in page
    assert "lost to capacity evictions" in page and "new message" in page and "‖" in page  # the excerpts
    assert page.count("data:image/png;base64,") >= 2 and (tmp_path / "report" / "explain-here.png").exists()
    # a real browser renders the page
    assert_renders_in_chromium((tmp_path / "report" / "report.html"), tmp_path)
    code, stdout, _ = kvbench("explain", tmp_path / "http.parquet", "--block-size", "8")
    assert code == 0  # with 8-token blocks the cache would allow 72 per request: the server reported less
    assert waterfall_line(stdout, "lost to the server")[1] == f"{3 * (72 - SHARED_BLOCK_TOKENS)}"
    assert "server reported less" in stdout
