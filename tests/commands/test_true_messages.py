"""Messages that say what happened (counts, overwrites, articles, shipped scenarios,
ratios of values shown as zero, no blank line before an error, and a duration-cut run)."""

import json

import pytest
from test_api_key_env import SCENARIO

from kvbench.results.compare import MetricRow
from kvbench.run.http_metrics import metrics_scope
from kvbench.run.scenario import shipped_scenarios
from kvbench.words import counted, with_article

SMALL = """
[workload]
kind = "multi-prefix"
num_prefixes = 2
prefix_tokens = 32
unique_tokens = 4
num_requests = 10

[cache]
block_size = 16

[sim]
sizes = [16]
"""


def test_counts_and_articles():
    assert [counted(1, "request"), counted(2_000, "request"), counted(1, "size")] == [
        "1 request",
        "2,000 requests",
        "1 size",
    ]
    assert [with_article("anthropic"), with_article("openai"), with_article("google")] == [
        "an anthropic",
        "an openai",
        "a google",
    ]


def test_a_ratio_of_values_shown_as_zero_is_not_shown():
    assert MetricRow("queue p50", 0.04, 0.031).cells() == ("queue p50", "0.0", "0.0", "-")
    assert MetricRow("ttft p50", 100.0, 77.0).cells()[3] == "0.77x"


def test_a_server_that_stopped_answering_metrics_is_not_a_server_without_counters():
    assert (
        metrics_scope(["text"], [None])[1]
        == "the server did not answer /metrics after the run (it stopped answering)"
    )
    assert metrics_scope(["a", "b"], ["a", "b"]) == ([0, 1], None)


def test_an_unknown_scenario_lists_the_shipped_ones(kvbench):
    code, _, err = kvbench("sim", "no_such_scenario")
    assert code == 2
    assert err.strip() == (
        "error: no_such_scenario: no such file or shipped scenario (shipped: "
        f"{', '.join(shipped_scenarios())})"
    )
    assert "shared_2k" in shipped_scenarios()


@pytest.mark.parametrize(
    "typed,suggested",
    [("shared2k", "shared_2k"), ("Shared-2K.toml", "shared_2k"), ("multiprefix_zipf", "multi_prefix_zipf")],
)
def test_a_mistyped_scenario_name_gets_the_closest_one_suggested(kvbench, typed, suggested):
    code, _, err = kvbench("run", typed)
    assert code == 2
    assert err.strip().endswith(f"; did you mean {suggested}?")


def test_a_server_flag_on_the_inprocess_backend_names_the_flag_to_add(kvbench, tmp_path):
    code, _, err = kvbench("run", "shared_2k", "--base-url", "http://127.0.0.1:1/v1")
    assert code == 2
    assert err.strip() == (
        "error: --base-url does not apply to --backend inprocess; "
        "it is a server's flag: add --backend openai (or anthropic)"
    )


def test_sim_says_when_requests_ran_out_and_when_it_replaced_a_file(kvbench, tmp_path):
    scenario, out = tmp_path / "small.toml", tmp_path / "sim.parquet"
    scenario.write_text(SMALL)
    code, stdout, err = kvbench("sim", scenario, "--requests", 1_000_000_000, "--out", out)
    assert code == 0, err
    assert "--requests 1,000,000,000: the source has only 10 requests; all of them were simulated" in err
    assert "replaced" not in stdout and "wrote 1 row to" in stdout  # one size: "1 row", not "1 rows"
    code, stdout, _ = kvbench("sim", scenario, "--out", out)
    assert code == 0 and "(replaced the file that was there)" in " ".join(stdout.split())


def test_trace_import_says_when_it_replaced_a_file(kvbench, tmp_path):
    source, out = tmp_path / "p.jsonl", tmp_path / "t.jsonl"
    source.write_text(json.dumps({"prompt": "hello there"}) + "\n")
    for replaced in (False, True):
        code, stdout, err = kvbench("trace", "import", "jsonl", source, "-o", out)
        assert code == 0, err
        words = " ".join(stdout.split())
        assert words.startswith("imported 1 request (1 session,")
        assert ("(replaced the file that was there)" in words) is replaced


def test_bill_says_an_anthropic_model(kvbench):
    code, _, err = kvbench("bill", "shared_2k", "--provider", "anthropic", "--model", "nope")
    assert code == 2 and "'nope' is not an anthropic model" in err


@pytest.mark.server
def test_a_duration_cut_run_does_not_say_all_requests_ran_and_errors_start_at_once(kvbench, server, tmp_path):
    scenario = tmp_path / "s.toml"
    scenario.write_text(SCENARIO.format(url=server.url).replace("num_requests = 2", "num_requests = 3"))
    code, stdout, err = kvbench(
        "run",
        scenario,
        "--requests",
        50,
        "--duration",
        "0.01",
        "--no-preflight",
        "--out",
        tmp_path / "r.parquet",
    )
    assert code == 0, err
    assert "--requests 50: the source has only 3 requests; 1 of them were run before sending stopped" in err
    assert "wrote 1 row to" in stdout
    code, _, err = kvbench("run", scenario, "--base-url", "http://127.0.0.1:9/v1")
    assert code == 2 and err.startswith("error: cannot reach the server")  # no blank line first
