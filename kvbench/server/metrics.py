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
``kvbench:num_requests_running``           gauge    0 or 1: the engine serves one request at a time
``kvbench:num_requests_waiting``           gauge    requests queued for the engine
=========================================  =======  ==================================================

As in vLLM, per finished request ``queries += prompt_tokens`` and ``hits += cached_tokens``, so
``hits / queries`` is the token hit rate and 100% is unreachable (the last prompt token is always
recomputed). Every sample carries a ``model_name`` label. kvbench's client reads these names or
vLLM's (``vllm:prefix_cache_queries_total``, ...); see :func:`kvbench.backends.openai.reconcile.parse_prefix_cache_counters`.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "kvbench:"

_COUNTERS = (
    ("prefix_cache_queries", "num_queried_tokens", "Prefix cache queries, in prompt tokens."),
    ("prefix_cache_hits", "num_hit_tokens", "Prefix cache hits, in prompt tokens."),
    ("prompt_tokens", "num_prompt_tokens", "Prompt tokens of finished requests."),
    ("generation_tokens", "num_generation_tokens", "Output tokens of finished requests."),
    ("request_success", "num_succeeded", "Requests that finished."),
    ("request_failure", "num_failed", "Requests refused by the engine or failed in it."),
)
_GAUGES = (
    ("num_requests_running", "num_running", "Requests in the engine (one at a time)."),
    ("num_requests_waiting", "num_waiting", "Requests waiting for the engine."),
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
    num_running: int = 0
    num_waiting: int = 0

    def record_success(self, prompt_tokens: int, cached_tokens: int, output_tokens: int) -> None:
        """Count one finished request (vLLM's rule: queries += prompt, hits += cached)."""
        self.num_queried_tokens += prompt_tokens
        self.num_hit_tokens += cached_tokens
        self.num_prompt_tokens += prompt_tokens
        self.num_generation_tokens += output_tokens
        self.num_succeeded += 1


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(counters: ServerCounters, model_name: str) -> str:
    """The Prometheus text exposition (format 0.0.4) of ``counters``, one family per metric."""
    labels = f'{{model_name="{_label(model_name)}"}}'
    lines = []
    for name, attribute, help_text in _COUNTERS:
        lines += [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} counter",
                  f"{PREFIX}{name}_total{labels} {float(getattr(counters, attribute))}"]
    for name, attribute, help_text in _GAUGES:
        lines += [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} gauge",
                  f"{PREFIX}{name}{labels} {float(getattr(counters, attribute))}"]
    return "\n".join(lines) + "\n"
