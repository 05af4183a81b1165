"""``kvbench sim --sample-rate / --sample-keys`` end to end: the sampled curve's table and Parquet file
(read back, against the exact curve's), and one-line errors."""

from pathlib import Path

import pyarrow.parquet as pq
from cli_and_rows import one_error_line

from kvbench.results.parquet import read_metadata

REPO = Path(__file__).resolve().parents[2]


def mooncake_head(shared_data, tmp_path, num_lines=2000):
    lines = (shared_data / "mooncake" / "conversation_trace.jsonl").read_text().splitlines()[:num_lines]
    trace = tmp_path / "conv.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    return trace


def test_a_key_budget_above_the_trace_gives_the_exact_curve(kvbench, tmp_path, shared_data):
    trace = mooncake_head(shared_data, tmp_path)
    code, _, _ = kvbench("sim", trace, "--out", tmp_path / "exact.parquet")
    assert code == 0
    code, stdout, _ = kvbench(
        "sim", trace, "--sample-keys", "1000000", "--sizes", "100,1000", "--out", tmp_path / "sampled.parquet"
    )
    assert code == 0
    assert "kvbench sim (sampled)" in stdout and "rate 1 (first blocks 1)," in stdout
    exact = {
        r["capacity_blocks"]: r["token_hit_rate"]
        for r in pq.read_table(tmp_path / "exact.curve.parquet").to_pylist()
    }
    sampled = pq.read_table(tmp_path / "sampled.sampled-curve.parquet").to_pylist()
    assert len(sampled) > 100 and {r["method"] for r in sampled} == {"sampled"}
    sizes = sorted(exact)
    for row in sampled:  # the exact curve is a step function: its value at a size is the last change point's
        at = max((s for s in sizes if s <= row["capacity_blocks"]), default=None)
        assert row["token_hit_rate"] == (exact[at] if at is not None else 0.0)
    metadata = read_metadata(tmp_path / "sampled.sampled-curve.parquet")
    assert (
        metadata["sample_rate"] == 1.0 and metadata["num_requests"] == 2000 and metadata["hit_rate_sd"] == 0.0
    )


def test_the_sampled_run_writes_the_table_at_sizes_in_the_exact_columns(kvbench, tmp_path, shared_data):
    """--out holds the estimates at --sizes (as the exact path's file does), not only the curve beside it."""
    from kvbench.results.files import load_result
    from kvbench.results.report import sim_table

    trace = mooncake_head(shared_data, tmp_path)
    sizes = ("--sizes", "100,1000,5000")
    assert kvbench("sim", trace, *sizes, "--out", tmp_path / "exact.parquet")[0] == 0
    code, stdout, _ = kvbench(
        "sim", trace, "--sample-keys", "1000000", *sizes, "--out", tmp_path / "sampled.parquet"
    )
    assert code == 0 and "wrote 3 rows to" in stdout
    exact, sampled = (pq.read_table(tmp_path / f"{name}.parquet") for name in ("exact", "sampled"))
    assert sampled.column_names == exact.column_names
    for want, got in zip(exact.to_pylist(), sampled.to_pylist()):  # a budget above the trace: rate 1, exact
        for key in (
            "capacity_blocks",
            "block_size",
            "num_requests",
            "prompt_tokens",
            "cached_prompt_tokens",
            "token_hit_rate",
            "hit_blocks",
            "release_order",
            "cache_kind",
        ):
            assert got[key] == want[key], key
        assert got["method"] == "sampled" and got["evictions"] is None and got["block_hit_rate"] is None
    assert [r["capacity_blocks"] for r in sampled.to_pylist()] == [100, 1000, 5000]
    assert 0 < sampled.column("token_hit_rate")[0].as_py() < sampled.column("token_hit_rate")[2].as_py()
    metadata = read_metadata(tmp_path / "sampled.parquet")
    assert metadata["methods"] == {"tail-first": "sampled"} and metadata["sample_rate"] == 1.0
    assert (
        metadata["ideal_token_hit_rate"] == read_metadata(tmp_path / "exact.parquet")["ideal_token_hit_rate"]
    )
    table = sim_table(load_result(tmp_path / "sampled.parquet"))  # kvbench report reads it as a sim file
    assert [row[0] for row in table.rows] == ["100", "1,000", "5,000"] and table.rows[0][5] == "-"


