"""Every command stopped by a signal says so in one line and exits 128 + the signal: 130 on SIGINT
(Ctrl-C), 143 on SIGTERM (the shell's convention). ``explain`` and ``route`` were killed by SIGTERM
with no line (outside the parts that caught it), and ``run`` and ``sweep`` exited 130 on SIGTERM too.
Real processes, real signals, sent once the process catches SIGTERM (its handler is installed)."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from readiness import process_ended, wait_until

REPO = Path(__file__).resolve().parents[2]
STATUS_LINES = ("threads:", "loading the model", "kvbench's CPU kernels are off")


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory):
    """60,000 prompts of a few lines: explain and route work on it for tens of seconds."""
    path = tmp_path_factory.mktemp("signals") / "prompts.jsonl"
    with path.open("w") as handle:
        for i in range(60_000):
            prompt = f"System {i % 7}: answer briefly and well.\n" * 6 + f"Question {i}: why?\n"
            row = {"prompt": prompt, "arrival_ms": i * 5, "session_id": f"s{i % 500}"}
            handle.write(json.dumps(row) + "\n")
    return path


def _catches_sigterm(process: subprocess.Popen) -> bool:
    """The process has a handler for SIGTERM (``SigCgt`` in /proc/PID/status)."""
    try:
        status = Path(f"/proc/{process.pid}/status").read_text()
    except OSError:
        return False
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


def _stopped(args: list[str], sig: int) -> tuple[int, list[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "kvbench.cli", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until(lambda: _catches_sigterm(process), "the SIGTERM handler", ended=process_ended(process))
    time.sleep(1.0)  # into the command's work
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=300)
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith(STATUS_LINES)]
    return process.returncode, lines


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
@pytest.mark.parametrize("command", [["explain"], ["route", "--replicas", "4"]], ids=["explain", "route"])
def test_a_stop_signal_is_one_line_and_128_plus_the_signal(big_trace, tmp_path, command, sig):
    args = [*command, str(big_trace)]
    if command[0] == "route":
        args += ["--out", str(tmp_path / "route.parquet")]
    code, lines = _stopped(args, sig)
    assert code == 128 + sig, lines
    assert len(lines) == 1 and "interrupted" in lines[0], lines
