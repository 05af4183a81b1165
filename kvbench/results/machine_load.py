"""How busy the machine was around a run, and warnings when its timings cannot be trusted.

Every run records a :func:`load_sample` at its start and end (Parquet metadata ``machine_load``;
``kvbench report`` shows it). :func:`load_warnings` flags a load average above the usable cores
(other processes then take CPU from the engine's forwards and the client) and a wide TTFT spread
among identical requests (same prompt, cached and output token counts): on a loaded 2-core
machine, identical warm requests ranged from 54 to 1,460 ms.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kvbench.engine.threads import usable_cores
from kvbench.results.rows import ResultRow

SPREAD_RATIO = 3.0  # warn when identical requests' TTFT p90 / p10 exceeds this
MIN_IDENTICAL = 5  # ... among at least this many identical requests


usable_cpus = usable_cores  # CPUs this process may run on (its affinity mask); one rule, in engine/threads.py


def load_sample() -> dict[str, Any]:
    """``load_1m/5m/15m`` (runnable processes, averaged; ``None`` where the OS has none),
    ``cpu_count``, ``usable_cpus`` and ``torch_threads`` (only if torch is already imported)."""
    try:
        load = [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):
        load = [None, None, None]
    torch = sys.modules.get("torch")
    return {
        "load_1m": load[0],
        "load_5m": load[1],
        "load_15m": load[2],
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
    }


def load_warnings(samples: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per sample (``start``, ``end``) whose 1-minute load exceeds the usable CPUs."""
    warnings = []
    for when, sample in samples.items():
        load, cpus = sample.get("load_1m"), sample.get("usable_cpus")
        if load is not None and cpus and load > cpus:
            warnings.append(
                f"machine load {load:.1f} at the {when} of the run exceeds its {cpus} usable cores: "
                f"timings include waiting for a CPU (try --threads 1, or a quieter machine)"
            )
    return warnings


def spread_warning(rows: Sequence[ResultRow]) -> str | None:
    """A line when identical successful measured requests have a TTFT p90 / p10 above
    :data:`SPREAD_RATIO` (the widest such group), else ``None``."""
    groups: dict[tuple, list[float]] = {}
    for row in rows:
        if row.status == "ok" and row.phase == "measure" and row.ttft_ms is not None:
            key = (row.prompt_tokens, row.cached_prompt_tokens, row.output_tokens)
            groups.setdefault(key, []).append(row.ttft_ms)
    worst = None
    for key, ttfts in groups.items():
        if len(ttfts) >= MIN_IDENTICAL:
            p10, p90 = np.percentile(ttfts, [10, 90])
            ratio = p90 / p10 if p10 > 0 else float("inf")
            if ratio > SPREAD_RATIO and (worst is None or ratio > worst[0]):
                worst = (ratio, key, min(ttfts), max(ttfts), len(ttfts))
    if worst is None:
        return None
    ratio, (prompt, cached, output), low, high, count = worst
    return (
        f"{count} identical requests ({prompt:,} prompt / {cached or 0:,} cached / {output:,} output tokens) "
        f"took {low:,.0f} to {high:,.0f} ms TTFT (p90/p10 {ratio:.1f}x): the machine is noisy, compare "
        "medians "
        f"of repeated runs"
    )
