"""vLLM's result keys, goodput split by cache outcome, and the result JSON, on hand-computed rows."""

import json
import math
from pathlib import Path

import pytest

from kvbench.errors import InputError
from kvbench.results.goodput import parse_goodput
from kvbench.results.metrics import percentile_key
from kvbench.results.result_json import DETAILED_KEYS, result_dict, result_path, write_result
from kvbench.results.rows import ResultRow
from kvbench.results.summary import SummaryOptions, parse_metric_percentiles, summarize

# What `vllm bench serve --save-result` writes for the default flags (vllm/benchmarks/serve.py),
# request_goodput with --goodput.
VLLM_KEYS = [
    "date",
    "endpoint_type",
    "backend",
    "label",
    "model_id",
    "tokenizer_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
] + [
    f"{stat}_{m}_ms"
    for m in ("ttft", "tpot", "itl", "e2el")
    for stat in ("mean", "median", "std", "p50", "p90", "p99")
]


def row(
    phase="measure",
    status="ok",
    prompt=100,
    cached=0,
    output=3,
    ttft=None,
    tpot=None,
    e2e=None,
    itl=(),
    sent=None,
    ended=None,
    error=None,
):
    return ResultRow(
        **{
            "phase": phase,
            "status": status,
            "prompt_tokens": prompt,
            "cached_prompt_tokens": cached,
            "expected_cached_tokens": None,
            "output_tokens": output,
            "ttft_ms": ttft,
            "tpot_ms": tpot,
            "e2e_ms": e2e,
            "itl_ms": tuple(itl),
            "queue_ms": 0.0,
            "sent_ms": sent,
            "end_ms": ended,
            "error": error,
            "request_id": f"r{sent}",
            "output_matches_reference": None,
        }
    )


ROWS = [
    row(phase="warmup", ttft=5000, tpot=1, e2e=5002, itl=[1, 1], sent=-900, ended=-800),  # never summarized
    row(prompt=100, cached=0, output=3, ttft=100, tpot=10, e2e=120, itl=[10, 10], sent=0, ended=120),  # miss
    row(prompt=100, cached=80, output=2, ttft=20, tpot=30, e2e=50, itl=[30], sent=100, ended=150),  # hit
    row(prompt=200, cached=150, output=1, ttft=40, e2e=40, sent=200, ended=240),  # hit, one token: no TPOT
    row(status="error", prompt=100, cached=None, output=0, sent=300, ended=1000, error="HTTP 500: boom"),
]


def test_vllm_counts_and_throughputs():
    s = summarize(ROWS)
    assert (s.completed, s.failed, s.num_warmup) == (3, 1, 1)
    assert s.duration == pytest.approx(1.0)  # first measured send (0 ms) to last end (1,000 ms, the error)
    assert (s.total_input_tokens, s.total_output_tokens) == (400, 6)
    assert s.request_throughput == pytest.approx(3.0)
    assert s.output_throughput == pytest.approx(6.0)
    assert s.total_token_throughput == pytest.approx(406.0)
    # decode per stream: (2 + 1) decode tokens over (20 + 30) ms of decoding = 60 tok/s, not 6 tok/s of output
    assert s.per_stream_decode_tok_s == pytest.approx(60.0)


def test_mean_median_std_and_percentiles_by_hand():
    d = summarize(ROWS).as_dict()
    # ttft [100, 20, 40] (a warm-up ran, so no cold request is set apart)
    assert d["mean_ttft_ms"] == pytest.approx(160 / 3)
    assert d["median_ttft_ms"] == pytest.approx(40)
    # population std, as vLLM
    assert d["std_ttft_ms"] == pytest.approx(
        math.sqrt(((100 - 160 / 3) ** 2 + (20 - 160 / 3) ** 2 + (40 - 160 / 3) ** 2) / 3)
    )
    assert d["p90_ttft_ms"] == pytest.approx(40 + 0.8 * 60)  # sorted [20, 40, 100], rank 1.8
    assert d["p99_ttft_ms"] == pytest.approx(40 + 0.98 * 60)
    # tpot [10, 30]: the one-token request has none
    assert (d["mean_tpot_ms"], d["median_tpot_ms"], d["std_tpot_ms"]) == pytest.approx((20, 20, 10))
    assert d["p90_tpot_ms"] == pytest.approx(28)
    # itl [10, 10, 30]: every gap of every request
    assert d["mean_itl_ms"] == pytest.approx(50 / 3) and d["median_itl_ms"] == pytest.approx(10)
    assert d["std_itl_ms"] == pytest.approx(math.sqrt((2 * (10 - 50 / 3) ** 2 + (30 - 50 / 3) ** 2) / 3))
    assert (d["mean_e2el_ms"], d["median_e2el_ms"]) == pytest.approx((70, 50))


def test_chosen_percentiles_and_metrics_only():
    options = SummaryOptions(parse_metric_percentiles("25,99.9"), ("ttft", "e2el"))
    latency = summarize(ROWS, options).latency
    assert sorted(latency) == sorted(
        [
            "mean_ttft_ms",
            "median_ttft_ms",
            "std_ttft_ms",
            "p25_ttft_ms",
            "p99.9_ttft_ms",
            "mean_e2el_ms",
            "median_e2el_ms",
            "std_e2el_ms",
            "p25_e2el_ms",
            "p99.9_e2el_ms",
        ]
    )
    assert latency["p25_ttft_ms"] == pytest.approx(30)  # sorted [20, 40, 100], rank 0.5
    assert percentile_key(99.0, "itl") == "p99_itl_ms" and percentile_key(99.9, "itl") == "p99.9_itl_ms"


