"""The peer harness's ``kvbench serve``: the same checkpoint as vLLM, started as a
:class:`~kvbench.peer.server.ServerProcess` for the engine comparison.

It runs ``python -m kvbench.cli serve --port 0`` in kvbench's own interpreter and reads the port it
picked from the URL line it prints once bound; start, health and stop are
:mod:`kvbench.peer.server`'s.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from kvbench.peer.server import DTYPES, ServerProcess

_KVBENCH_URL = re.compile(r"http://127\.0\.0\.1:(\d+)/v1")  # the line `kvbench serve` prints once bound


@dataclass(frozen=True)
class KvbenchServerConfig:
    """One ``kvbench serve`` of the same checkpoint, the second kind of peer server.

    Attributes:
        model_dir: the checkpoint vLLM serves (``kvbench model export``); ``None`` serves kvbench's
            embedded default model.
        log_path: where its stdout and stderr go.
        engine: ``copy`` or ``paged`` (``kvbench serve --engine``).
        block_size: ``--block-size``, tokens (vLLM's, so both caches keep the same blocks).
        num_threads: ``--threads`` (torch intra-op threads); ``None`` = kvbench's default.
        dtype: ``--dtype``.
        served_model_name: the name requests use (vLLM's, so one client config fits both).
        extra_args: more ``kvbench serve`` flags, as given (``--cache-size``, ``--replica-id``).
    """

    model_dir: Path | None
    log_path: Path
    engine: str = "copy"
    block_size: int = 32
    num_threads: int | None = None
    dtype: str = "float32"
    served_model_name: str = "kvbench-default"
    startup_timeout_s: float = 900.0
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.engine not in ("copy", "paged"):
            raise ValueError(f"engine must be 'copy' or 'paged', got {self.engine!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1 or None, got {self.num_threads}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")


class KvbenchServer(ServerProcess):
    """``python -m kvbench.cli serve --port 0`` in kvbench's own interpreter; the port it picked is
    read from the URL line it prints once its socket is bound."""

    name = "kvbench serve"

    def __init__(self, config: KvbenchServerConfig) -> None:
        super().__init__(config.log_path, config.startup_timeout_s)
        self.config = config

    def command(self) -> list[str]:
        c = self.config
        command = [
            sys.executable,
            "-m",
            "kvbench.cli",
            "serve",
            "--port",
            "0",
            *(["--model", str(c.model_dir)] if c.model_dir is not None else []),
            "--served-model-name",
            c.served_model_name,
            "--engine",
            c.engine,
            "--block-size",
            str(c.block_size),
            "--dtype",
            c.dtype,
        ]
        threads = ["--threads", str(c.num_threads)] if c.num_threads is not None else []
        return command + threads + list(c.extra_args)

    def environment(self) -> dict[str, str]:
        return {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

    def _find_port(self) -> int | None:
        match = _KVBENCH_URL.search(self.log_text().split("\n", 1)[-1])  # past the command line
        return int(match.group(1)) if match else None
