"""``--replica-metrics URL``: each replica's own ``/metrics`` before and after a run behind a router.

A router's ``/metrics`` is not the fleet's: sglang-router 0.3.2 answers 404 on its serving port (its
own counters are on ``--prometheus-port``), and vllm-router 0.1.17 forwards the scrape to one worker,
so a before/after delta there mixes workers (negative deltas, or one worker's hit rate passed off as
the fleet's). Scraping each replica directly gives per replica: requests, prompt tokens (the prefix
cache's queries), cached tokens (its hits) and the hit rate, and the fleet as their sum.

The sum is checked against what the client saw (ok responses' ``usage``): the fleet's prompt tokens
must equal the client's. Fewer means a replica is missing from the list (or a URL is a router's,
forwarding to one worker); more means other traffic reached the replicas during the run. Either way
one line says so and the sum is not labelled the fleet's. Per replica, the client's own counts come
from the rows whose ``replica_id`` (the ``X-Kvbench-Replica`` header) is that URL's ``host:port``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from kvbench.backends.openai.admin import call, server_root
from kvbench.backends.openai.metrics import metric_samples, parse_prefix_cache_counters, sample_sum

REQUEST_COUNTERS = (  # finished requests: kvbench serve's, vLLM's, SGLang's
    "kvbench:request_success_total",
    "vllm:request_success_total",
    "sglang:num_requests_total",
)
METRICS_TIMEOUT_S = 10.0
ROUTER_COUNTER_PREFIXES = ("smg_", "vllm_router_")  # sglang-router 0.3.2's, vllm-router 0.1.17's


@dataclass(frozen=True)
class Scrape:
    """One replica's ``/metrics`` answer: the text (``None`` when it gave none) and the HTTP status
    (0: no response)."""

    text: str | None
    status: int


def scrape_replicas(urls: Sequence[str], key: str) -> list[Scrape]:
    """Each replica's ``/metrics`` (``url`` is its root, with or without ``/v1`` or ``/metrics``)."""
    scrapes = []
    for url in urls:
        root = server_root(url.rstrip("/").removesuffix("/metrics"))
        status, body = call(root + "/metrics", key, METRICS_TIMEOUT_S)
        scrapes.append(Scrape(body if status == 200 else None, status))
    return scrapes


@dataclass(frozen=True)
class ReplicaDelta:
    """One replica's counts over the run (``None``: not known); ``problem`` says why there is no delta.
    ``client_*``: what the client's rows naming this replica (``replica_id`` = the URL's
    ``host:port``) report; ``None`` when no row names it."""

    url: str
    requests: float | None = None
    prompt_tokens: float | None = None
    cached_tokens: float | None = None
    problem: str | None = None
    client_requests: int | None = None
    client_prompt_tokens: int | None = None

    @property
    def hit_rate(self) -> float | None:
        """``cached_tokens / prompt_tokens`` (fraction); ``None`` without prompt tokens."""
        if not self.prompt_tokens or self.cached_tokens is None:
            return None
        return self.cached_tokens / self.prompt_tokens


def _requests(text: str | None) -> float | None:
    samples = metric_samples(text)
    for name in REQUEST_COUNTERS:
        if (value := sample_sum(samples, name)) is not None:
            return value
    return None


def replica_delta(url: str, before: Scrape, after: Scrape) -> ReplicaDelta:
    """The counts ``url`` added between the two scrapes, or a ``problem`` naming what is missing."""
    for when, scrape in (("before", before), ("after", after)):
        if scrape.text is None:
            why = f"HTTP {scrape.status}" if scrape.status else "no answer"
            hint = " (a router's URL? give each replica's own)" if scrape.status == 404 else ""
            return ReplicaDelta(url, problem=f"no /metrics {when} the run: {why}{hint}")
    counters = parse_prefix_cache_counters(after.text)
    delta = counters.since(parse_prefix_cache_counters(before.text)) if counters else None
    if delta is None:
        return ReplicaDelta(url, problem="no prefix-cache counters at its /metrics")
    requests_before, requests_after = _requests(before.text), _requests(after.text)
    requests = None if requests_before is None or requests_after is None else requests_after - requests_before
    return ReplicaDelta(url, requests, delta.queries_tokens, delta.hits_tokens)


@dataclass(frozen=True)
class ReplicaMetrics:
    """The per-replica deltas, their sum (``fleet``: ``None`` when a replica has none), what the client
    saw over the same run (ok responses, warm-up included), and ``verdict``: one line when the sum is
    not the client's traffic (then the sum is not the fleet's), else ``None``."""

    replicas: tuple[ReplicaDelta, ...]
    fleet: ReplicaDelta | None
    client_requests: int
    client_prompt_tokens: int
    client_cached_tokens: int
    verdict: str | None

    def as_dict(self) -> dict[str, Any]:
        """The result file's ``replica_metrics`` metadata (rates as fractions)."""
        as_row = lambda delta: {**asdict(delta), "hit_rate": delta.hit_rate}  # noqa: E731
        return {
            "replicas": [as_row(delta) for delta in self.replicas],
            "fleet": None if self.fleet is None else as_row(self.fleet),
            "client_requests": self.client_requests,
            "client_prompt_tokens": self.client_prompt_tokens,
            "client_cached_tokens": self.client_cached_tokens,
            "verdict": self.verdict,
        }


