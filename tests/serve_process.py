"""A real ``kvbench serve`` in a child process on a free loopback port (``--port 0``), as a user starts it."""

import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from readiness import process_ended, wait_until

REPO = Path(__file__).resolve().parents[1]
URL = re.compile(r"http://127\.0\.0\.1:\d+/v1")  # the line serve prints once its socket is bound


class ServeProcess:
    """``python -m kvbench.cli serve --port 0 [serve_args]``; ``url`` waits until it answers /health
    (:func:`readiness.wait_until`: on readiness, failing at once with the exit code and whole log if
    the process dies)."""

    def __init__(self, *serve_args: str) -> None:
        self.args = ("serve", "--port", "0", *serve_args)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kvbench.cli", *self.args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.output: list[str] = []
        self._drain_thread = threading.Thread(target=self._drain, daemon=True)
        self._drain_thread.start()
        self._url: str | None = None

    def _drain(self) -> None:
        for line in self.process.stdout:
            self.output.append(line)

    def log(self) -> str:
        """Everything the process printed (all of it once it has exited)."""
        if self.process.poll() is not None:
            self._drain_thread.join(timeout=10)
        return "".join(self.output)

    def _answering(self) -> str | None:
        match = URL.search("".join(self.output))
        if match is None:
            return None
        try:
            with urllib.request.urlopen(match.group(0).removesuffix("/v1") + "/health", timeout=5):
                return match.group(0)
        except OSError:
            return None

    @property
    def url(self) -> str:
        """The API root (``http://127.0.0.1:PORT/v1``), once /health answers."""
        if self._url is None:
            self._url = wait_until(
                self._answering,
                f"kvbench {' '.join(self.args)}",
                ended=process_ended(self.process),
                log=self.log,
            )
        return self._url

    def reset_prefix_cache(self) -> None:
        """``POST /reset_prefix_cache`` (vLLM's endpoint): every cached block dropped, once it answers."""
        request = urllib.request.Request(
            self.url.removesuffix("/v1") + "/reset_prefix_cache", data=b"", method="POST"
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200, response.read()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
