"""``kvbench report``: result files read back by kind, valid PNG plots, one self-contained HTML page."""

import re
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvbench.errors import InputError
from kvbench.results.files import load_result, load_results, split_ttft
from kvbench.results.parquet import write_rows
from kvbench.results.report import build_report, summary_tables
from kvbench.results.rows import rows_from_dicts
from kvbench.results.schema import RUN_SCHEMA, empty_row
from kvbench.results.summary import summarize
from kvbench.results.sweep import SweepPoint, build_sweep_summary, write_sweep_summary

SHARED_HASH = "sha256:" + "a1" * 32
CHAT_HASH = "sha256:" + "c3" * 32
MACHINE = {"cpu": "Test CPU", "cores": 2, "os": "Linux", "gpu": None}


def write_run(path, *, enabled, content_hash=SHARED_HASH, scenario="shared_2k", num_requests=30, num_turns=1):
    """A synthetic run file of the shape ``kvbench run`` writes: full prefill ~1,300 ms, cached ~100 ms."""
    rng = np.random.default_rng(len(str(path)))
    rows = []
    for index in range(num_requests):
        turn = index % num_turns
        prompt = 2063 + 200 * turn
        cached = 2000 + 200 * turn if enabled and index else 0
        ttft = 100 + 1200 * (1 - cached / prompt) + rng.normal(0, 3)
        row = empty_row()
        row.update(
            run_id=path.stem,
            request_index=index,
            request_id=f"q{index}",
            session_id=f"s{index // num_turns}",
            turn=turn,
            phase="measure",
            backend="inprocess",
            model="tiny",
            cache_enabled=enabled,
            cache_kind="hash",
            block_size=16,
            prompt_tokens=prompt,
            cached_prompt_tokens=cached,
            output_tokens=8,
            ttft_ms=ttft,
            tpot_ms=50.0,
            e2e_ms=ttft + 350.0,
            itl_ms=[50.0] * 7,
            status="ok",
        )
        rows.append(row)
    metadata = run_metadata(path.stem, rows, enabled=enabled, content_hash=content_hash, scenario=scenario)
    return write_rows(path, rows, metadata, schema=RUN_SCHEMA)


def run_metadata(run_id, rows, *, enabled, content_hash, scenario):
    """The metadata ``kvbench run`` writes beside ``rows``: command, machine, summary and run config."""
    return {
        "command": "run",
        "machine": MACHINE,
        "complete": True,
        "summary": summarize(rows_from_dicts(rows)).as_dict(),
        "run": {
            "run_id": run_id,
            "backend": "inprocess",
            "model": "tiny",
            "scenario": scenario,
            "trace": {
                "path": f"{scenario}.jsonl",
                "content_hash": content_hash,
                "generator": None,
                "params": {},
            },
            "cache": {
                "enabled": enabled,
                "kind": "hash",
                "block_size": 16,
                "capacity_blocks": 1024,
                "ttl_s": None,
                "release_order": "tail-first",
                "hash_algo": "sha256",
                "hash_bits": None,
            },
            "max_tokens": 8,
            "concurrency": 1,
            "seed": 0,
        },
    }


def write_sim(path):
    rows = [
        {
            "capacity_blocks": c,
            "release_order": "tail-first",
            "cache_kind": "hash",
            "block_size": 16,
            "token_hit_rate": h,
            "block_hit_rate": h,
            "evictions": 0,
        }
        for c, h in ((64, 0.1), (256, 0.5), (1024, 0.9))
    ]
    return write_rows(
        path,
        rows,
        {
            "command": "sim",
            "ideal_token_hit_rate": 0.95,
            "source": {"scenario": "scenarios/multi_prefix_zipf.toml"},
        },
    )


def write_sweep(path):
    points = [
        SweepPoint(c, h, 100 + 1200 * (1 - h), f"run-{c}.parquet", num_requests=30)
        for c, h in ((64, 0.1), (256, 0.5), (1024, 0.95))
    ]
    return write_sweep_summary(path, build_sweep_summary(points, {"scenario": "shared_2k"}))


