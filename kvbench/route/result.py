"""What one routing policy did: hit rates, copies of popular prefixes, load imbalance, latencies.

Definitions (units in the names):

* ``token_hit_rate``: cached prompt tokens / prompt tokens over all replicas; ``replica_token_hit_rates``
  the same per replica (0 for a replica that got nothing).
* ``prefix_copies_mean`` / ``prefix_copies_max``: over the trace's most shared prefixes
  (:func:`kvbench.route.cluster.popular_prefixes`), how many replicas stored each one (1 is ideal;
  N means every replica spent pool space on its own copy).
* ``requests_max_over_mean`` / ``busy_max_over_mean``: load imbalance, the busiest replica's requests
  (or busy time) over the mean across all replicas (1.0 = perfectly even).
* queue and TTFT percentiles: ``mean_/median_/p90_/p99_{queue,ttft}_ms`` (vLLM's key rule) from the
  service model (:mod:`kvbench.route.service`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvbench.route.cluster import ClusterRun, requests_per_replica


def _ratio(values: np.ndarray) -> float:
    mean = float(values.mean()) if values.size else 0.0
    return float(values.max()) / mean if mean > 0 else 0.0


@dataclass(eq=False)
class PolicyResult:
    """One policy's :class:`ClusterRun` and its summary (:meth:`as_row`)."""

    policy: str
    run: ClusterRun
    decisions: dict[str, int] | None = None  # cache-aware: why each request went where it went

    @property
    def num_prompt_tokens(self) -> int:
        return sum(p.num_tokens for p in self.run.trace.prompts)

    @property
    def token_hit_rate(self) -> float:
        total = self.num_prompt_tokens
        return float(self.run.cached_tokens.sum()) / total if total else 0.0

    def replica_token_hit_rates(self) -> list[float]:
        prompt_tokens = np.array([p.num_tokens for p in self.run.trace.prompts])
        rates = []
        for replica in range(self.run.config.num_replicas):
            mine = self.run.replica == replica
            total = int(prompt_tokens[mine].sum())
            rates.append(float(self.run.cached_tokens[mine].sum()) / total if total else 0.0)
        return rates

    def prefix_copies(self) -> list[int]:
        """Replicas holding each popular prefix, most shared prefix first."""
        return [len(self.run.copies[key]) for key in self.run.trace.popular]

    def as_row(self) -> dict[str, Any]:
        """One Parquet/table row."""
        run, copies = self.run, self.prefix_copies()
        row: dict[str, Any] = {
            "policy": self.policy,
            "num_replicas": run.config.num_replicas,
            "num_requests": run.trace.num_requests,
            "prompt_tokens": self.num_prompt_tokens,
            "cached_prompt_tokens": int(run.cached_tokens.sum()),
            "token_hit_rate": self.token_hit_rate,
            "replica_token_hit_rates": self.replica_token_hit_rates(),
            "replica_requests": requests_per_replica(run).tolist(),
            "replica_busy_s": (run.busy_ms / 1e3).tolist(),
            "prefix_copies_mean": float(np.mean(copies)) if copies else None,
            "prefix_copies_max": max(copies) if copies else None,
            "requests_max_over_mean": _ratio(requests_per_replica(run).astype(float)),
            "busy_max_over_mean": _ratio(run.busy_ms),
        }
        for metric, values in (("queue", run.queue_ms), ("ttft", run.ttft_ms), ("e2e", run.e2e_ms)):
            row[f"mean_{metric}_ms"] = float(values.mean()) if values.size else None
            for name, q in (("median", 50), ("p90", 90), ("p99", 99)):
                row[f"{name}_{metric}_ms"] = float(np.percentile(values, q)) if values.size else None
        return row
