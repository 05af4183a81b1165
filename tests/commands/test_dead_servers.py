"""End to end: a dead replica beside a real ``kvbench serve`` is ejected and its requests
served elsewhere, the /metrics delta says which replica it covers; a run with unsent requests is
marked incomplete."""

import pyarrow.parquet as pq
import pytest
from test_api_key_env import SCENARIO

from kvbench.results.parquet import read_metadata

pytestmark = [pytest.mark.server]


def scenario(tmp_path, url, num_requests):
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.format(url=url).replace("num_requests = 2", f"num_requests = {num_requests}"))
    return path


def test_a_dead_replica_is_ejected_and_the_metrics_delta_says_what_it_covers(
    kvbench, server, tmp_path, refused_url
):
    out = tmp_path / "r.parquet"
    code, stdout, err = kvbench(
        "run",
        scenario(tmp_path, server.url, 10),
        "--base-url",
        server.url,
        "--base-url",
        refused_url,
        "--no-preflight",
        "--out",
        out,
    )
    assert code == 0, err
    rows = pq.read_table(out).to_pylist()
    assert [r["status"] for r in rows] == ["ok"] * 10 and {r["replica"] for r in rows} == {0}
    assert sum(r["num_retries"] for r in rows) == 3  # three tries at replica 1, then it is ejected
    assert "replica 1 ejected after 3 consecutive connection failures" in err
    metadata = read_metadata(out)
    scope = "covers replica 0 only: replica 1 did not answer /metrics before and after the run"
    assert metadata["reconciliation"]["metrics_scope"] == scope and "covers" in stdout  # (the table wraps it)
    assert metadata["reconciliation"]["metrics_family"] is not None  # replica 0's counters, labelled
    assert metadata["run"]["ejected_replicas"] == [1] and metadata["complete"] is True


def test_a_run_whose_server_is_gone_is_marked_incomplete(kvbench, tmp_path, refused_url):
    out = tmp_path / "r.parquet"
    code, stdout, err = kvbench("run", scenario(tmp_path, refused_url, 8), "--model", "m", "--out", out)
    assert code == 1
    rows = pq.read_table(out).to_pylist()
    # after 5 consecutive connection failures
    assert sum(r["error"].startswith("not sent") for r in rows) == 3
    metadata = read_metadata(out)
    assert metadata["complete"] is False and metadata["run"]["num_unsent"] == 3
    assert "3 request(s) were never sent" in err
    assert "the server did not answer /metrics before the run" in " ".join(stdout.split())
