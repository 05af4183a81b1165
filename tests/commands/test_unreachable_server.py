"""An unreachable or malformed --base-url gets the right one-line diagnosis, and a
run whose server is gone stops sending after a few connection failures."""

import pyarrow.parquet as pq
import pytest
from cli_and_rows import file_fixture
from tiny_workloads import tiny_shared_prefix

SCENARIO = tiny_shared_prefix(30)


scenario = file_fixture(SCENARIO, "thirty.toml")


@pytest.mark.parametrize(
    "url,needle",
    [
        ("notaurl", "--base-url 'notaurl': not an http:// or https:// URL"),
        ("ftp://x/v1", "--base-url 'ftp://x/v1'"),
        ("http:///v1", "with a host"),
    ],
)
def test_a_malformed_base_url_is_one_line_naming_the_flag(kvbench, scenario, tmp_path, url, needle):
    """Was: ``--base-url notaurl`` leaked a ValueError from urllib."""
    code, _, err = kvbench(
        "run", scenario, "--backend", "openai", "--base-url", url, "--out", tmp_path / "o.parquet"
    )
    assert code == 2 and needle in err and "ValueError" not in err and len(err.strip().splitlines()) == 1


def test_an_unreachable_server_says_cannot_reach(kvbench, scenario, tmp_path, refused_url):
    code, _, err = kvbench(
        "run", scenario, "--backend", "openai", "--base-url", refused_url, "--out", tmp_path / "o.parquet"
    )
    assert (
        code == 2
        and f"cannot reach the server at {refused_url}" in err
        and "--model NAME is needed" not in err
    )


def test_a_gone_server_costs_five_requests_and_the_rest_are_recorded_as_not_sent(
    kvbench, scenario, tmp_path, refused_url
):
    """Was: every remaining request was fired into connection errors."""
    out = tmp_path / "gone.parquet"
    code, stdout, err = kvbench(
        "run", scenario, "--backend", "openai", "--base-url", refused_url, "--model", "m", "--out", out
    )
    rows = pq.read_table(out).to_pylist()
    assert code == 1 and len(rows) == 30 and all(r["status"] == "error" for r in rows)
    sent = [r for r in rows if r["sent_ms"] is not None]
    assert len(sent) == 5 and all(r["error"].startswith("connection error") for r in sent)
    assert all(
        r["error"].startswith("not sent: the send loop stopped after 5 consecutive connection failures")
        for r in rows
        if r["sent_ms"] is None
    )
    assert "not sent x25" in stdout and "connection error x5" in stdout
