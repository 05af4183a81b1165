"""The real routers a fleet runs behind, started on loopback: sglang-router and vllm-router.

Both install from PyPI with the ``[fleet]`` extra (``sglang-router==0.3.2``, ``vllm-router==0.1.17``;
Rust inside the wheels, CPU-only) and start the same way: ``python -m MODULE.launch_router --host
--port --prometheus-port --policy --worker-urls URL...``. Each answers ``GET /health`` with 200 once it
has registered its workers, and serves its own Prometheus counters on ``--prometheus-port``
(sglang-router's ``smg_*``, vllm-router's ``vllm_router_*``), never on its serving port.

A router is a :class:`~kvbench.peer.server.ServerProcess`: its own process group, stopped by PID
(SIGTERM, then SIGKILL), also at interpreter exit.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from kvbench.backends.openai.admin import call
from kvbench.errors import InputError
from kvbench.peer.server import ServerProcess, free_port


class RouterKind(str, Enum):
    SGLANG = "sglang"
    VLLM = "vllm"


@dataclass(frozen=True)
class RouterSpec:
    """What one router package is: its importable module, the name it is known by and its policies
    (``--policy`` choices of the pinned version's ``launch_router --help``)."""

    module: str
    package: str
    policies: tuple[str, ...]


ROUTERS = {
    RouterKind.SGLANG: RouterSpec(
        "sglang_router",
        "sglang-router",
        ("cache_aware", "round_robin", "random", "power_of_two"),
    ),
    RouterKind.VLLM: RouterSpec(
        "vllm_router",
        "vllm-router",
        (
            "cache_aware",
            "round_robin",
            "random",
            "power_of_two",
            "consistent_hash",
            "kv_aware",
            "sticky_least_loaded",
        ),
    ),
}


def check_router(kind: RouterKind, policies: list[str]) -> RouterSpec:
    """The spec of ``kind`` once its package imports and it knows every policy of ``policies``.

    Raises:
        InputError: the package is not installed (naming the ``[fleet]`` extra), or a policy is not
            one of the router's.
    """
    spec = ROUTERS[kind]
    if importlib.util.find_spec(spec.module) is None:
        raise InputError(
            f"--router {kind.value} needs {spec.package}: pip install -c constraints-cpu.txt -e '.[fleet]'"
        )
    unknown = [policy for policy in policies if policy not in spec.policies]
    if unknown:
        raise InputError(
            f"--policy {unknown[0]}: not a policy of {spec.package} (choose from {', '.join(spec.policies)})"
        )
    return spec


class RouterProcess(ServerProcess):
    """``python -m MODULE.launch_router`` over ``worker_urls`` with one ``policy``, on a free port.

    ``metrics_url`` is its Prometheus endpoint (its own counters).
    """

    def __init__(
        self,
        kind: RouterKind,
        policy: str,
        worker_urls: list[str],
        log_path: Path,
        startup_timeout_s: float = 120.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        super().__init__(log_path, startup_timeout_s, free_port())
        self.extra_args = extra_args
        self.spec = ROUTERS[kind]
        self.name = f"{self.spec.package} ({policy})"
        self.policy = policy
        self.worker_urls = list(worker_urls)
        self.prometheus_port = free_port()

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}/metrics"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            f"{self.spec.module}.launch_router",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(self.prometheus_port),
            "--policy",
            self.policy,
            "--worker-urls",
            *self.worker_urls,
            *self.extra_args,
        ]


KV_AWARE = "kv_aware"  # vllm-router's policy that routes on the workers' KV cache events


def kv_event_source_args(worker_urls: list[str], block_size: int) -> tuple[str, ...]:
    """vllm-router 0.1.17's static KV event sources for ``kv_aware`` over ``worker_urls``: each worker's
    publisher and replay socket from its ``GET /kv_event_sources`` (vLLM's per-rank map; rank 0), the
    block size, and the model its ``/v1/models`` lists first. (The router's own discovery reads the
    block size from vLLM's ``/get_server_info``, which SGLang-shaped workers do not answer.)

    Raises:
        InputError: a worker publishes no events (start it with ``--kv-events``) or lists no model.
    """
    from kvbench.backends.openai.admin import list_models

    args: list[str] = []
    model = None
    for url in worker_urls:
        status, body = call(f"{url}/kv_event_sources", "", timeout_s=10, method="GET")
        try:
            rank = json.loads(body)["0"] if status == 200 else None
        except (ValueError, KeyError, TypeError):
            rank = None
        if not rank or not rank.get("endpoint"):
            raise InputError(
                f"--policy kv_aware: {url} publishes no KV events (GET /kv_event_sources: HTTP {status}); "
                "start it with --kv-events tcp://127.0.0.1:0"
            )
        args += ["--kv-event-source", f"{url}={rank['endpoint']}"]
        if rank.get("replay_endpoint"):
            args += ["--kv-event-replay-source", f"{url}={rank['replay_endpoint']}"]
        models, problem = list_models(f"{url}/v1", "")
        if not models:
            raise InputError(f"--policy kv_aware: {url} lists no model ({problem})")
        model = model or models[0]
    return (*args, "--kv-event-block-size", str(block_size), "--kv-event-model", model or "")
