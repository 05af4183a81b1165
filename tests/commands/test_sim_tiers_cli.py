"""``kvbench sim --tier``: per-tier tables, the request rows read back, the TTFT model's inputs, refusals."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvbench.memory.layout import KvLayout
from kvbench.memory.presets import PRESETS
from kvbench.run.source import load_source
from kvbench.sim.replay import prepare_prompts
from kvbench.sim.stack_distance import stack_distances
from kvbench.sim.tier_ttft import PrefillModel, TierCost, break_even_tokens, estimate_ttft_ms, sweep_sizes
from kvbench.sim.tiers import Tier, TierPolicy, TierSplit, tier_split

SCENARIO = "scenarios/multi_prefix_rr.toml"


def tier_rows(path):
    return pq.read_table(path.with_name(path.stem + ".tiers.parquet")).to_pylist()


def test_a_host_tier_recovers_the_capacity_loss_and_the_rows_add_up(kvbench, tmp_path):
    out = tmp_path / "rr.parquet"
    code, stdout, stderr = kvbench("sim", SCENARIO, "--sizes", "512", "--tier", "host:2048", "--out", out)
    assert code == 0, stderr
    rows = tier_rows(out)
    requests = load_source(SCENARIO).requests
    assert len(rows) == len(requests)
    trace = prepare_prompts(requests, 16)
    split = tier_split(
        stack_distances(trace.prompts),
        512,
        (Tier("host", 2048, 25e9),),
        TierPolicy.INCLUSIVE,
        16,
        np.array([p.num_tokens for p in trace.prompts]),
    )
    assert [r["host_hit_tokens"] for r in rows] == split.hit_tokens[1].tolist()
    assert sum(r["host_hit_tokens"] for r in rows) > 0.9 * sum(r["prompt_tokens"] for r in rows)
    assert all(
        r["gpu_hit_tokens"] + r["host_hit_tokens"] + r["recomputed_tokens"] == r["prompt_tokens"]
        for r in rows
    )
    assert all(r["ttft_estimate_ms"] is None for r in rows)
    assert "TTFT: not estimated" in stdout and "host: 2,048 blocks (256 MiB), 25 GB/s" in stdout


def fit_file(path, base_ms, ms_per_token):
    uncached = np.array([100, 900, 1500, 2000])
    pq.write_table(
        pa.table(
            {
                "prompt_tokens": uncached + 16,
                "cached_prompt_tokens": [16] * 4,
                "ttft_ms": base_ms + ms_per_token * uncached,
                "tpot_ms": [20.0] * 4,
                "status": ["ok"] * 4,
                "phase": ["measure"] * 4,
            }
        ),
        path,
    )
    return path


def test_the_ttft_estimate_uses_the_fitted_prefill_cost_and_the_tier_bandwidth(kvbench, tmp_path):
    out = tmp_path / "rr.parquet"
    fit = fit_file(tmp_path / "run.parquet", 40.0, 0.5)
    code, stdout, stderr = kvbench(
        "sim",
        SCENARIO,
        "--sizes",
        "512",
        "--tier",
        "host:2048:8GBps:0.2ms",
        "--model-shape",
        "llama-3.1-8b",
        "--fit",
        fit,
        "--out",
        out,
    )
    assert code == 0, stderr
    bytes_per_token = KvLayout.of(PRESETS["llama-3.1-8b"]).bytes_per_token  # 131,072
    for row in tier_rows(out):
        load_ms = (
            0.2 + row["host_hit_tokens"] * bytes_per_token / 8e9 * 1e3 if row["host_hit_tokens"] else 0.0
        )
        assert row["ttft_estimate_ms"] == pytest.approx(40.0 + 0.5 * row["recomputed_tokens"] + load_ms)
    assert "least-squares fit of ttft_ms on uncached prompt tokens" in stdout
    assert "a token loads in 16.4 us, recomputes in 500 us" in stdout


def test_loading_loses_to_recomputing_below_the_break_even_hit():
    model = PrefillModel(0.0, 0.01, "flags")
    fast, slow = (
        TierCost(Tier("host", 1, 25e9, latency_ms=0.5), 131072),
        TierCost(Tier("disk", 1, 1e9), 131072),
    )
    assert break_even_tokens(model, fast) == pytest.approx(0.5 / (0.01 - 131072 / 25e9 * 1e3))
    assert break_even_tokens(model, slow) is None  # 0.13 ms per token to load, 0.01 to compute
    split = TierSplit(
        4, (fast.tier,), TierPolicy.EXCLUSIVE, np.array([[2, 0], [0, 3]]), 16, np.array([40, 50]), "one-pass"
    )
    assert estimate_ttft_ms(split, model, (fast,)).tolist() == pytest.approx(
        [0.01 * 8, 0.01 * 2 + 0.5 + 48 * 131072 / 25e9 * 1e3]
    )


def test_the_swept_sizes_start_at_zero_and_end_at_the_tier():
    assert sweep_sizes(2048) == [0, 16, 32, 64, 128, 256, 512, 1024, 2048]
    assert sweep_sizes(0) == [0]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--tier", "host:1GiB", "--cache-kind", "radix"], "--tier models the LRU hash cache only"),
        (["--tier", "host:1GiB", "--ttl", "5"], "a TTL expires blocks"),
        (["--tier", "host"], "NAME:SIZE"),
        (
            ["--tier", "host:1GiB", "--fit", "x.parquet", "--prefill-ms-per-token", "1"],
            "two sources of one model",
        ),
        (["--tier", "host:1GiB", "--model-shape", "no-such-model"], "no-such-model"),
    ],
)
def test_tier_runs_the_model_does_not_cover_are_refused_in_one_line(kvbench, tmp_path, args, needle):
    code, _, stderr = kvbench("sim", SCENARIO, "--sizes", "512", *args, "--out", tmp_path / "x.parquet")
    assert code == 2 and needle in stderr and "Traceback" not in stderr


@pytest.mark.parametrize(
    "tiers, needle",
    [
        (["host:12", "host:64"], "already the tier 'host:12'"),  # the file had one host column, summing to 0
        (["host:12", "HOST:64:25GBps"], "already the tier 'host:12'"),
        (["gpu:64"], "names the GPU level"),  # its hits went into gpu_hit_tokens
        (["GPU:64:25GBps"], "names the GPU level"),
        (["host:1e30"], "more than any tier holds"),  # OverflowError
        (["host:99999999999999999999999"], "more than any tier holds"),  # OverflowError
        (["host:²"], "not a byte size"),  # ValueError
        (["[/]:10:1GBps"], "not a tier name"),  # rich MarkupError
        (["[bold]x:10:1GBps"], "not a tier name"),
        (["host:10:25GBps:1e400ms"], "a latency must be a finite number"),  # nan ms, then OverflowError
        (["host:10:1e400GBps"], "a bandwidth must be a finite number"),  # accepted as inf GB/s
        (["host:10:0GBps"], "a bandwidth must be a finite number"),
        (["host:10:25GBps:1e9s"], "a latency must be a finite number"),
    ],
)
def test_bad_tier_specs_are_one_line_naming_the_flag(kvbench, tmp_path, tiers, needle):
    out = tmp_path / "x.parquet"
    args = [arg for spec in tiers for arg in ("--tier", spec)]
    code, stdout, stderr = kvbench("sim", SCENARIO, "--sizes", "512", *args, "--out", out)
    assert code == 2, (stdout, stderr)
    assert needle in stderr and "--tier" in stderr and "Traceback" not in stderr, stderr
    assert len(stderr.strip().splitlines()) <= 2, stderr  # the line (and at most a hint)
    assert not list(tmp_path.iterdir())


def test_two_named_tiers_each_get_their_own_column(kvbench, tmp_path):
    out = tmp_path / "two.parquet"
    code, stdout, stderr = kvbench(
        "sim", SCENARIO, "--sizes", "512", "--tier", "host:64", "--tier", "disk-2:2048:3GBps", "--out", out
    )
    assert code == 0, stderr
    rows = tier_rows(out)
    assert {"gpu_hit_tokens", "host_hit_tokens", "disk-2_hit_tokens"} <= set(rows[0])
    assert sum(r["disk-2_hit_tokens"] for r in rows) > 0  # exclusive: what host cannot hold, disk-2 serves
    assert all(
        r["gpu_hit_tokens"] + r["host_hit_tokens"] + r["disk-2_hit_tokens"] + r["recomputed_tokens"]
        == r["prompt_tokens"]
        for r in rows
    )
    assert "disk-2" in stdout
