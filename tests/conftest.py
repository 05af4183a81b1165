import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from kvbench.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def shared_data():
    """The shared data folder beside the repository (../shared/data); skipped where absent."""
    path = REPO.parent / "shared" / "data"
    if not path.is_dir():
        pytest.skip("../shared/data is not beside this checkout")
    return path


@pytest.fixture
def kvbench(capsys):
    """kvbench(*args) -> (exit_code, stdout, stderr), run in-process through the real entry point."""

    def run(*args):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


class ServeProcess:
    """``python -m kvbench.cli serve --port 0 [serve_args]``; ``url`` waits until it answers /health."""

    def __init__(self, *serve_args: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "kvbench.cli", "serve", "--port", "0", *serve_args], cwd=REPO,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        self._url = None

    def _drain(self) -> None:
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line)

    @property
    def url(self) -> str:
        deadline = time.monotonic() + 180  # model build on 2 busy cores
        while self._url is None:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                raise RuntimeError(f"kvbench serve did not start: {''.join(self.output)}") from None
            if match := re.search(r"http://127\.0\.0\.1:\d+/v1", line):
                self._url = match.group(0)
        while True:
            try:
                with urllib.request.urlopen(self._url.removesuffix("/v1") + "/health", timeout=5):
                    return self._url
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def server():
    """A real ``kvbench serve`` on a free loopback port (one per test module that asks)."""
    process = ServeProcess()  # boots while the first test runs the in-process engine
    yield process
    process.stop()


@pytest.fixture(scope="module")
def paged_radix_server():
    """A real ``kvbench serve --engine paged --cache-kind radix`` (the radix tree over the KV pool)."""
    process = ServeProcess("--engine", "paged", "--cache-kind", "radix")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def prompt_only_server():
    """A real ``kvbench serve --prompt-only`` (prompt blocks cached, generated ones not)."""
    process = ServeProcess("--prompt-only")
    yield process
    process.stop()
