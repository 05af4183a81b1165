"""Two live runs with the same ``--out`` (two real processes against a real ``kvbench serve``):
the second is refused in one line, the first keeps every row; a dead run's lock is taken over."""

import os
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
from test_api_key_env import SCENARIO

from kvbench.results.out_lock import lock_path
from kvbench.results.parquet import read_metadata

pytestmark = [pytest.mark.server, pytest.mark.slow]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_run(scenario, out, num_requests):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvbench.cli",
            "run",
            str(scenario),
            "--no-preflight",
            "--requests",
            str(num_requests),
            "--max-tokens",
            "8",
            "--out",
            str(out),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_second_run_on_a_held_out_is_refused_and_the_first_keeps_its_rows(server, tmp_path):
    scenario, out = tmp_path / "s.toml", tmp_path / "r.parquet"
    scenario.write_text(SCENARIO.format(url=server.url).replace("num_requests = 2", "num_requests = 40"))
    first = start_run(scenario, out, 40)
    try:
        deadline = time.monotonic() + 240
        while not lock_path(out).exists():  # the first run holds the file from its writer on
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.2)
        second = start_run(scenario, out, 2)
        _, err = second.communicate(timeout=240)
        assert first.poll() is None, "the first run ended before the second was refused: make it longer"
        assert second.returncode == 2
        assert err[err.index("error: ") :].strip() == (
            f"error: --out {out}: another kvbench run (process {first.pid}) is writing this "
            "file; give another --out or wait until it ends"
        )
        _, first_err = first.communicate(timeout=600)
    finally:
        first.kill()
    assert first.returncode == 0, first_err
    assert len(pq.read_table(out)) == 40 and read_metadata(out)["complete"] is True
    assert not lock_path(out).exists()


def test_the_lock_a_dead_run_left_is_taken_over(server, tmp_path):
    scenario, out = tmp_path / "s.toml", tmp_path / "r.parquet"
    scenario.write_text(SCENARIO.format(url=server.url))
    lock_path(out).write_text("999999999")  # a run killed with SIGKILL leaves its lock file, not its lock
    run = start_run(scenario, out, 2)
    _, err = run.communicate(timeout=240)
    assert run.returncode == 0, err
    assert len(pq.read_table(out)) == 2 and not lock_path(out).exists()
