"""``kvbench sim`` end to end: tables, Parquet read back, and one-line errors with exit code 2."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from cli_and_rows import one_error_line

from kvbench.results.parquet import read_metadata

REPO = Path(__file__).resolve().parents[2]

SMALL_SCENARIO = """
[workload]
kind = "multi-prefix"
num_prefixes = 4
prefix_tokens = 128
unique_tokens = 10
num_requests = 100
popularity = "zipf"

[cache]
block_size = 16

[sim]
sizes = [16, 64, 512]
"""


def write(path, text):
    path.write_text(text)
    return path


def test_sim_writes_one_row_per_size_and_order(kvbench, tmp_path):
    scenario = write(tmp_path / "small.toml", SMALL_SCENARIO)
    out = tmp_path / "sim.parquet"
    code, stdout, _ = kvbench("sim", scenario, "--release", "tail-first,head-first", "--out", out)
    assert code == 0
    assert "head-first" in stdout and "tail-first" in stdout and "ideal" in stdout
    table = pq.read_table(out).to_pylist()
    assert [(r["capacity_blocks"], r["release_order"]) for r in table] == [
        (16, "tail-first"),
        (16, "head-first"),
        (64, "tail-first"),
        (64, "head-first"),
        (512, "tail-first"),
        (512, "head-first"),
    ]
    for row in table:
        assert 0 <= row["token_hit_rate"] <= 1
        assert row["cached_prompt_tokens"] == round(row["token_hit_rate"] * row["prompt_tokens"])
    assert table[-1]["evictions"] == 0 and table[0]["evictions"] > 0
    metadata = read_metadata(out)
    assert metadata["command"] == "sim" and metadata["complete"] is True
    assert metadata["ideal_token_hit_rate"] == pytest.approx(table[-1]["token_hit_rate"])


def test_flags_override_the_scenario(kvbench, tmp_path):
    scenario = write(tmp_path / "small.toml", SMALL_SCENARIO)
    out = tmp_path / "sim.parquet"
    code, _, _ = kvbench(
        "sim", scenario, "--sizes", "32", "--block-size", "32", "--cache", "radix", "--out", out
    )
    assert code == 0
    (row,) = pq.read_table(out).to_pylist()
    assert (row["capacity_blocks"], row["block_size"], row["cache_kind"]) == (32, 32, "radix")


def test_sim_on_a_mooncake_trace(kvbench, tmp_path, shared_data):
    lines = (shared_data / "mooncake" / "conversation_trace.jsonl").read_text().splitlines()[:200]
    trace = write(tmp_path / "conv.jsonl", "\n".join(lines) + "\n")
    out = tmp_path / "moon.parquet"
    code, stdout, _ = kvbench("sim", trace, "--sizes", "100,100000", "--out", out)
    assert code == 0
    rows = pq.read_table(out).to_pylist()
    assert [r["block_size"] for r in rows] == [512, 512]
    assert rows[0]["token_hit_rate"] < rows[1]["token_hit_rate"]


def test_missing_file(kvbench, tmp_path):
    line = one_error_line(*kvbench("sim", tmp_path / "nope.toml")[::2])
    assert "nope.toml" in line and "no such file" in line


def test_malformed_trace_line_names_file_line_and_field(kvbench, tmp_path):
    good = {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}
    bad = {"timestamp": 0, "input_length": 10, "output_length": 1}
    trace = write(
        tmp_path / "t.jsonl", json.dumps(good) + "\n" + json.dumps(good) + "\n" + json.dumps(bad) + "\n"
    )
    line = one_error_line(*kvbench("sim", trace)[::2])
    assert f"{trace}:3: field 'hash_ids'" in line


def test_invalid_json_line(kvbench, tmp_path):
    good = {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}
    trace = write(tmp_path / "t.jsonl", json.dumps(good) + "\n{not json\n")
    line = one_error_line(*kvbench("sim", trace)[::2])
    assert f"{trace}:2:" in line and "JSON" in line


def test_unknown_scenario_key_names_the_line(kvbench, tmp_path):
    scenario = write(tmp_path / "s.toml", SMALL_SCENARIO.replace("num_requests = 100", "num_requestz = 100"))
    line = one_error_line(*kvbench("sim", scenario)[::2])
    assert f"{scenario}:7: field 'workload.num_requestz'" in line and "unknown key" in line


def test_bad_scenario_value_names_the_field(kvbench, tmp_path):
    scenario = write(tmp_path / "s.toml", SMALL_SCENARIO.replace("sizes = [16, 64, 512]", "sizes = [16, 0]"))
    line = one_error_line(*kvbench("sim", scenario)[::2])
    assert "field 'sim.sizes'" in line


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--sizes", "64,0"], "--sizes: 0"),
        (["--sizes", "-5"], "--sizes: -5"),
        (["--sizes", "abc"], "--sizes: 'abc'"),
        (["--release", "sideways"], "--release: 'sideways'"),
        (["--requests", "0"], "--requests: 0"),
        (["--block-size", "-16"], "--block-size: -16"),
        (["--hash-bits", "4"], "--hash-bits: must be between 8 and 256"),  # the flag, not the field hash_bits
        (["--cache", "radix", "--release", "head-first"], "head-first"),
    ],
)
def test_bad_flags(kvbench, tmp_path, args, needle):
    scenario = write(tmp_path / "small.toml", SMALL_SCENARIO)
    line = one_error_line(*kvbench("sim", scenario, *args)[::2])
    assert needle in line


def test_shipped_scenarios_load():
    from kvbench.run.scenario import load_scenario

    for name in ("multi_prefix_zipf", "multi_prefix_rr"):
        scenario = load_scenario(REPO / "scenarios" / f"{name}.toml")
        assert scenario.block_size == 16 and scenario.sim.sizes == (64, 128, 256, 512, 1024, 2048)
        assert scenario.workload.num_prefixes == 8 and scenario.workload.prefix_tokens == 2048
        assert scenario.workload.unique_tokens == 50 and scenario.workload.num_requests == 2000
    assert load_scenario(REPO / "scenarios" / "multi_prefix_zipf.toml").workload.zipf_exponent == 0.9


def test_version_and_usage_errors(kvbench, tmp_path):
    code, stdout, _ = kvbench("--version")
    assert code == 0 and stdout.startswith("kvbench ")
    code, _, stderr = kvbench("nosuch")
    assert code == 2 and "No such command" in stderr and "Traceback" not in stderr
    scenario = write(tmp_path / "small.toml", SMALL_SCENARIO)
    code, _, stderr = kvbench("sim", scenario, "--cache", "tree")
    assert code == 2 and "--cache" in stderr


def test_binary_trace_is_one_line(kvbench, tmp_path):
    trace = tmp_path / "bin.jsonl"
    trace.write_bytes(b"\xff\xfe\x00 not text")
    line = one_error_line(*kvbench("sim", trace)[::2])
    assert f"{trace}: not UTF-8 text" in line


def test_unwritable_out_is_refused_before_any_work(kvbench, tmp_path):
    scenario = write(tmp_path / "small.toml", SMALL_SCENARIO)
    line = one_error_line(*kvbench("sim", scenario, "--out", tmp_path)[::2])
    assert "is a folder" in line
    line = one_error_line(*kvbench("sim", scenario, "--out", scenario / "x.parquet")[::2])
    assert "is a file, not a folder" in line


def test_verify_tokens_in_the_scenario_reaches_the_cache(kvbench, tmp_path):
    """8-bit keys collide. Trusting them gives the exact hit rate on this workload (a chained lookup
    stops at its first miss, so no false hit survives here); with ``[cache] verify_tokens`` a key hit
    whose stored tokens differ is a miss, and keys taken by colliding blocks keep true blocks out, so
    the hit rate is lower. Before the fix the setting was parsed and dropped: both rates were equal."""
    from kvbench.run.scenario import load_scenario

    tiny = SMALL_SCENARIO.replace("block_size = 16", "block_size = 16\nhash_bits = 8")
    rates = {}
    for verify in (False, True):
        text = tiny.replace("hash_bits = 8", f"hash_bits = 8\nverify_tokens = {str(verify).lower()}")
        scenario = write(tmp_path / f"v{verify}.toml", text)
        cache = load_scenario(scenario).cache.cache_config(capacity_blocks=64, block_size=16)
        assert (cache.verify_tokens, cache.hash.hash_bits, cache.capacity_blocks) == (verify, 8, 64)
        out = tmp_path / f"v{verify}.parquet"
        code, _, stderr = kvbench("sim", scenario, "--sizes", "4096", "--out", out)
        assert code == 0, stderr
        (row,) = pq.read_table(out).to_pylist()
        rates[verify] = row["token_hit_rate"]
    exact = write(tmp_path / "exact.toml", SMALL_SCENARIO)
    out = tmp_path / "exact.parquet"
    assert kvbench("sim", exact, "--sizes", "4096", "--out", out)[0] == 0
    (row,) = pq.read_table(out).to_pylist()
    assert rates[False] == pytest.approx(row["token_hit_rate"])
    assert rates[True] < rates[False]


def test_shipped_scenarios_resolve_by_bare_name(kvbench, tmp_path):
    import importlib.resources

    from kvbench.run.scenario import find_scenario, shipped_scenarios

    assert {"shared_2k", "multi_prefix_zipf", "multi_prefix_rr", "chat", "agent"} <= set(shipped_scenarios())
    packaged = importlib.resources.files("kvbench") / "scenarios" / "multi_prefix_zipf.toml"
    assert packaged.is_file()
    assert find_scenario("multi_prefix_zipf") == Path(str(packaged))
    assert find_scenario("multi_prefix_zipf.toml") == Path(str(packaged))
    assert find_scenario(tmp_path / "nosuch") == tmp_path / "nosuch"
    assert (REPO / "scenarios" / "shared_2k.toml").read_text() == (
        importlib.resources.files("kvbench") / "scenarios" / "shared_2k.toml"
    ).read_text()
    code, stdout, stderr = kvbench(
        "sim", "multi_prefix_rr", "--sizes", "64", "--requests", "50", "--out", tmp_path / "rr.parquet"
    )
    assert code == 0, stderr
    assert "multi_prefix_rr (50 requests" in stdout


def test_every_shipped_scenario_loads_by_name_and_from_the_scenarios_link(shared_data, monkeypatch):
    # The Mooncake scenario names its trace relative to its own file; the file lies in
    # kvbench/scenarios/ behind the repo's scenarios/ link, so a relative path must resolve there.
    from kvbench.run.scenario import find_scenario, load_scenario, shipped_scenarios

    monkeypatch.chdir(REPO)
    names = shipped_scenarios()
    assert {"shared_2k", "chat", "agent", "multi_prefix_zipf", "mooncake_conversation"} <= set(names)
    for name in names:
        for spec in (name, f"scenarios/{name}.toml"):
            scenario = load_scenario(find_scenario(spec))
            assert scenario.workload_requests().requests, spec


def test_sim_writes_the_exact_curve_and_replay_agrees_at_every_size(kvbench, tmp_path):
    scenario = write(tmp_path / "small.toml", SMALL_SCENARIO)
    code, stdout, stderr = kvbench("sim", scenario, "--out", tmp_path / "auto.parquet")
    assert code == 0, stderr
    assert "exact curve (one pass)" in stdout
    curve = pq.read_table(tmp_path / "auto.curve.parquet").to_pylist()
    assert (tmp_path / "auto.curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {r["method"] for r in curve} == {"one-pass"} and curve[0]["capacity_blocks"] == 1
    hits = [r["hit_blocks"] for r in curve]
    assert hits == sorted(hits) and len(set(hits)) == len(hits)  # a row exactly where the count changes
    sizes = ",".join(str(r["capacity_blocks"]) for r in curve)
    code, _, stderr = kvbench(
        "sim", scenario, "--sizes", sizes, "--method", "replay", "--out", tmp_path / "r.parquet"
    )
    assert code == 0, stderr
    replayed = pq.read_table(tmp_path / "r.parquet").to_pylist()
    assert not (tmp_path / "r.curve.parquet").exists()
    assert [{**r, "method": None} for r in replayed] == [{**r, "method": None} for r in curve]
    assert read_metadata(tmp_path / "r.parquet")["methods"] == {"tail-first": "replay"}


def test_sim_head_first_in_one_pass_equals_its_replay(kvbench, tmp_path):
    """8 prefixes and 4 unique blocks per 12-block prompt: 4 blocks is a pass of its own (prompts cut
    to 4 blocks), 16, 64 and 512 share the uncut pass; head-first loses hits at 16 and 64."""
    scenario = write(
        tmp_path / "small.toml",
        SMALL_SCENARIO.replace("unique_tokens = 10", "unique_tokens = 64").replace(
            "num_prefixes = 4", "num_prefixes = 8"
        ),
    )
    rows, errors = {}, {}
    for method in ("auto", "replay"):
        out = tmp_path / f"{method}.parquet"
        code, _, errors[method] = kvbench(
            "sim",
            scenario,
            "--release",
            "tail-first,head-first",
            "--sizes",
            "4,16,64,512",
            "--method",
            method,
            "--out",
            out,
        )
        assert code == 0, errors[method]
        rows[method] = pq.read_table(out).to_pylist()
    assert "not exact" not in errors["auto"]
    assert read_metadata(tmp_path / "auto.parquet")["methods"] == {
        "tail-first": "one-pass",
        "head-first": "one-pass",
    }
    assert {r["method"] for r in rows["auto"]} == {"one-pass"} and {r["method"] for r in rows["replay"]} == {
        "replay"
    }
    assert [{**r, "method": None} for r in rows["auto"]] == [{**r, "method": None} for r in rows["replay"]]
    hits = {(r["capacity_blocks"], r["release_order"]): r["hit_blocks"] for r in rows["auto"]}
    assert (
        hits[(4, "head-first")] == hits[(4, "tail-first")]
        and hits[(512, "head-first")] == hits[(512, "tail-first")]
    )
    assert (
        hits[(16, "head-first")] < hits[(16, "tail-first")]
        and hits[(64, "head-first")] < hits[(64, "tail-first")]
    )


def test_sim_falls_back_to_the_replay_and_says_why(kvbench, tmp_path):
    scenario = write(tmp_path / "small.toml", SMALL_SCENARIO)
    code, stdout, stderr = kvbench("sim", scenario, "--ttl", "5", "--out", tmp_path / "ttl.parquet")
    assert code == 0, stderr
    assert "one-pass curve not exact" in stderr and "TTL" in stderr and "exact curve" not in stdout
    assert {r["method"] for r in pq.read_table(tmp_path / "ttl.parquet").to_pylist()} == {"replay"}
    line = one_error_line(*kvbench("sim", scenario, "--cache", "radix", "--method", "one-pass")[::2])
    assert "--method one-pass" in line and "radix" in line


def test_sim_ttl_curve_matches_replays_with_that_ttl(kvbench, tmp_path):
    """A Mooncake-format trace whose prefixes come back after 2 s, 5 s and 20 s (timestamps in ms)."""
    lines = []
    for start_ms, gap_ms, first_id in ((0, 2000, 100), (1000, 5000, 200), (2000, 20000, 300)):
        for turn in range(3):
            ids = [first_id, first_id + 1, first_id + 2, first_id + 10 + turn]
            lines.append(
                {
                    "timestamp": start_ms + turn * gap_ms,
                    "input_length": 4 * 512,
                    "output_length": 1,
                    "hash_ids": ids,
                }
            )
    lines.sort(key=lambda line: line["timestamp"])
    trace = write(tmp_path / "gaps.jsonl", "\n".join(json.dumps(line) for line in lines) + "\n")
    code, stdout, stderr = kvbench("sim", trace, "--ttl-curve", "--out", tmp_path / "t.parquet")
    assert code == 0, stderr
    assert "TTL keeping this share of the unbounded cache's hits: 50% 5 s, 90% 20 s" in stdout
    rows = pq.read_table(tmp_path / "t.ttl-curve.parquet").to_pylist()
    assert [(r["ttl_s"], r["hit_blocks"]) for r in rows] == [(2.0, 6), (5.0, 12), (20.0, 18)]
    assert (tmp_path / "t.ttl-curve.png").exists()
    for ttl, expected in ((1.9, 0), (4.0, 6), (19.0, 12), (60.0, 18)):
        code, _, stderr = kvbench(
            "sim", trace, "--ttl", str(ttl), "--sizes", "1000", "--out", tmp_path / "r.parquet"
        )
        assert code == 0, stderr
        (replayed,) = pq.read_table(tmp_path / "r.parquet").to_pylist()
        assert replayed["hit_blocks"] == expected


NO_ARRIVALS = "the trace has no arrival times: every request arrives at 0 s, so a TTL never expires"


def test_a_ttl_on_a_trace_without_arrival_times_warns(kvbench, tmp_path):
    scenario = write(tmp_path / "small.toml", SMALL_SCENARIO)  # a generated workload with no request rate
    code, _, stderr = kvbench("sim", scenario, "--ttl", "5", "--out", tmp_path / "ttl.parquet")
    assert code == 0 and [line for line in stderr.splitlines() if "warning" in line] == [
        f"warning: {NO_ARRIVALS} (--ttl)"
    ]
    assert {r["expirations"] for r in pq.read_table(tmp_path / "ttl.parquet").to_pylist()} == {0}
    code, _, stderr = kvbench("sim", scenario, "--ttl-curve", "--out", tmp_path / "curve.parquet")
    assert code == 0 and f"warning: {NO_ARRIVALS} (--ttl-curve)" in stderr
    code, _, stderr = kvbench("sim", scenario, "--out", tmp_path / "plain.parquet")
    assert code == 0 and "warning" not in stderr


def test_a_ttl_on_a_timed_trace_does_not_warn(kvbench, tmp_path, shared_data):
    lines = (shared_data / "mooncake" / "conversation_trace.jsonl").read_text().splitlines()[:200]
    trace = write(tmp_path / "conv.jsonl", "\n".join(lines) + "\n")
    code, _, stderr = kvbench(
        "sim", trace, "--ttl", "5", "--ttl-curve", "--sizes", "1000", "--out", tmp_path / "t.parquet"
    )
    assert code == 0 and "warning" not in stderr
