"""Per-endpoint summary of a routed run (rows with a ``replica``): who served how much, at what hit rate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvbench.results.rows import ResultRow


def replica_rows(rows: Sequence[ResultRow]) -> list[dict[str, Any]]:
    """Per replica index (ascending): ``requests``, ``prompt_tokens``, ``cached_prompt_tokens`` and
    ``token_hit_rate`` over its ok rows; empty when no row has a replica."""
    totals: dict[int, dict[str, Any]] = {}
    for row in rows:
        if row.replica is None or row.status != "ok":
            continue
        entry = totals.setdefault(
            row.replica,
            {"replica": row.replica, "requests": 0, "prompt_tokens": 0, "cached_prompt_tokens": 0},
        )
        entry["requests"] += 1
        entry["prompt_tokens"] += row.prompt_tokens
        entry["cached_prompt_tokens"] += row.cached_prompt_tokens or 0
    for entry in totals.values():
        entry["token_hit_rate"] = (
            entry["cached_prompt_tokens"] / entry["prompt_tokens"] if entry["prompt_tokens"] else 0.0
        )
    return [totals[key] for key in sorted(totals)]