def _with_client(delta: ReplicaDelta, records: Sequence[Any]) -> ReplicaDelta:
    """``delta`` with the client's counts of the ok records whose ``replica_id`` is its ``host:port``."""
    name = urlsplit(delta.url).netloc
    mine = [record for record in records if record.replica_id == name]
    if not mine:
        return delta
    prompt = sum(record.prompt_tokens for record in mine)
    return ReplicaDelta(**{**asdict(delta), "client_requests": len(mine), "client_prompt_tokens": prompt})


def _sum(deltas: Sequence[ReplicaDelta]) -> ReplicaDelta | None:
    if not deltas or any(delta.problem is not None for delta in deltas):
        return None
    requests = [delta.requests for delta in deltas]
    return ReplicaDelta(
        "fleet",
        None if None in requests else sum(requests),
        sum(delta.prompt_tokens for delta in deltas),
        sum(delta.cached_tokens for delta in deltas),
    )


def _verdict(fleet: ReplicaDelta | None, deltas: Sequence[ReplicaDelta], prompt: int) -> str | None:
    if fleet is None:
        missing = [f"{delta.url} ({delta.problem})" for delta in deltas if delta.problem is not None]
        return f"replica /metrics: no fleet sum: {'; '.join(missing)}"
    if fleet.prompt_tokens < prompt:
        return (
            f"replica /metrics: the replicas counted {fleet.prompt_tokens:,.0f} prompt tokens, fewer than "
            f"the {prompt:,} the client saw: a replica is missing from --replica-metrics (or a URL is a "
            "router forwarding /metrics to one worker); the sum is not the fleet's"
        )
    if fleet.prompt_tokens > prompt:
        return (
            f"replica /metrics: the replicas counted {fleet.prompt_tokens:,.0f} prompt tokens, more than "
            f"the {prompt:,} the client saw: other traffic reached them during the run; the sum is "
            "not this run's"
        )
    return None


def replica_metrics(
    urls: Sequence[str], before: Sequence[Scrape], after: Sequence[Scrape], records: Sequence[Any]
) -> ReplicaMetrics:
    """The report of ``urls`` from their scrapes and the run's ``records``
    (:class:`~kvbench.request.RequestRecord`, every one sent; the ok ones count)."""
    ok = [record for record in records if record.ok]
    deltas = [_with_client(replica_delta(u, b, a), ok) for u, b, a in zip(urls, before, after)]
    fleet = _sum(deltas)
    prompt = sum(record.prompt_tokens for record in ok)
    cached = sum(record.cached_prompt_tokens or 0 for record in ok)
    return ReplicaMetrics(tuple(deltas), fleet, len(ok), prompt, cached, _verdict(fleet, deltas, prompt))


def router_counters(url: str) -> dict[str, float] | None:
    """A router's own counters at its Prometheus endpoint ``url`` (sglang-router's ``smg_*``,
    vllm-router's ``vllm_router_*``; ``*_total`` series only: ``name{labels}`` -> value), or ``None``
    when it does not answer."""
    status, text = call(url, "", METRICS_TIMEOUT_S)
    if status != 200:
        return None
    values = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if line.startswith(ROUTER_COUNTER_PREFIXES) and name.partition("{")[0].endswith("_total"):
            try:
                values[name] = float(value)
            except ValueError:
                continue
    return values


def counter_deltas(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> dict[str, float] | None:
    """The counters that changed between two :func:`router_counters` readings (``None`` if either is)."""
    if before is None or after is None:
        return None
    return {
        name: value - before.get(name, 0.0) for name, value in after.items() if value != before.get(name, 0.0)
    }


@dataclass(frozen=True)
class FleetScrape:
    """What is read of a fleet before a run: each ``--replica-metrics`` replica's ``/metrics`` and the
    router's own counters (``--router-metrics``; ``None`` without the flag or an answer)."""

    replicas: list[Scrape]
    router: dict[str, float] | None


def scrape_fleet(server, key: str) -> FleetScrape:
    """The fleet's state before a run (``server``: the run's ``ServerFlags``)."""
    router = router_counters(server.router_metrics) if server.router_metrics else None
    return FleetScrape(scrape_replicas(server.replica_metrics, key), router)


def record_replica_metrics(metadata: dict, outcome, before: FleetScrape, server, key: str) -> None:
    """After the send loop: scrape the replicas again and put the report in
    ``metadata["replica_metrics"]`` and its verdict line (if any) in ``outcome.notes``; the router's
    counters over the run in ``metadata["router_counters"]`` (a line when it did not answer)."""
    if server.router_metrics:
        deltas = counter_deltas(before.router, router_counters(server.router_metrics))
        metadata["router_counters"] = deltas
        if deltas is None:
            outcome.notes.append(
                f"--router-metrics {server.router_metrics}: no answer before or after the run"
            )
    urls = server.replica_metrics
    if not urls:
        return
    after = scrape_replicas(urls, key)
    report = replica_metrics(urls, before.replicas, after, [record for _, record in outcome.records])
    metadata["replica_metrics"] = report.as_dict()
    if report.verdict is not None:
        outcome.notes.append(report.verdict)
