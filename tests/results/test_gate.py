"""The --assert gate: parsing, checking against a summary, and the error-rate rule."""

import pytest

from kvbench.results.gate import Assertion, GateConfig, gate_keys
from kvbench.results.summary import SummaryOptions


def test_assertions_check_any_summary_key():
    gate = GateConfig.from_flags(
        ["hit_rate>=0.9", "median_ttft_ms <= 250", "failed==0", "p99.9_itl_ms<5"],
        None,
        SummaryOptions(metric_percentiles=(50, 99.9)),
    )
    checks = gate.check({"token_hit_rate": 0.95, "median_ttft_ms": 251.0, "failed": 0, "p99.9_itl_ms": None})
    assert [c.assertion.key for c in checks] == ["token_hit_rate", "median_ttft_ms", "failed", "p99.9_itl_ms"]
    assert [c.passed for c in checks] == [True, False, True, False]  # not measured fails


@pytest.mark.parametrize(
    "text, message",
    [
        ("median_ttft_ms~3", "KEY OP NUMBER"),
        ("median_ttft_ms<<3", "not a number"),
        ("median_ttf_ms<=3", "did you mean median_ttft_ms"),
        ("failed==none", "not a number"),
        ("p95_ttft_ms<=3", "unknown key"),
    ],
)
def test_bad_assertions_name_the_flag(text, message):
    with pytest.raises(ValueError, match=f"--assert.*{message}"):
        Assertion.parse(text, gate_keys())


def test_error_rate_rule():
    assert GateConfig().errors_fail(1, 100)  # default: any failed request fails the run
    assert not GateConfig().errors_fail(0, 100)
    assert not GateConfig(max_error_rate=0.05).errors_fail(5, 100)
    assert GateConfig(max_error_rate=0.05).errors_fail(6, 100)
    with pytest.raises(ValueError, match="--max-error-rate"):
        GateConfig(max_error_rate=1.5)
