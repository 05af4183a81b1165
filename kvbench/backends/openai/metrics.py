"""Reading a server's ``/metrics``: the one Prometheus text parser kvbench uses.

Parsing is :func:`prometheus_client.parser.text_string_to_metric_families` (the Prometheus
project's own Python parser); this module only picks out the samples kvbench reads:

* the prefix-cache counters (:func:`parse_prefix_cache_counters`) of ``kvbench serve``, vLLM v1 and
  vLLM's deprecated GPU names, which :mod:`kvbench.backends.openai.reconcile` compares with what
  the responses reported;
* vLLM's pool size, a label of ``vllm:cache_config_info`` (:func:`vllm_num_gpu_blocks`), which
  the peer harness needs to size its prediction;
* the server's cache settings (:func:`detect_cache_settings`): block size, pool size and whether
  prefix caching is on, from ``vllm:cache_config_info`` (or ``kvbench serve``'s
  ``kvbench:cache_config_info``, same labels); SGLang is recognized by its counters
  (``sglang:cached_tokens_total``, whose ``cache_source`` label splits the hits, and
  ``sglang:prompt_tokens_total``) and publishes no block size (its default ``page_size`` is 1).

Samples are matched by *sample* name (``vllm:prefix_cache_queries_total``), never by family name, so
both exposition styles read the same: prometheus_client's (``# TYPE x_total counter``, the family
is ``x``) and a ``# TYPE x counter`` header over ``x_total`` samples (then an untyped family).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

# Counter families, most specific first: kvbench serve's, vLLM v1's, vLLM's deprecated GPU ones, SGLang's
# (prompt tokens and cached tokens of finished requests: the same ratio).
QUERY_COUNTERS = (
    "kvbench:prefix_cache_queries_total",
    "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_queries_total",
    "sglang:prompt_tokens_total",
)
HIT_COUNTERS = (
    "kvbench:prefix_cache_hits_total",
    "vllm:prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_hits_total",
    "sglang:cached_tokens_total",
)
VLLM_CACHE_CONFIG = "vllm:cache_config_info"  # an info gauge whose labels are vLLM's CacheConfig
CACHE_CONFIG_INFOS = (VLLM_CACHE_CONFIG, "kvbench:cache_config_info")  # kvbench serve's mirrors vLLM's labels
SGLANG_PAGE_SIZE = 1  # SGLang's default --page-size: the radix tree matches per token


def metric_samples(text: str | None) -> list[Sample]:
    """Every sample (``name``, ``labels`` dict, ``value``) in Prometheus text, in order.

    ``None`` or empty text gives ``[]``. Text that stops being valid Prometheus exposition gives
    the samples before the first malformed line (a scrape is evidence, not input to reject).
    """
    samples: list[Sample] = []
    if not text:
        return samples
    try:
        for family in text_string_to_metric_families(text):
            samples.extend(family.samples)
    except ValueError:
        pass
    return samples


def sample_sum(samples: Iterable[Sample], name: str) -> float | None:
    """The sum of every sample called ``name`` over its label sets; ``None`` when there is none."""
    values = [sample.value for sample in samples if sample.name == name]
    return float(sum(values)) if values else None


@dataclass(frozen=True)
class PrefixCacheCounters:
    """A server's prefix-cache counters at one moment, in tokens (vLLM: queries = prompt tokens)."""

    queries_tokens: float
    hits_tokens: float
    family: str  # the query counter's sample name, e.g. "vllm:prefix_cache_queries_total"

    def since(self, before: PrefixCacheCounters | None) -> PrefixCacheCounters | None:
        """The counts added after ``before`` was scraped; ``None`` when ``before`` is missing or
        counted another family."""
        if before is None or before.family != self.family:
            return None
        return PrefixCacheCounters(
            self.queries_tokens - before.queries_tokens, self.hits_tokens - before.hits_tokens, self.family
        )


def parse_prefix_cache_counters(text: str | None) -> PrefixCacheCounters | None:
    """The prefix-cache counters in Prometheus text, summed over label sets (engines, models); the
    first family of :data:`QUERY_COUNTERS` whose query and hit counters are both present wins.
    ``None`` when there are none (or ``text`` is ``None``)."""
    samples = metric_samples(text)
    for queries_name, hits_name in zip(QUERY_COUNTERS, HIT_COUNTERS):
        queries, hits = sample_sum(samples, queries_name), sample_sum(samples, hits_name)
        if queries is not None and hits is not None:
            return PrefixCacheCounters(queries, hits, queries_name)
    return None


def vllm_num_gpu_blocks(text: str | None) -> int | None:
    """The pool size vLLM reports as label ``num_gpu_blocks`` of ``vllm:cache_config_info`` (null
    block included); ``None`` when absent or not a number (vLLM writes ``"None"`` before profiling)."""
    for sample in metric_samples(text):
        if (
            sample.name == VLLM_CACHE_CONFIG
            and (blocks := _label_int(sample.labels, "num_gpu_blocks")) is not None
        ):
            return blocks
    return None


@dataclass(frozen=True)
class ServerCacheSettings:
    """What a server's ``/metrics`` says about its prefix cache; ``None`` = not published.

    Attributes:
        server: ``vllm``, ``kvbench`` or ``sglang`` (whose metrics were found), or ``None``.
        block_size: tokens per block. num_gpu_blocks: the pool (vLLM: null block included).
        prefix_caching: whether prefix caching is on.
    """

    server: str | None = None
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    prefix_caching: bool | None = None


def _label_int(labels: dict[str, str], name: str) -> int | None:
    value = labels.get(name, "")
    return int(value) if value.isdigit() else None


def _label_bool(labels: dict[str, str], name: str) -> bool | None:
    return {"true": True, "false": False}.get(labels.get(name, "").lower())


def detect_cache_settings(text: str | None) -> ServerCacheSettings:
    """The cache settings in Prometheus text (see the module docstring); every field ``None`` when
    nothing is published."""
    samples = metric_samples(text)
    for sample in samples:
        if sample.name in CACHE_CONFIG_INFOS:
            labels = sample.labels
            return ServerCacheSettings(
                sample.name.split(":")[0],
                _label_int(labels, "block_size"),
                _label_int(labels, "num_gpu_blocks"),
                _label_bool(labels, "enable_prefix_caching"),
            )
    if sample_sum(samples, "sglang:cached_tokens_total") is not None:
        return ServerCacheSettings("sglang")
    return ServerCacheSettings()
