"""``kvbench route`` end to end: the table, the Parquet read back, the PNGs, and one-line errors."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_and_rows import file_fixture

from kvbench.results.parquet import read_metadata
from kvbench.route.service import ServiceModel, fit_service_model

SCENARIO = """
[workload]
kind = "chat"
num_conversations = 8
turns = "uniform:3,5"
system_tokens = 200
conversation_rate_per_s = 2.0
think_time_s = 2.0

[cache]
block_size = 16

[sim]
sizes = [64, 256, 4096]
"""


scenario = file_fixture(SCENARIO, "chat8.toml")


def test_route_all_policies_writes_one_row_per_policy(kvbench, scenario, tmp_path):
    out = tmp_path / "route.parquet"
    code, stdout, stderr = kvbench("route", scenario, "--replicas", 8, "--policy", "all", "--out", out)
    assert code == 0, stderr
    assert "8 replicas x 256 blocks of 16 tokens" in stdout  # the middle of [sim] sizes
    table = pq.read_table(out).to_pydict()
    assert table["policy"] == [
        "round-robin",
        "random",
        "least-loaded",
        "session",
        "prefix-hash",
        "cache-aware",
        "sglang_cache_aware",
        "vllm_cache_aware",
        "consistent_hash",
        "power_of_two",
        "kv_aware",
    ]
    # not a terminal: a status line as each policy finishes, in order
    assert [line.split()[1] for line in stderr.splitlines() if line.startswith("routed: ")] == table["policy"]
    assert "routed: kv_aware (11 of 11 policies)" in stderr
    rates = dict(zip(table["policy"], table["token_hit_rate"]))
    assert rates["session"] > 2 * rates["round-robin"] > 0
    assert rates["kv_aware"] > 2 * rates["round-robin"]  # it reads what each replica holds
    assert all(len(r) == 8 for r in table["replica_token_hit_rates"])
    assert all(sum(r) == table["num_requests"][0] for r in table["replica_requests"])
    assert table["requests_max_over_mean"][table["policy"].index("cache-aware")] == pytest.approx(8.0)
    assert {
        "median_ttft_ms",
        "p99_ttft_ms",
        "p99_queue_ms",
        "busy_max_over_mean",
        "prefix_copies_mean",
    } <= set(table)
    metadata = read_metadata(out)
    assert metadata["command"] == "route" and metadata["num_replicas"] == 8
    assert metadata["decisions"]["cache-aware"]["match"] > 0
    assert metadata["decisions"]["kv_aware"]["held prefix"] > 0
    for suffix in ("-policies.png", "-load.png"):
        assert (tmp_path / f"route{suffix}").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_route_one_policy_with_flags(kvbench, scenario, tmp_path):
    out = tmp_path / "one.parquet"
    code, _, stderr = kvbench(
        "route",
        scenario,
        "--replicas",
        2,
        "--policy",
        "session,least-loaded",
        "--capacity",
        32,
        "--prefill-ms-per-token",
        1.0,
        "--out",
        out,
    )
    assert code == 0, stderr
    assert pq.read_table(out).column("policy").to_pylist() == ["session", "least-loaded"]
    assert read_metadata(out)["service"]["prefill_ms_per_token"] == 1.0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--policy", "sticky"], "--policy: 'sticky' is not one of"),
        (["--replicas", "0"], "--replicas: 0 is not a positive number"),
        (["--capacity", "-1"], "--capacity: -1"),
        (["--prefill-base-ms", "-5"], "--prefill-base-ms: -5.0"),
        (["--cache-threshold", "2"], "--cache-threshold: must be in [0, 1], got 2.0"),
        (["--epsilon", "0"], "--epsilon: must be positive"),
        (["--policy", "kv_aware", "--cache", "radix"], "--policy kv_aware: reads each replica's cache"),
    ],
)
def test_route_bad_input_is_one_line(kvbench, scenario, tmp_path, args, message):
    code, _, stderr = kvbench("route", scenario, "--out", tmp_path / "x.parquet", *args)
    assert code == 2 and message in stderr and "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_fit_recovers_a_linear_prefill_model(tmp_path, kvbench):
    prompt, cached = [100, 200, 400, 800, 800], [0, 100, 0, 400, 0]
    ttft = [12.0 + 0.25 * (p - c) for p, c in zip(prompt, cached)]
    path = tmp_path / "run.parquet"
    pq.write_table(
        pa.table(
            {
                "prompt_tokens": prompt,
                "cached_prompt_tokens": cached,
                "ttft_ms": ttft,
                "tpot_ms": [30.0, 31.0, 29.0, 30.0, None],
                "status": ["ok"] * 5,
                "phase": ["measure"] * 5,
            }
        ),
        path,
    )
    model = fit_service_model(path)
    assert model.prefill_base_ms == pytest.approx(12.0) and model.prefill_ms_per_token == pytest.approx(0.25)
    assert model.decode_ms_per_token == pytest.approx(30.0)
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    code, _, stderr = kvbench("route", tmp_path / "nope.toml", "--fit", bad)
    assert code == 2 and "--fit" in stderr


def test_service_model_is_validated():
    with pytest.raises(ValueError, match="decode_ms_per_token"):
        ServiceModel(decode_ms_per_token=-1.0)