def png_size(path):
    """(width, height) from a PNG's IHDR chunk; fails unless the file starts like a PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("results")
    return [
        write_run(folder / "off.parquet", enabled=False),
        write_run(folder / "on.parquet", enabled=True),
        write_run(
            folder / "chat.parquet", enabled=True, content_hash=CHAT_HASH, scenario="chat", num_turns=4
        ),
        write_sim(folder / "sim.parquet"),
        write_sweep(folder / "sweep.parquet"),
    ]


@pytest.fixture(scope="module")
def report(inputs, tmp_path_factory):
    return build_report(load_results(inputs), tmp_path_factory.mktemp("report"), "test report")


def test_files_are_read_by_kind(inputs):
    kinds = [load_result(path).kind for path in inputs]
    assert kinds == ["run", "run", "run", "sim", "sweep"]
    on = load_result(inputs[1])
    assert (
        on.cache_enabled
        and on.content_hash == SHARED_HASH
        and on.label == "on (copy engine: hash cache of 1,024 blocks of 16)"
    )


def test_plots_are_valid_pngs_of_non_trivial_size(report):
    names = sorted(figure.path.name for figure in report.figures)
    assert names == sorted(
        [
            "hit_rate_vs_cache_size.png",
            "ttft_vs_hit_rate_sweep1.png",
            "ttft_vs_hit_rate_runs1.png",
            "ttft_cdf_1.png",
            "ttft_by_request_1.png",
            "ttft_cdf_2.png",
            "ttft_by_request_2.png",
            "cached_tokens_per_turn_2.png",
        ]
    )
    for figure in report.figures:
        width, height = png_size(figure.path)
        assert width >= 600 and height >= 400
        assert figure.path.stat().st_size > 15_000  # axes, labels and curves, not a blank canvas
        assert figure.caption


def test_html_page_embeds_every_plot(report):
    page = report.html_path.read_text()
    embedded = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(embedded) == len(report.figures)
    assert not re.search(r"src='(?!data:)", page)  # nothing loaded from elsewhere: one self-contained file
    assert "<title>test report</title>" in page and "TTFT p50 (ms)" in page


def test_run_table_shows_the_runs_own_numbers(inputs):
    results = load_results(inputs[:2])
    (table,) = summary_tables(results)
    p50_row = next(row for row in table.rows if row[0] == "TTFT p50 (ms)")
    for cell, result in zip(p50_row[1:], results):
        assert cell == f"{result.metadata['summary']['p50_ttft_ms']:,.1f}"
    assert table.columns == ("", "off", "on")


def test_split_ttft_keeps_the_cold_request_apart_like_summarize(inputs):
    result = load_result(inputs[1])
    split = split_ttft(result.rows)
    assert split.cold == (0, result.rows[0].ttft_ms)
    assert len(split.warm_ms) == result.summary.num_requests - 1
    assert np.percentile(split.warm_ms, 50) == pytest.approx(result.summary.p50_ttft_ms)


def test_bad_inputs_are_one_line_input_errors(tmp_path):
    (tmp_path / "text.parquet").write_text("not parquet")
    pq.write_table(pa.table({"x": [1]}), tmp_path / "plain.parquet")
    write_rows(tmp_path / "other.parquet", [{"x": 1}], {"command": "memory"})
    write_rows(tmp_path / "thin.parquet", [{"request_index": 0}], {"command": "run"})
    for name, problem in (
        ("missing.parquet", "no such file"),
        ("text.parquet", "not a readable Parquet"),
        ("plain.parquet", "without kvbench metadata"),
        ("other.parquet", "'memory'"),
        ("thin.parquet", "without the column"),
    ):
        with pytest.raises(InputError, match=problem):
            load_result(tmp_path / name)
    with pytest.raises(InputError, match="is a folder"):
        load_result(tmp_path)


def test_cli_report_writes_the_page(inputs, tmp_path, kvbench):
    code, out, _ = kvbench("report", inputs[3], inputs[4], "--out", tmp_path / "page")
    assert code == 0
    assert (tmp_path / "page" / "report.html").exists() and "wrote 2 plots" in out
    assert "Engine sweep: shared_2k" in out and "R^2" in out


def test_cli_report_bad_file_exits_2_with_one_line(tmp_path, kvbench):
    code, _, err = kvbench("report", tmp_path / "nope.parquet")
    assert code == 2
    assert err.strip().count("\n") == 0 and "no such file" in err


def test_what_ran_in_words():
    from kvbench.results.what_ran import what_ran

    def named(run, **rest):
        return what_ran({"run": run, **rest}).describe(detail=True)

    assert named({"cache": {"enabled": False}}) == "copy engine: prefix caching off"
    assert named({"backend": "openai", "cache": {"enabled": None, "block_size": 32}}) == (
        "server: its own cache (32-token blocks expected)"
    )
    cache = {"enabled": True, "kind": "hash", "block_size": 16, "capacity_blocks": 1024, "ttl_s": 300}
    assert named({"cache": cache}) == "copy engine: hash cache of 1,024 blocks of 16, TTL 300 s"
    served = {
        "block size": "16 (assumed: vLLM's default; the server publishes none)",
        "prefix caching": "assumed on",
    }
    assert named(
        {"backend": "openai"}, server_cache={**served, "pool": "20 blocks (flag --expected-cache-size)"}
    ) == ("server: hash cache of 20 blocks of 16 (given)")
    assert named({"backend": "openai"}, server_cache={**served, "pool": "unbounded (assumed: no size)"}) == (
        "server: cache of unknown size, blocks of 16 (assumed)"
    )


def test_an_http_runs_cache_is_the_servers_not_off(tmp_path):
    from kvbench.results.files import load_result
    from kvbench.results.parquet import write_rows

    row = empty_row()
    row.update(
        request_index=0,
        phase="measure",
        status="ok",
        turn=0,
        prompt_tokens=10,
        cached_prompt_tokens=0,
        ttft_ms=5.0,
        backend="openai",
        cache_enabled=None,
    )
    path = write_rows(
        tmp_path / "http.parquet",
        [row],
        {"command": "run", "run": {"backend": "openai", "cache": {"enabled": None}}},
        RUN_SCHEMA,
    )
    result = load_result(path)
    assert (
        result.cache_enabled is None
        and result.label == "http (server: its own cache (?-token blocks expected))"
    )
