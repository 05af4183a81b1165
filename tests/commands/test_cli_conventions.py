"""CLI conventions: KVBENCH_* variables, ranges and choices checked before any model loads, one
spelling per meaning (--cache-kind, --requests), --debug in the help."""

import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from readiness import LIMIT_S

from kvbench.results.parquet import read_metadata

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "scenarios" / "chat.toml"


def test_a_bad_range_exits_2_before_torch_is_imported():
    probe = (
        "import atexit, sys; atexit.register(lambda: print('torch loaded:', 'torch' in sys.modules, "
        "file=sys.stderr)); from kvbench.cli import main; main(['run', sys.argv[1], '--concurrency', '0'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(SCENARIO)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == ["error: --concurrency: 0: must be >= 1", "torch loaded: False"]


@pytest.mark.parametrize(
    "args, line",
    [
        (["run", SCENARIO, "--max-concurrency", "-2"], "error: --max-concurrency: -2: must be >= 1"),
        (["run", SCENARIO, "--top-p=0"], "error: --top-p: 0: must be > 0"),
        (["run", SCENARIO, "--top-p", "1.5"], "error: --top-p: 1.5: must be <= 1"),
        (["run", SCENARIO, "--temperature", "-0.5"], "error: --temperature: -0.5: must be >= 0"),
        (["run", SCENARIO, "--request-rate", "0"], "error: --request-rate: 0: must be > 0"),
        (["run", SCENARIO, "--num-requests", "0"], "error: --num-requests: 0: must be >= 1"),
        (["run", SCENARIO, "--cache", "maybe"], "error: --cache must be 'on' or 'off', got 'maybe'"),
        (["run", SCENARIO, "--device", "gpu"], "error: --device: gpu: use cpu, cuda, cuda:N or mps"),
        (
            ["run", SCENARIO, "--dtype", "fp8"],
            "error: --dtype: fp8: the engine runs in float32, bfloat16 or float16 (fp32, bf16, fp16)",
        ),
        (
            ["serve", "--log-level", "loud"],
            "error: --log-level must be 'critical', 'error', 'warning', 'info', 'debug' or 'trace', got "
            "'loud'",
        ),
        (["serve", "--block-size", "0"], "error: --block-size: 0: must be >= 1"),
        (["sim", SCENARIO, "--block-size", "0"], "error: --block-size: 0: must be >= 1"),
        (["sweep", SCENARIO, "--warmup", "-1"], "error: --warmup: -1: must be >= 0"),
    ],
)
def test_bad_values_are_one_line_naming_the_flag_and_exit_2(kvbench, args, line):
    code, _, stderr = kvbench(*args)
    assert code == 2 and stderr.strip().splitlines() == [line]


def test_an_option_from_a_kvbench_variable(kvbench, tmp_path, monkeypatch):
    monkeypatch.setenv("KVBENCH_SIM_REQUESTS", "5")
    code, stdout, stderr = kvbench("sim", SCENARIO, "--sizes", "64", "--out", tmp_path / "env.parquet")
    assert code == 0, stderr
    assert "(5 requests" in stdout and read_metadata(tmp_path / "env.parquet")["complete"] is True
    code, stdout, _ = kvbench(
        "sim", SCENARIO, "--sizes", "64", "--requests", "3", "--out", tmp_path / "flag.parquet"
    )
    assert code == 0 and "(3 requests" in stdout  # the flag wins over the variable
    monkeypatch.setenv("KVBENCH_RUN_CONCURRENCY", "0")
    code, _, stderr = kvbench("run", SCENARIO)
    assert code == 2 and stderr.strip() == "error: KVBENCH_RUN_CONCURRENCY: 0: must be >= 1"


def test_sim_says_cache_kind_and_keeps_cache_as_a_hidden_alias(kvbench, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    rows = {}
    for flag in ("--cache-kind", "--cache"):
        out = tmp_path / f"{flag.strip('-')}.parquet"
        code, _, stderr = kvbench(
            "sim", SCENARIO, "--sizes", "32,128", "--requests", "20", flag, "radix", "--out", out
        )
        assert code == 0, stderr
        rows[flag] = pq.read_table(out).to_pylist()
    assert rows["--cache-kind"] == rows["--cache"] and rows["--cache"][0]["cache_kind"] == "radix"
    _, help_text, _ = kvbench("sim", "--help")
    assert "--cache-kind" in help_text and "--cache " not in help_text


def test_requests_and_num_requests_are_one_option(kvbench, tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert kvbench("trace", "gen", "one-off", "--requests", "6", "--prompt-tokens", "40", "-o", a)[0] == 0
    assert kvbench("trace", "gen", "one-off", "--num-requests", "6", "--prompt-tokens", "40", "-o", b)[0] == 0
    assert a.read_text() == b.read_text() and len(a.read_text().splitlines()) == 7  # header + 6 requests


def test_help_shows_debug_ranges_variables_and_what_out_is(kvbench, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps and cuts option names at 80 columns
    _, root, _ = kvbench("--help")
    assert "--debug" in root
    _, run, _ = kvbench("run", "--help")
    assert "x>=1" in run and "KVBENCH_RUN_CONCURRENCY" in run and "Output FILE" in run
    _, sweep, _ = kvbench("sweep", "--help")
    assert "Output FOLDER" in sweep and "Load sweep (--backend openai)" in sweep
