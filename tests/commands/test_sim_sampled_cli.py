"""``kvbench sim --sample-rate / --sample-keys`` end to end: the sampled curve's table and Parquet file
(read back, against the exact curve's), and one-line errors."""

import pyarrow.parquet as pq

from kvbench.results.parquet import read_metadata


def mooncake_head(shared_data, tmp_path, num_lines=2000):
    lines = (shared_data / "mooncake" / "conversation_trace.jsonl").read_text().splitlines()[:num_lines]
    trace = tmp_path / "conv.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    return trace


def test_a_key_budget_above_the_trace_gives_the_exact_curve(kvbench, tmp_path, shared_data):
    trace = mooncake_head(shared_data, tmp_path)
    code, _, _ = kvbench("sim", trace, "--out", tmp_path / "exact.parquet")
    assert code == 0
    code, stdout, _ = kvbench("sim", trace, "--sample-keys", "1000000", "--sizes", "100,1000", "--out",
                              tmp_path / "sampled.parquet")
    assert code == 0
    assert "kvbench sim (sampled)" in stdout and "rate 1," in stdout
    exact = {r["capacity_blocks"]: r["token_hit_rate"] for r in pq.read_table(tmp_path / "exact.curve.parquet").to_pylist()}
    sampled = pq.read_table(tmp_path / "sampled.sampled-curve.parquet").to_pylist()
    assert len(sampled) > 100 and {r["method"] for r in sampled} == {"sampled"}
    sizes = sorted(exact)
    for row in sampled:  # the exact curve is a step function: its value at a size is the last change point's
        at = max((s for s in sizes if s <= row["capacity_blocks"]), default=None)
        assert row["token_hit_rate"] == (exact[at] if at is not None else 0.0)
    metadata = read_metadata(tmp_path / "sampled.sampled-curve.parquet")
    assert metadata["sample_rate"] == 1.0 and metadata["num_requests"] == 2000 and metadata["hit_rate_sd"] == 0.0


def test_a_small_budget_samples_and_says_how_much(kvbench, tmp_path, shared_data):
    trace = mooncake_head(shared_data, tmp_path)
    code, stdout, _ = kvbench("sim", trace, "--sample-keys", "2000", "--out", tmp_path / "s.parquet")
    assert code == 0
    metadata = read_metadata(tmp_path / "s.sampled-curve.parquet")
    assert 0 < metadata["sample_rate"] < 0.2 and metadata["max_keys_held"] < 2000 + 300
    assert "sampling error (1 sd" in stdout


def one_line_error(code, stderr):
    assert code == 2 and "Traceback" not in stderr
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_bad_sampling_flags_are_one_line_errors(kvbench, tmp_path, shared_data):
    trace = mooncake_head(shared_data, tmp_path, 50)
    assert "--sample-rate: 0.0 is not in (0, 1]" in one_line_error(*kvbench("sim", trace, "--sample-rate", "0")[::2])
    assert "--sample-keys: 0 is not a positive" in one_line_error(*kvbench("sim", trace, "--sample-keys", "0")[::2])
    message = one_line_error(*kvbench("sim", trace, "--sample-rate", "0.5", "--cache-kind", "radix")[::2])
    assert "--sample-rate" in message and "radix" in message
