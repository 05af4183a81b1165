"""The policy x replica table of a fleet experiment, as plain rows (the command draws them).

Per policy and replica: the replica's own ``/metrics`` deltas (requests, prompt and cached tokens, hit
rate), and the client's rows that name it (the ``X-Kvbench-Replica`` header). Per policy: the fleet's
sum, the hit rate ``kvbench route`` expected for that policy, the requests whose reported cached
tokens fell short of the expectation by more than one block, and how many requests went to the
replica the model predicted (up to a relabelling of the replicas, which are identical). With the
replicas' KV events (``kvbench run --kv-events``): per replica the blocks it held at the end; per
policy the blocks held by two or more replicas and the prompt tokens that went to a replica holding
less of the prompt than another did (:mod:`kvbench.run.kv_events`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kvbench.results.rows import ResultRow
from kvbench.run.execute import RunOutcome

FLEET = "fleet"  # the replica column of a policy's sum line


def replica_agreement(rows: Sequence[ResultRow], fleet: dict[str, Any] | None) -> tuple[int, int] | None:
    """``(requests on the predicted replica, requests compared)``: each predicted replica is matched to
    the measured one most of its requests went to; ``None`` without a prediction or replica names."""
    if not fleet:
        return None
    predicted = dict(zip(fleet["request_index"], fleet["replica"]))
    pairs = [
        (predicted[record.request_index], record.replica_id)
        for record in rows
        if record.status == "ok" and record.replica_id and record.request_index in predicted
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


@dataclass(frozen=True)
class TableRow:
    """One line of the policy x replica table; ``replica`` is a replica's URL or ``fleet``. Counts are
    the replica's own ``/metrics`` deltas (the client's usage on the fleet line); ``None`` where it
    had none. The fleet line alone has the expectation, the requests below it, the agreement with
    the model's replicas and the ``/metrics`` verdict. ``blocks``: blocks held at the end by the
    replica's KV events (the fleet line: distinct blocks), ``duplicated_blocks`` and
    ``tokens_elsewhere`` (fleet line only): ``None`` without events."""

    policy: str
    replica: str
    requests: float | None
    prompt_tokens: float | None
    cached_tokens: float | None
    hit_rate: float | None
    client_rows: int
    problem: str | None = None
    expected_hit_rate: float | None = None
    below_expected: int | None = None
    agreement: tuple[int, int] | None = None
    blocks: int | None = None
    duplicated_blocks: int | None = None
    tokens_elsewhere: int | None = None

    @property
    def is_fleet(self) -> bool:
        return self.replica == FLEET


def policy_rows(policy: str, outcome: RunOutcome) -> list[TableRow]:
    """The table rows of one policy's run: one per replica, then the fleet's."""
    records, metadata, rec = outcome.rows, outcome.metadata, outcome.reconciliation
    ok = [record for record in records if record.status == "ok"]
    report = metadata.get("replica_metrics") or {"replicas": []}
    events = metadata.get("kv_events")
    held = {r["name"]: sum(r["blocks"].values()) for r in events["replicas"]} if events else {}
    table = [
        TableRow(
            policy,
            delta["url"],
            delta["requests"],
            delta["prompt_tokens"],
            delta["cached_tokens"],
            delta["hit_rate"],
            sum(record.replica_id == urlsplit(delta["url"]).netloc for record in ok),
            delta["problem"],
            blocks=held.get(urlsplit(delta["url"]).netloc),
        )
        for delta in report["replicas"]
    ]
    prompt = sum(record.prompt_tokens or 0 for record in ok)
    cached = sum(record.cached_prompt_tokens or 0 for record in ok)
    fleet = TableRow(
        policy,
        FLEET,
        len(ok),
        prompt,
        cached,
        _rate(cached, prompt),
        len(ok),
        report.get("verdict"),
        None if rec is None else rec.expected_hit_rate,
        None if rec is None else len(rec.below_expected),
        replica_agreement(records, metadata.get("fleet_expectation")),
        *_event_totals(events),
    )
    return [*table, fleet]


def _event_totals(events: dict[str, Any] | None) -> tuple[int | None, int | None, int | None]:
    """``(distinct blocks, duplicated blocks, tokens held elsewhere)`` of a run's KV event report."""
    if not events:
        return None, None, None
    requests = events["requests"]
    elsewhere = sum(
        best - (held or 0) for held, best in zip(requests["held_tokens"], requests["best_tokens"])
    )
    return events["num_distinct_blocks"], events["num_duplicated_blocks"], elsewhere
