"""Counters of ``kvbench serve`` and their Prometheus text at ``GET /metrics``.

Names follow vLLM's v1 metrics with kvbench's own prefix, so a reader of vLLM dashboards knows them
and nobody mistakes this server for vLLM (REFERENCES.md section 1, "Metrics"):

=========================================  =======  ==================================================
``kvbench:prefix_cache_queries_total``     counter  prompt tokens looked up (every prompt token counts)
``kvbench:prefix_cache_hits_total``        counter  prompt tokens served from the cache
``kvbench:prompt_tokens_total``            counter  prompt tokens of finished requests
``kvbench:generation_tokens_total``        counter  output tokens of finished requests
``kvbench:request_success_total``          counter  requests that finished
``kvbench:request_failure_total``          counter  requests refused by the engine or failed in it
``kvbench:request_abort_total``            counter  requests whose client left first (queued or running)
``kvbench:num_requests_running``           gauge    sequences in the engine's running batch (copy: 0 or 1)
``kvbench:num_requests_waiting``           gauge    sequences queued for the engine
``kvbench:cache_config_info``              gauge    1, labels as ``vllm:cache_config_info``: ``block_size``,
                                                    ``num_gpu_blocks`` (the cache's blocks),
                                                    ``enable_prefix_caching``
``kvbench:external_prefix_cache_queries``  counter  paged ``--host-tier`` only: prompt tokens admitted
``kvbench:external_prefix_cache_hits``     counter  paged ``--host-tier`` only: of them, loaded from the tier
=========================================  =======  ==================================================

The two ``external_`` counters (``_total`` samples) are vLLM's names for KV-connector hits (its CPU
offloading connector among them); ``prefix_cache_hits`` counts GPU and host hits together, as vLLM's
``num_cached_tokens`` does. They are counted by the same rule, from the same finished request's record
(``external_queries += prompt_tokens``, ``external_hits += host_cached_tokens``), so the host tier's
hits are always a subset of the prefix cache's and its queries equal them, whatever happens to a
request: one whose client left after its host-tier hit was loaded adds to neither (counted at
admission in the engine, such a request showed 80 external hits against 0 prefix-cache hits).

As in vLLM, per finished request ``queries += prompt_tokens`` and ``hits += cached_tokens``, so
``hits / queries`` is the token hit rate and 100% is unreachable (the last prompt token is always
recomputed). An aborted request (its client left) adds to ``request_abort_total`` only; vLLM v1
counts it as ``vllm:request_success_total{finished_reason="abort"}``. Every sample carries a
``model_name`` label. kvbench's client reads these names or
vLLM's (``vllm:prefix_cache_queries_total``, ...); see
:func:`kvbench.backends.openai.metrics.parse_prefix_cache_counters`.

The text is written by ``prometheus_client`` itself (:func:`prometheus_client.generate_latest` over a
registry that holds only this server's collector), so a counter's ``# TYPE`` line names it as its
samples do (``kvbench:prefix_cache_queries_total``), which is what Prometheus' parsers expect.
``num_requests_running`` and ``num_requests_waiting`` are vLLM's scheduler gauges (its
``scheduler_stats.num_running_reqs`` / ``num_waiting_reqs``). The paged engine batches: they are its
scheduler's running and waiting sequences (:meth:`PagedEngine.num_sequences`; each of ``n`` parallel
samples is one sequence once forked, as each child request is in vLLM v1). The copy engine serves one
request at a time: with any in flight one is running and the rest wait.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

PREFIX = "kvbench:"

_COUNTERS = (
    ("prefix_cache_queries", "num_queried_tokens", "Prefix cache queries, in prompt tokens."),
    ("prefix_cache_hits", "num_hit_tokens", "Prefix cache hits, in prompt tokens."),
    ("prompt_tokens", "num_prompt_tokens", "Prompt tokens of finished requests."),
    ("generation_tokens", "num_generation_tokens", "Output tokens of finished requests."),
    ("request_success", "num_succeeded", "Requests that finished."),
    ("request_failure", "num_failed", "Requests refused by the engine or failed in it."),
    ("request_abort", "num_aborted", "Requests stopped because their client left (queued or running)."),
)
_GAUGES = (
    (
        "num_requests_running",
        "num_running",
        "Sequences in the engine's running batch (each of n parallel samples counts once forked; copy "
        "engine: 0 or 1).",
    ),
    (
        "num_requests_waiting",
        "num_waiting",
        "Sequences waiting for the engine (each of n parallel samples counts once forked).",
    ),
)


@dataclass
class ServerCounters:
    """Running totals of one server process (mutated on the event loop only)."""

    num_queried_tokens: int = 0
    num_hit_tokens: int = 0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_succeeded: int = 0
    num_failed: int = 0
    num_aborted: int = 0  # the client left before the request finished (vLLM's finished_reason "abort")
    num_in_flight: int = 0  # submitted and not yet finished, failed or cancelled
    num_host_queried_tokens: int = 0  # of num_queried_tokens, those of requests run with a host tier
    num_host_hit_tokens: int = 0  # of num_hit_tokens, those loaded from the host tier
    engine_sequences: Callable[[], tuple[int, int]] | None = None  # a batching engine's (running, waiting)
    host_tier: bool = False  # the engine has a host KV tier: the external_ counters are published

    @property
    def num_running(self) -> int:
        if self.engine_sequences is not None:
            return self.engine_sequences()[0]
        return min(self.num_in_flight, 1)  # one request at a time

    @property
    def num_waiting(self) -> int:
        if self.engine_sequences is not None:
            return self.engine_sequences()[1]
        return self.num_in_flight - self.num_running

    def record_success(
        self,
        prompt_tokens: int,
        cached_tokens: int,
        output_tokens: int,
        host_cached_tokens: int | None = None,
    ) -> None:
        """Count one finished request (vLLM's rule: queries += prompt, hits += cached; with a host
        tier, ``host_cached_tokens`` of ``cached_tokens`` came from it: external queries += prompt,
        external hits += host_cached)."""
        self.num_queried_tokens += prompt_tokens
        self.num_hit_tokens += cached_tokens
        if host_cached_tokens is not None:
            self.num_host_queried_tokens += prompt_tokens
            self.num_host_hit_tokens += host_cached_tokens
        self.num_prompt_tokens += prompt_tokens
        self.num_generation_tokens += output_tokens
        self.num_succeeded += 1


def cache_config_labels(block_size: int | None, capacity_blocks: int | None) -> dict[str, str]:
    """The labels of ``kvbench:cache_config_info`` for a cache of ``capacity_blocks`` blocks of
    ``block_size`` tokens, or for no cache (both ``None``; written ``"None"`` as vLLM does)."""
    return {
        "block_size": str(block_size),
        "num_gpu_blocks": str(capacity_blocks),
        "enable_prefix_caching": str(capacity_blocks is not None),
    }


class _Collector:
    """The families of one :class:`ServerCounters`, each with one ``model_name`` sample, and the
    cache's settings (when given) as an info gauge."""

    def __init__(
        self, counters: ServerCounters, model_name: str, cache_labels: dict[str, str] | None
    ) -> None:
        self.counters, self.model_name, self.cache_labels = counters, model_name, cache_labels

    def collect(self) -> Iterator[Metric]:
        for name, attribute, help_text in _COUNTERS:  # exposed as PREFIX + name + "_total"
            family = CounterMetricFamily(PREFIX + name, help_text, labels=["model_name"])
            family.add_metric([self.model_name], float(getattr(self.counters, attribute)))
            yield family
        for name, attribute, help_text in _GAUGES:
            family = GaugeMetricFamily(PREFIX + name, help_text, labels=["model_name"])
            family.add_metric([self.model_name], float(getattr(self.counters, attribute)))
            yield family
        yield from self._host_tier()
        if self.cache_labels is not None:
            names = ["model_name", *self.cache_labels]
            family = GaugeMetricFamily(PREFIX + "cache_config_info", "Prefix cache settings.", labels=names)
            family.add_metric([self.model_name, *self.cache_labels.values()], 1.0)
            yield family

    def _host_tier(self) -> Iterator[Metric]:
        if not self.counters.host_tier:
            return
        for name, value, help_text in (
            ("queries", self.counters.num_host_queried_tokens, "Host KV tier queries, in prompt tokens."),
            ("hits", self.counters.num_host_hit_tokens, "Host KV tier hits (loaded back), in prompt tokens."),
        ):
            family = CounterMetricFamily(
                PREFIX + "external_prefix_cache_" + name, help_text, labels=["model_name"]
            )
            family.add_metric([self.model_name], float(value))
            yield family


def render_metrics(
    counters: ServerCounters, model_name: str, cache_labels: dict[str, str] | None = None
) -> str:
    """The Prometheus text exposition (format 0.0.4) of ``counters``, one family per metric, and
    ``kvbench:cache_config_info`` when ``cache_labels`` (:func:`cache_config_labels`) are given."""
    registry = CollectorRegistry(auto_describe=False)  # per call: no process-wide registry
    registry.register(_Collector(counters, model_name, cache_labels))
    return generate_latest(registry).decode("utf-8")
