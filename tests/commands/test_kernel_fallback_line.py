"""Where kvbench's CPU kernels fall back (switched off, a compiler that fails), ``kvbench run`` and
``kvbench serve`` say so in one status line with the reason; before, the fallback was silent."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tiny_scenarios import SHARED_PREFIX as SCENARIO

pytestmark = [pytest.mark.engine]
REPO = Path(__file__).resolve().parents[2]
LINE = "kvbench's CPU kernels are off ("


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "KVBENCH_NATIVE_KERNELS")}
    env["KVBENCH_CACHE_DIR"] = str(tmp_path / "cache")  # no library built by an earlier test
    return {**env, **extra}


@pytest.mark.parametrize(
    "extra, reason",
    [
        ({"KVBENCH_NATIVE_KERNELS": "off"}, "(KVBENCH_NATIVE_KERNELS=off)"),
        ({"CXX": "/bin/false"}, "(not built: false failed"),
    ],
    ids=["switched-off", "compiler-fails"],
)
def test_run_says_the_kernels_fell_back_and_why(tmp_path, extra, reason):
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(SCENARIO)
    done = subprocess.run(
        [sys.executable, "-m", "kvbench.cli", "run", scenario, "--out", tmp_path / "r.parquet"],
        cwd=REPO,
        env=_env(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if LINE in line]
    assert len(lines) == 1 and reason in lines[0], done.stderr


def test_run_with_kernels_built_prints_no_such_line(tmp_path):
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(SCENARIO)
    done = subprocess.run(
        [sys.executable, "-m", "kvbench.cli", "run", scenario, "--out", tmp_path / "r.parquet"],
        cwd=REPO,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    from kvbench.engine.native import native_kernels

    if native_kernels() is None:
        pytest.skip("no kernels on this machine")
    assert LINE not in done.stderr


def test_serve_says_the_kernels_fell_back_and_why(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "kvbench.cli", "serve", "--port", "0"],
        cwd=REPO,
        env=_env(tmp_path, KVBENCH_NATIVE_KERNELS="no"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 600
        while not any("http://127.0.0.1:" in line for line in lines) and process.poll() is None:
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(timeout=60)
        reader.join(timeout=10)
    fallback = [line for line in lines if LINE in line]
    assert len(fallback) == 1 and "(KVBENCH_NATIVE_KERNELS=no)" in fallback[0], "".join(lines)
