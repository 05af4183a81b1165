"""The policy x replica table of a fleet experiment, as plain rows (the command draws them).

Per policy and replica: the replica's own ``/metrics`` deltas (requests, prompt and cached tokens, hit
rate), and the client's rows that name it (the ``X-Kvbench-Replica`` header). Per policy: the fleet's
sum, the hit rate ``kvbench route`` expected for that policy, the requests whose reported cached
tokens fell short of the expectation by more than one block, and how many requests went to the
replica the model predicted (up to a relabelling of the replicas, which are identical).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from kvbench.results.rows import ResultRow
from kvbench.run.execute import RunOutcome


def replica_agreement(rows: Sequence[ResultRow], fleet: dict[str, Any] | None) -> tuple[int, int] | None:
    """``(requests on the predicted replica, requests compared)``: each predicted replica is matched to
    the measured one most of its requests went to; ``None`` without a prediction or replica names."""
    if not fleet:
        return None
    predicted = dict(zip(fleet["request_index"], fleet["replica"]))
    pairs = [
        (predicted[row.request_index], row.replica_id)
        for row in rows
        if row.status == "ok" and row.replica_id and row.request_index in predicted
    ]
    if not pairs:
        return None
    counts = Counter(pairs)
    best: dict[int, str] = {}
    for (label, name), _ in counts.most_common():
        if label not in best and name not in best.values():
            best[label] = name
    return sum(best.get(label) == name for label, name in pairs), len(pairs)


def _rate(cached: float | None, prompt: float | None) -> float | None:
    return cached / prompt if prompt and cached is not None else None


def policy_rows(policy: str, outcome: RunOutcome) -> list[dict[str, Any]]:
    """The table rows of one policy's run: one per replica, then ``fleet`` (dicts with ``policy``,
    ``replica``, ``requests``, ``prompt_tokens``, ``cached_tokens``, ``hit_rate``, ``client_rows``, and
    on the fleet row ``expected_hit_rate``, ``below_expected``, ``agreement``; ``None`` where the run
    did not get that far)."""
    rows, metadata, rec = outcome.rows, outcome.metadata, outcome.reconciliation
    ok = [row for row in rows if row.status == "ok"]
    report = metadata.get("replica_metrics") or {"replicas": [], "fleet": None}
    table = []
    for replica in report["replicas"]:
        name = urlsplit(replica["url"]).netloc
        table.append(
            {
                "policy": policy,
                "replica": replica["url"],
                "requests": replica["requests"],
                "prompt_tokens": replica["prompt_tokens"],
                "cached_tokens": replica["cached_tokens"],
                "hit_rate": replica["hit_rate"],
                "client_rows": sum(row.replica_id == name for row in ok),
                "problem": replica["problem"],
            }
        )
    prompt = sum(row.prompt_tokens or 0 for row in ok)
    agreement = replica_agreement(rows, metadata.get("fleet_expectation"))
    table.append(
        {
            "policy": policy,
            "replica": "fleet",
            "requests": len(ok),
            "prompt_tokens": prompt,
            "cached_tokens": sum(row.cached_prompt_tokens or 0 for row in ok),
            "hit_rate": _rate(sum(row.cached_prompt_tokens or 0 for row in ok), prompt),
            "client_rows": len(ok),
            "expected_hit_rate": None if rec is None else rec.expected_hit_rate,
            "below_expected": None if rec is None else len(rec.below_expected),
            "agreement": agreement,
            "verdict": report.get("verdict"),
        }
    )
    return table
