"""tests/readiness.py: waits end on readiness, at once on a death (exit code and log), or at a bound."""

import subprocess
import sys
import time

import pytest
from readiness import NotReady, communicate, process_ended, process_log, wait_until
from serve_process import ServeProcess


def python(code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_slow_process_that_is_alive_is_waited_for(tmp_path):
    ready = tmp_path / "ready"
    process = python(f"import time; time.sleep(1.5); open({str(ready)!r}, 'w').close(); time.sleep(30)")
    try:
        assert wait_until(ready.exists, "ready file", ended=process_ended(process)) is True
        assert process.poll() is None  # it became ready while running; nothing waited on its end
    finally:
        process.kill()
        process.wait()


def test_a_process_that_dies_fails_the_wait_at_once_with_its_exit_code_and_log(tmp_path):
    process = python(
        "import sys; print('half started'); print('no such model', file=sys.stderr); sys.exit(3)"
    )
    start_s = time.monotonic()
    with pytest.raises(NotReady) as failure:
        wait_until(
            (tmp_path / "never").exists, "a child", ended=process_ended(process), log=process_log(process)
        )
    assert time.monotonic() - start_s < 30  # not the overall bound (600 s)
    message = str(failure.value)
    assert "a child: ended before it was ready (exit code 3)" in message
    assert "half started" in message and "no such model" in message


def test_the_bound_is_for_a_hung_process_and_names_it():
    process = python("import time; time.sleep(60)")
    try:
        with pytest.raises(NotReady, match=r"nothing: not ready after 0 s and still running"):
            wait_until(lambda: False, "nothing", ended=process_ended(process), limit_s=0.3)
        with pytest.raises(NotReady, match="still running after 0 s"):
            communicate(process, limit_s=0.3)
        assert process.poll() is not None  # killed, not left behind
    finally:
        process.kill()
        process.wait()


@pytest.mark.server
def test_a_serve_that_exits_is_reported_with_its_exit_code_and_whole_log_not_after_a_deadline():
    """Before: ``ServeProcess.url`` read lines until a 180 s deadline, then raised ``did not start``
    with no exit code, so a dead server cost 180 s and a live one on a loaded machine failed."""
    process = ServeProcess("--engine", "nonsense")
    start_s = time.monotonic()
    try:
        with pytest.raises(NotReady) as failure:
            _ = process.url
    finally:
        process.stop()
    assert time.monotonic() - start_s < 60
    message = str(failure.value)
    assert "kvbench serve --port 0 --engine nonsense: ended before it was ready (exit code 2)" in message
    assert "error: --engine must be 'copy' or 'paged', got 'nonsense'" in message
