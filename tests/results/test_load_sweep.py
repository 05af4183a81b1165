"""Load-sweep points: grouping runs by axis value, the mean, the bootstrap interval."""

import numpy as np
import pytest

from kvbench.results.load_sweep import LoadRun, bootstrap_ci, load_points


def test_bootstrap_interval_of_the_mean():
    low, high = bootstrap_ci([1.0, 2.0, 3.0, 4.0])
    assert 1.0 <= low < 2.5 < high <= 4.0
    assert bootstrap_ci([1.0, 2.0, 3.0, 4.0]) == (low, high)  # seeded: the same interval every time
    assert bootstrap_ci([5.0, 5.0, 5.0]) == (5.0, 5.0) and bootstrap_ci([7.0]) is None
    wide = bootstrap_ci(np.arange(100.0), confidence=0.99)
    narrow = bootstrap_ci(np.arange(100.0), confidence=0.5)
    assert wide[0] < narrow[0] < 49.5 < narrow[1] < wide[1]
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci([1.0, 2.0], confidence=1.0)


def test_points_group_runs_by_value_in_order():
    runs = [
        LoadRun(4.0, 0, {"request_throughput": 3.0, "median_ttft_ms": 100.0, "request_goodput": None}, "a"),
        LoadRun(1.0, 0, {"request_throughput": 1.0, "median_ttft_ms": 50.0}, "b"),
        LoadRun(4.0, 1, {"request_throughput": 5.0, "median_ttft_ms": 300.0}, "c"),
    ]
    four, one = load_points(runs)
    assert (four.value, four.num_runs, one.value, one.num_runs) == (4.0, 2, 1.0, 1)
    assert four.mean["request_throughput"] == 4.0 and four.mean["median_ttft_ms"] == 200.0
    assert 3.0 <= four.ci["request_throughput"][0] <= 4.0 <= four.ci["request_throughput"][1] <= 5.0
    assert four.mean["request_goodput"] is None and four.ci["request_goodput"] is None
    assert one.ci["request_throughput"] is None  # one run: no interval
