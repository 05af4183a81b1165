"""The service-time model of one simulated replica (``kvbench route``).

A replica prefills one request at a time, first come first served, and decodes every admitted
request in one batch with no size limit (continuous batching, where decode steps are cheap next to
prefill and never hold up the next prefill). So prefill is the queue:

* ``start = max(arrival, end of the replica's previous prefill)``, ``queue_ms = start - arrival``;
* prefill: ``prefill_base_ms + prefill_ms_per_token x uncached prompt tokens`` (the uncached tokens
  are what the replica's own prefix cache did not hold at ``start``; prefill is linear in them, the
  same model as ``kvbench report``'s TTFT fit ``a + b x (1 - hit rate)``);
* decode: ``decode_ms_per_token x (output tokens - 1)`` after the first token (TPOT, vLLM's definition).

TTFT = queue + prefill; E2E = TTFT + decode. A replica's busy time is its prefill time; its load (what
``least-loaded`` and ``cache-aware`` read) is its requests not finished, decoding ones included, as
SGLang's router counts in-flight requests. Real engines slow decode as the batch grows and interleave
prefill chunks with decode; the model ignores both, so compare policies with it, not absolute numbers.

The defaults (10 ms + 0.1 ms per token, 20 ms per output token) are an illustrative order of magnitude
for an 8B model on one GPU, not a measurement: pass the flags, or fit them from a measured run with
:func:`fit_service_model`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvbench.errors import InputError
from kvbench.results.rows import rows_from_dicts


@dataclass(frozen=True)
class ServiceModel:
    """Per-request service time of one replica, milliseconds.

    Raises:
        ValueError: a negative or non-finite coefficient.
    """

    prefill_base_ms: float = 10.0  # fixed cost of a forward pass (illustrative)
    prefill_ms_per_token: float = 0.1  # 10k uncached tokens per second (illustrative)
    decode_ms_per_token: float = 20.0  # TPOT inside a batch (illustrative)

    def __post_init__(self) -> None:
        for name in ("prefill_base_ms", "prefill_ms_per_token", "decode_ms_per_token"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a non-negative number of milliseconds, got {value!r}")

    def prefill_ms(self, uncached_tokens: int) -> float:
        """Prefill time of ``uncached_tokens`` prompt tokens (ms)."""
        return self.prefill_base_ms + self.prefill_ms_per_token * uncached_tokens

    def decode_ms(self, output_tokens: int) -> float:
        """Decode time after the first token (ms)."""
        return self.decode_ms_per_token * max(output_tokens - 1, 0)

    def as_dict(self) -> dict[str, float]:
        return {
            "prefill_base_ms": self.prefill_base_ms,
            "prefill_ms_per_token": self.prefill_ms_per_token,
            "decode_ms_per_token": self.decode_ms_per_token,
        }


def fit_service_model(path: Path) -> ServiceModel:
    """Fit the model from a ``kvbench run`` results file: least squares of ``ttft_ms`` on uncached
    prompt tokens (``prompt_tokens - cached_prompt_tokens``) over measured ok rows, and the median
    ``tpot_ms``. Coefficients below zero are clipped to zero.

    Raises:
        InputError: the file is not a results Parquet, or has fewer than 2 usable rows.
    """
    import pyarrow.parquet as pq

    columns = ["prompt_tokens", "cached_prompt_tokens", "ttft_ms", "tpot_ms", "status", "phase"]
    try:
        table = rows_from_dicts(pq.read_table(path, columns=columns).to_pylist())
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"--fit {path}: not a kvbench results file ({exc})") from None
    rows = [row for row in table if row.status == "ok" and row.phase == "measure" and row.ttft_ms is not None]
    if len(rows) < 2:
        raise InputError(
            f"--fit {path}: needs at least 2 measured ok requests with a TTFT, found {len(rows)}"
        )
    uncached = np.array([row.prompt_tokens - (row.cached_prompt_tokens or 0) for row in rows], float)
    ttft = np.array([row.ttft_ms for row in rows], float)
    slope, intercept = np.polyfit(uncached, ttft, 1) if np.ptp(uncached) > 0 else (0.0, float(np.mean(ttft)))
    tpots = [row.tpot_ms for row in rows if row.tpot_ms is not None]
    return ServiceModel(
        max(float(intercept), 0.0), max(float(slope), 0.0), float(np.median(tpots)) if tpots else 0.0
    )
