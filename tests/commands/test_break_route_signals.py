"""``kvbench break`` and ``kvbench route`` keep their work on SIGINT, SIGTERM and SIGKILL, as ``run`` and
``sweep`` do: checkpoints while they run, the cut variant's rows kept and marked,
exit 130 with one line. Before: ``break timestamp`` dropped the running variant's rows and SIGKILL left
no file; ``route`` wrote nothing and SIGTERM exited -15 without a message. Real processes, real signals."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tiny_workloads import tiny_timestamp

from kvbench.results.parquet import read_metadata

pytestmark = [pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


STATUS_LINES = (
    "threads: ",
    "loading the model",
    "kvbench's CPU kernels are off",
    "routed: ",
    "working: ",
)  # status lines, not errors


def start(args: list) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "kvbench.cli", *map(str, args)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path, process: subprocess.Popen, ready=lambda path: True, limit_s: float = 600) -> None:
    """Until ``path`` exists and ``ready(path)``; a loaded machine can take minutes to load the model."""
    deadline = time.monotonic() + limit_s
    while process.poll() is None and time.monotonic() < deadline:
        if path.exists() and ready(path):
            return
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"no checkpoint at {path} while the command ran: {process.communicate()[1][-2000:]}")


@pytest.mark.engine
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_break_keeps_the_cut_variants_rows(tmp_path, sig):
    out = tmp_path / "ts.parquet"
    process = start([*tiny_timestamp(400), "--out", out])
    wait_for(out, process)  # the first checkpoint comes with the first row of the first variant
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=300)
    table = pq.read_table(out).to_pylist()
    metadata = read_metadata(out)
    assert metadata["complete"] is False and len(table) >= 1
    cut = [row for row in table if not row["variant_complete"]]
    assert cut and {row["variant"] for row in cut} == {metadata["variant_partial"]}
    assert len(table) == len(cut) + 400 * len(metadata["variants_finished"])
    if sig == signal.SIGKILL:
        assert process.returncode == -signal.SIGKILL
        return
    assert process.returncode == 128 + sig, stderr  # 130 on SIGINT, 143 on SIGTERM
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith(STATUS_LINES)]
    assert len(lines) == 1 and f"rows of the cut variant {metadata['variant_partial']}" in lines[0], stderr
    assert f"and {len(cut)} rows" in lines[0] and str(out) in stderr.replace("\n", "")


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory):
    """60,000 prompts of a few lines (blocks to hash and route): seconds per policy."""
    path = tmp_path_factory.mktemp("route") / "prompts.jsonl"
    with path.open("w") as handle:
        for i in range(60_000):
            prompt = f"System {i % 7}: answer briefly and well.\n" * 6 + f"Question {i}: why?\n"
            handle.write(
                json.dumps({"prompt": prompt, "arrival_ms": i * 5, "session_id": f"s{i % 500}"}) + "\n"
            )
    return path


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_route_keeps_the_finished_policies(tmp_path, big_trace, sig):
    out = tmp_path / "route.parquet"
    process = start(["route", big_trace, "--replicas", 4, "--out", out])
    wait_for(out, process)  # the first checkpoint comes after the first policy
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=300)
    metadata = read_metadata(out)
    rows = pq.read_table(out).to_pylist()
    assert metadata["complete"] is False and 1 <= len(rows) < 6
    assert [row["policy"] for row in rows] == metadata["policies_finished"][: len(rows)]
    if sig == signal.SIGKILL:
        assert process.returncode == -signal.SIGKILL
        return
    assert process.returncode == 128 + sig, stderr  # 130 on SIGINT, 143 on SIGTERM
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith(STATUS_LINES)]
    assert len(lines) == 1 and "kvbench route: interrupted during policy" in lines[0], stderr
    assert f"kept {len(rows)} finished policies" in lines[0] and metadata["policy_partial"] in lines[0]
