"""Status lines outside a terminal: piped, they arrive when they happen, with a
heartbeat before the first request finishes, and they are there after an interrupt."""

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tiny_scenarios import SHARED_PREFIX as SCENARIO
from tiny_workloads import tiny_timestamp

from kvbench.results.parquet import read_metadata

pytestmark = [pytest.mark.engine, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


class PipedKvbench:
    """``python -m kvbench.cli ARGS`` with stderr a pipe, each stderr line kept as it arrives."""

    def __init__(self, *args, every_s: float = 0.5) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "KMP_BLOCKTIME")}
        env["KVBENCH_PROGRESS_EVERY_S"] = str(every_s)  # the heartbeat's interval, not 30 s
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kvbench.cli", *map(str, args)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.process.stderr:
            self.lines.put(line)

    def stop(self, sig: int = signal.SIGINT) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def wait_for(self, text: str, timeout_s: float = 300) -> str:
        """The first stderr line containing ``text``, read while the process runs."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                assert self.process.poll() is None, (
                    f"exited {self.process.returncode} before {text!r}: {self.seen}"
                )
                continue
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no {text!r} within {timeout_s} s: {self.seen}")


def test_run_status_lines_and_heartbeat_arrive_while_it_runs_and_survive_ctrl_c(tmp_path):
    scenario = tmp_path / "long.toml"
    scenario.write_text(SCENARIO.replace("num_requests = 4", "num_requests = 400"))
    out = tmp_path / "piped.parquet"
    run = PipedKvbench("run", scenario, "--out", out)
    try:
        threads = run.wait_for("threads: ")  # the default choice, before the model loads
        assert "usable cores, load" in threads and "OMP_WAIT_POLICY=PASSIVE, set by kvbench" in threads
        run.wait_for("loading the model (the built-in random Llama, cpu) ...")
        run.wait_for("working: ")  # the heartbeat, while nothing has finished
        # it came before the first request ended
        assert not any(line.startswith("progress: ") for line in run.seen)
        run.wait_for("progress: ")  # then the plain progress line takes over
    finally:
        run.stop()
    assert run.process.returncode == 130
    metadata = read_metadata(out)
    assert metadata["complete"] is False and metadata["run"]["threads"]["requested"] is None
    assert metadata["run"]["threads"]["wait_policy"] == {
        "OMP_WAIT_POLICY": "PASSIVE",
        "KMP_BLOCKTIME": "0",
        "set_by": "kvbench",
    }


def test_break_beats_while_it_runs_and_records_its_threads(tmp_path):
    out = tmp_path / "ts.parquet"
    piped = PipedKvbench(*tiny_timestamp(), "--out", out)
    try:
        assert "usable cores, load" in piped.wait_for("threads: ")
        piped.wait_for("loading the model")
        piped.wait_for("working: ")  # `kvbench break timestamp` once ran 130 s silent
        assert piped.process.wait(timeout=600) == 0
    finally:
        piped.stop()
    assert read_metadata(out)["threads"]["requested"] is None


@pytest.mark.server
def test_serve_says_what_it_does_before_it_listens():
    serve = PipedKvbench("serve", "--port", 0, "--threads", 1)
    try:
        assert "threads: 1 (--threads 1;" in serve.wait_for("threads: ")
        serve.wait_for("loading the model")
    finally:
        serve.stop(signal.SIGTERM)
