"""One fleet experiment: N replicas behind a real router, one run per routing policy (``kvbench fleet``).

For each policy, in order: every replica's prefix cache is reset (each replica directly, never
through the router; a replica that does not answer 2xx stops the experiment), the router starts over
the replicas with that policy, the trace runs through it as ``kvbench run --backend openai`` with
``--replica-metrics`` on every replica and ``--fleet-policy`` (so each row's ``expected_cached_tokens``
is ``kvbench route``'s prediction for that policy, and the reconciliation compares like with like),
the router's own counters are read before and after (``--router-metrics``), and the router stops.
The replicas are ``kvbench serve`` processes started here (``--replicas N``), or servers already running
(``--worker-url``, e.g. vLLM; their caches must answer ``POST /reset_prefix_cache``).

Every process started here is stopped on exit, on Ctrl-C and on SIGTERM (each in its own process
group, by PID); the rows of the policies already run, and of the one interrupted, stay written.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.backends.openai.admin import reset_prefix_cache
from kvbench.backends.openai.hygiene import Hygiene
from kvbench.errors import InputError
from kvbench.fleet.routers import KV_AWARE, RouterKind, RouterProcess, check_router, kv_event_source_args
from kvbench.peer.kvbench_server import KvbenchServer, KvbenchServerConfig
from kvbench.peer.server import PeerError
from kvbench.run.config import BackendKind, RunConfig, RunFlags, ServerFlags
from kvbench.run.execute import RunInterrupted, RunOutcome

Say = Callable[[str], None]


@dataclass(frozen=True)
class FleetConfig:
    """One ``kvbench fleet`` experiment.

    Attributes:
        source: a scenario or trace file (text prompts: sglang-router refuses token ids).
        router: which real router.
        policies: the router's ``--policy`` values, run in this order, each on fresh caches.
        out_dir: the folder for one Parquet file per policy, ``fleet.json`` and the logs.
        num_replicas: ``kvbench serve`` replicas to start (ignored with ``worker_urls``).
        worker_urls: servers already running (root URLs), used instead of starting replicas.
        engine: the replicas' ``--engine``; block_size: their ``--block-size`` (tokens).
        cache_size: their ``--cache-size`` (blocks or bytes; ``None``: kvbench serve's default).
        model: a local checkpoint for the replicas (``None``: kvbench's embedded model).
        run: the run's flags (``--requests``, ``--concurrency``, ``--max-tokens``, ...).
    """

    source: Path
    router: RouterKind
    policies: tuple[str, ...]
    out_dir: Path
    num_replicas: int = 3
    worker_urls: tuple[str, ...] = ()
    engine: str = "paged"
    block_size: int = 16
    cache_size: str | None = None
    model: Path | None = None
    run: RunFlags = field(default_factory=RunFlags)

    def __post_init__(self) -> None:
        object.__setattr__(self, "router", RouterKind(self.router))
        object.__setattr__(self, "worker_urls", tuple(url.rstrip("/") for url in self.worker_urls))
        if not self.policies:
            raise ValueError("--policy: give at least one policy")
        if len(set(self.policies)) != len(self.policies):
            raise ValueError("--policy: a policy is listed twice")
        if not self.worker_urls and self.num_replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {self.num_replicas}")
        if self.block_size < 1:
            raise ValueError(f"--block-size must be >= 1, got {self.block_size}")


@dataclass
class PolicyRun:
    """One policy's run: its outcome (rows in ``outcome.path``; the router's counters over the run in
    its metadata, ``router_counters``)."""

    policy: str
    outcome: RunOutcome


@dataclass
class FleetOutcome:
    """Every policy run so far, in order, and the replicas' URLs (the order of the tables)."""

    config: FleetConfig
    worker_urls: list[str]
    runs: list[PolicyRun] = field(default_factory=list)

    @property
    def summary_path(self) -> Path:
        return self.config.out_dir / "fleet.json"


def run_fleet(
    config: FleetConfig,
    say: Say,
    run_one: Callable[[RunConfig], RunOutcome],
    outcome: FleetOutcome | None = None,
) -> FleetOutcome:
    """Carry out ``config`` (module docstring); ``run_one(run_config)`` runs one policy's trace (the
    caller's progress display around :func:`kvbench.run.api.run`). ``outcome``: an empty outcome to
    fill as policies finish, so a caller still holds the finished ones when an interrupt unwinds.

    Raises:
        InputError: a router that is not installed or a policy it lacks, a replica or router that
            does not start, a cache reset that fails, or the run's own errors.
        RunInterrupted: Ctrl-C or SIGTERM during a run (its rows are written; every process stops).
    """
    check_router(config.router, list(config.policies))
    config.out_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        urls = list(config.worker_urls) or _start_replicas(config, stack, say)
        outcome = outcome if outcome is not None else FleetOutcome(config, urls)
        outcome.worker_urls = urls
        publishing = _publishing(urls, say)
        for policy in config.policies:
            _reset_caches(urls, say)
            kv_args = kv_event_source_args(urls, config.block_size) if policy == KV_AWARE else ()
            router = stack.enter_context(
                RouterProcess(
                    config.router, policy, urls, config.out_dir / f"router-{policy}.log", extra_args=kv_args
                )
            )
            _wait(router)
            say(f"{router.name} on {router.url} over {len(urls)} replicas")
            run_config = RunConfig(
                config.source,
                BackendKind.OPENAI,
                run=config.run,
                server=ServerFlags(
                    base_url=router.base_url,
                    replica_metrics=tuple(urls),
                    router_metrics=router.metrics_url,
                    fleet_policy=_model_name(config.router, policy),
                    # vllm-router's kv_aware skips its KV lookup for a request with a cache_salt: runs
                    # are kept apart by a unique prefix instead, for every policy, so they compare
                    hygiene=Hygiene.NONCE if KV_AWARE in config.policies else None,
                    kv_events=publishing,
                ),
                out=config.out_dir / f"{policy}.parquet",
            )
            try:
                outcome.runs.append(PolicyRun(policy, run_one(run_config)))
            except RunInterrupted as interrupted:  # its rows are written: keep them in the summary
                outcome.runs.append(PolicyRun(policy, interrupted.outcome))
                raise
            finally:
                router.stop()
                write_summary(outcome)
    return outcome


def _model_name(router: RouterKind, policy: str) -> str:
    """The ``--fleet-policy`` of a router's policy: its own cache-aware model where kvbench route has
    one per router (sglang-router's tree over characters, vllm-router's over token ids)."""
    if policy == "cache_aware":
        return "sglang_cache_aware" if router is RouterKind.SGLANG else "vllm_cache_aware"
    return policy


def _start_replicas(config: FleetConfig, stack: contextlib.ExitStack, say: Say) -> list[str]:
    """Start ``config.num_replicas`` ``kvbench serve`` processes (stopped by ``stack``); their URLs."""
    extra = ("--cache-size", config.cache_size) if config.cache_size is not None else ()
    extra += ("--kv-events", "tcp://127.0.0.1:0")  # read by every run (and by kv_aware's router)
    replicas = []
    for index in range(config.num_replicas):
        replica_config = KvbenchServerConfig(
            config.model,
            config.out_dir / f"replica-{index}.log",
            engine=config.engine,
            block_size=config.block_size,
            startup_timeout_s=300.0,
            extra_args=extra,
        )
        replicas.append(stack.enter_context(KvbenchServer(replica_config)))
    for replica in replicas:
        _wait(replica)
    urls = [replica.url for replica in replicas]
    say(f"{len(urls)} kvbench serve replicas (--engine {config.engine}): {', '.join(urls)}")
    return urls


def _publishing(urls: list[str], say: Say) -> tuple[str, ...]:
    """The replicas that publish KV events (``GET /kv_event_sources``), read by every policy's run;
    a line names those that do not."""
    from kvbench.events.discover import sources_of_server

    found = []
    for url in urls:
        try:
            sources_of_server(url)
            found.append(url)
        except InputError:
            pass
    if len(found) < len(urls):
        say(
            f"{len(urls) - len(found)} of {len(urls)} replicas publish no KV events: no block counts for them"
        )
    return tuple(found)


def _wait(process) -> None:
    try:
        process.wait_healthy()
    except PeerError as exc:
        raise InputError(str(exc).splitlines()[0] + f" (log: {process.log_path})") from None


def _reset_caches(urls: list[str], say: Say) -> None:
    """Reset every replica's prefix cache directly; any replica that does not answer 2xx is an error
    (a fleet with one warm replica is not a fresh start)."""
    for url in urls:
        endpoint, note = reset_prefix_cache(url, "")
        if endpoint is None:
            raise InputError(
                f"{url}: prefix-cache reset failed ({note}); a fresh fleet needs every replica reset"
            )
    say(f"prefix caches reset on all {len(urls)} replicas")


def write_summary(outcome: FleetOutcome) -> Path:
    """``fleet.json``: per policy, its rows' file, the replicas' own ``/metrics`` report, the fleet
    expectation, the router's counters and the replicas' KV event report."""
    summary: dict[str, Any] = {
        "router": outcome.config.router.value,
        "replicas": outcome.worker_urls,
        "policies": [
            {
                "policy": run.policy,
                "rows": str(run.outcome.path),
                "replica_metrics": run.outcome.metadata.get("replica_metrics"),
                "fleet_expectation": run.outcome.metadata.get("fleet_expectation"),
                "router_counters": run.outcome.metadata.get("router_counters"),
                "kv_events": run.outcome.metadata.get("kv_events"),
            }
            for run in outcome.runs
        ],
    }
    outcome.summary_path.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return outcome.summary_path
