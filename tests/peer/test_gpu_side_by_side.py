"""benchmarks/gpu_side_by_side.py: one line and exit 2 without a GPU; its table's ratios.

The benchmark itself runs only where the device tool lends a GPU (docs/engines.md "On a GPU"); its
steps were dry-run on the CPU with its hidden ``--device cpu --skip-vllm``."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from gpu_side_by_side import table  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_a_gpu_it_fails_at_once_with_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_side_by_side.py"), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "error: no CUDA device here (torch.cuda.is_available() is False); this benchmark needs a GPU"
    ]
    assert not (tmp_path / "o").exists()  # nothing exported, nothing started


def column(scale):
    return {
        "cold_ttft_ms": 100.0 * scale,
        "warm_ttft_p50_ms": 10.0 * scale,
        "tpot_p50_ms": 2.0 * scale,
        "output_tok_s_c8": 1000.0 / scale,
        "cached_prompt_tokens": 23584,
        "startup_s": 60.0 / scale,
    }


def test_ratios_read_kvbench_vs_vllm_at_or_above_one_when_kvbench_is_faster():
    lines = table({"vLLM": column(2.0), "kvbench paged": column(1.0)}, "header").splitlines()
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in lines[4:]}
    assert rows["cold TTFT (ms), shared_2k"] == ["200.0", "100.0", "2.00x |"]  # vLLM / kvbench: latency
    assert rows["output tok/s, chat, concurrency 8"] == ["500.0", "1,000.0", "2.00x |"]  # kvbench / vLLM
    assert rows["cached prompt tokens (both runs)"] == ["23,584", "23,584", " |"]  # equal by construction
    only = table({"kvbench paged": column(1.0)}, "header")
    assert "x |" not in only and "| kvbench paged |" in only  # no vLLM: no ratios