def test_cold_first_request_stays_out_of_every_ttft_statistic_without_warmup():
    rows = [r for r in ROWS if r.phase == "measure"]
    s = summarize(rows)
    assert s.cold_ttft_ms == 100
    assert (
        s.latency["mean_ttft_ms"],
        s.latency["median_ttft_ms"],
        s.latency["std_ttft_ms"],
    ) == pytest.approx((30, 30, 10))
    assert s.latency["mean_e2el_ms"] == pytest.approx(70)  # other metrics keep it


def test_goodput_distserve_definition_split_by_cache_hit():
    options = SummaryOptions(goodput=parse_goodput(["ttft:50 tpot:20"]))
    good = summarize(ROWS, options).goodput
    # miss (ttft 100 > 50): bad; hit (tpot 30 > 20): bad; hit with one token (tpot counts 0): good
    assert good.num_good_requests == 1 and good.request_goodput == pytest.approx(1.0)
    assert (good.num_cache_hit_requests, good.num_cache_miss_requests) == (2, 1)
    assert good.request_goodput_cache_hit == pytest.approx(1.0) and good.request_goodput_cache_miss == 0.0
    assert good.slo_attainment == pytest.approx(1 / 3)
    assert (good.slo_attainment_cache_hit, good.slo_attainment_cache_miss) == pytest.approx((0.5, 0.0))
    inclusive = summarize(ROWS, SummaryOptions(goodput=(("ttft", 40.0), ("tpot", 30.0)))).goodput
    assert inclusive.num_good_requests == 2  # SLO >= value: ttft 20 / tpot 30 and ttft 40 both meet it
    stricter_hit = summarize(ROWS, SummaryOptions(goodput=(("e2el", 200.0),), hit_threshold=0.8)).goodput
    # 80/100 is a hit, 150/200 not
    assert (stricter_hit.num_cache_hit_requests, stricter_hit.num_cache_miss_requests) == (
        1,
        2,
    )
    assert summarize(ROWS).goodput is None and "request_goodput" not in summarize(ROWS).as_dict()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["ttft=200"], "METRIC:MS"),
        (["itl:5"], "METRIC:MS"),
        (["ttft:fast"], "not a number"),
        (["ttft:0"], "positive"),
        (["ttft:1", "ttft:2"], "given twice"),
    ],
)
def test_goodput_flag_errors_name_the_flag(flags, message):
    with pytest.raises(ValueError, match=f"--goodput.*{message}"):
        parse_goodput(flags)


def test_summary_option_errors():
    with pytest.raises(ValueError, match="--metric-percentiles"):
        parse_metric_percentiles("50,ninety")
    with pytest.raises(ValueError, match="--metric-percentiles"):
        SummaryOptions(metric_percentiles=(101,))
    with pytest.raises(ValueError, match="--percentile-metrics: ttft,latency"):
        SummaryOptions(percentile_metrics=("ttft", "latency"))


def test_result_json_reads_back_with_vllm_keys(tmp_path):
    options = SummaryOptions(goodput=(("ttft", 50.0),))
    metadata = {
        "run": {
            "backend": "openai",
            "scenario": "chat",
            "model": "m",
            "tokenizer": "cl100k_base",
            "load": {"concurrency": 4, "request_rate_per_s": None, "burstiness": 1.0},
        },
        "reconciliation": {"reported_hit_rate": 0.5, "metrics_hit_rate": 0.25},
    }
    path = write_result(
        tmp_path / "r.json", result_dict(summarize(ROWS, options), metadata, ROWS, detailed=True)
    )
    back = json.loads(path.read_text())
    assert [key for key in VLLM_KEYS if key not in back] == []
    assert (back["request_rate"], back["max_concurrency"], back["num_prompts"], back["completed"]) == (
        "inf",
        4,
        4,
        3,
    )
    assert back["metrics_hit_rate"] == 0.25 and back["error_rate"] == pytest.approx(1 / 5)
    assert (
        back["token_hit_rate"] == pytest.approx(230 / 400)
        and "versions" in back
        and back["run"]["model"] == "m"
    )
    assert all(len(back[key]) == 4 for key in DETAILED_KEYS)  # measured requests only
    assert back["ttfts"] == [0.1, 0.02, 0.04, None] and back["itls"][0] == [0.01, 0.01]  # vLLM's seconds
    assert back["errors"] == ["", "", "", "HTTP 500: boom"] and back["cached_tokens"] == [0, 80, 150, None]


def test_result_path_follows_vllms_flags(tmp_path):
    assert result_path(tmp_path / "x.json", None, None) == tmp_path / "x.json"
    assert result_path(None, tmp_path, None, tmp_path / "run-a.parquet") == tmp_path / "run-a.json"
    assert result_path(None, None, "b.json") == Path("b.json")
    assert result_path(None, None, None) is None
    with pytest.raises(InputError, match="--save-result"):
        result_path(tmp_path / "x.json", tmp_path, None)
    with pytest.raises(InputError, match="--result-filename"):
        result_path(None, None, "sub/b.json")