def test_a_small_budget_samples_and_says_how_much(kvbench, tmp_path, shared_data):
    trace = mooncake_head(shared_data, tmp_path)
    code, stdout, _ = kvbench("sim", trace, "--sample-keys", "2000", "--out", tmp_path / "s.parquet")
    assert code == 0
    metadata = read_metadata(tmp_path / "s.sampled-curve.parquet")
    assert 0 < metadata["sample_rate"] < 0.2 and metadata["max_keys_held"] < 2000 + 300
    assert "sampling error (1 sd, the largest from 1/R blocks up)" in " ".join(stdout.split())


def test_bad_sampling_flags_are_one_line_errors(kvbench, tmp_path, shared_data):
    trace = mooncake_head(shared_data, tmp_path, 50)
    assert "--sample-rate: 0.0 is not in (0, 1]" in one_error_line(
        *kvbench("sim", trace, "--sample-rate", "0")[::2]
    )
    assert "--sample-keys: 0 is not a positive" in one_error_line(
        *kvbench("sim", trace, "--sample-keys", "0")[::2]
    )
    message = one_error_line(*kvbench("sim", trace, "--sample-rate", "0.5", "--cache-kind", "radix")[::2])
    assert "--sample-rate" in message and "radix" in message


ZIPF = REPO / "scenarios" / "multi_prefix_zipf.toml"


def test_sampling_refuses_head_first_release(kvbench, tmp_path):
    # before: it printed the tail-first estimate (0.3365 / 0.6010) for head-first (exact 0.1850 / 0.4905)
    for release in ("head-first", "tail-first,head-first"):
        message = one_error_line(
            *kvbench(
                "sim",
                ZIPF,
                "--sample-keys",
                "65536",
                "--release",
                release,
                "--sizes",
                "256,512",
                "--out",
                tmp_path / "s.parquet",
            )[::2]
        )
        assert "--release" in message and "head-first" in message and "--sample-keys" in message


def test_sampling_refuses_flags_it_would_ignore(kvbench, tmp_path):
    out = tmp_path / "s.parquet"
    message = one_error_line(
        *kvbench("sim", ZIPF, "--sample-keys", "4096", "--method", "replay", "--out", out)[::2]
    )
    assert "--sample-keys" in message and "--method replay" in message
    message = one_error_line(*kvbench("sim", ZIPF, "--sample-rate", "0.5", "--ttl-curve", "--out", out)[::2])
    assert "--sample-rate" in message and "--ttl-curve" in message
    assert not (tmp_path / "s.sampled-curve.parquet").exists()


def test_a_rate_with_a_key_budget_starts_at_the_rate(kvbench, tmp_path, shared_data):
    trace = mooncake_head(shared_data, tmp_path)
    code, _, _ = kvbench(
        "sim", trace, "--sample-rate", "0.5", "--sample-keys", "1000000", "--out", tmp_path / "a.parquet"
    )
    assert code == 0  # a budget the trace never fills: the rate stays R
    assert read_metadata(tmp_path / "a.sampled-curve.parquet")["sample_rate"] == 0.5
    code, _, _ = kvbench(
        "sim", trace, "--sample-rate", "0.5", "--sample-keys", "2000", "--out", tmp_path / "b.parquet"
    )
    assert code == 0 and read_metadata(tmp_path / "b.sampled-curve.parquet")["sample_rate"] < 0.2


def test_a_tiny_budget_warns_that_small_sizes_are_coarse_and_reports_keys_honestly(
    kvbench, tmp_path, shared_data
):
    trace = mooncake_head(shared_data, tmp_path)
    code, stdout, stderr = kvbench(
        "sim", trace, "--sample-keys", "64", "--sizes", "1,100000", "--out", tmp_path / "s.parquet"
    )
    assert code == 0
    metadata = read_metadata(tmp_path / "s.sampled-curve.parquet")
    coarse = metadata["coarse_below_blocks"]
    assert coarse == round(1 / metadata["sample_rate"]) and coarse > 100
    warnings = [line for line in stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and f"{coarse:,} blocks" in warnings[0] and "--sizes 1" in warnings[0]
    assert metadata["max_keys_kept"] <= 64 < metadata["max_keys_held"]  # kept between requests vs the peak
    assert f"at most {metadata['max_keys_kept']:,} keys held between requests" in " ".join(stdout.split())
    assert f"{metadata['max_keys_held']:,} at peak" in " ".join(stdout.split())
    code, _, stderr = kvbench("sim", trace, "--sample-keys", "1000000", "--out", tmp_path / "exact.parquet")
    assert code == 0 and "warning" not in stderr  # rate 1: no size is coarse
