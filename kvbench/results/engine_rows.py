"""Table rows for what an in-process run's engine was and did, from its results file's metadata:
``run.engine`` (``--engine copy|paged`` and the paged engine's limits:
the engine's ``describe()``), ``run.kv_memory`` (its ``memory(records)``: :mod:`kvbench.engine.protocol`) and
``run.verify_logits`` (``--verify`` on the paged engine: :mod:`kvbench.engine.paged.verify`).

``kvbench run``'s summary table shows one run (:func:`verify_logit_rows`,
:func:`kvbench.results.memory_rows.kv_memory_rows`); ``kvbench report``'s run table one column per
file (:func:`engine_report_rows`), ``-`` where a file does not carry the key (files written before
the key existed, HTTP runs: a server's engine is its own).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvbench.results.memory_rows import kv_memory_rows

MISSING = "-"


def engine_text(engine: Mapping[str, Any] | None) -> str:
    """``run.engine`` in words: ``copy``, or ``paged: max_num_seqs 256, max_num_batched_tokens 8,192,
    4,096-block pool (512.1 MiB)`` (+ ``, batch-invariant``): the blocks ``--cache-size`` gives, the
    MiB the pool's tensors take (vLLM's null block included); ``-`` without the key."""
    if not engine:
        return MISSING
    if engine.get("kind") != "paged":
        return str(engine.get("kind", MISSING))
    parts = [
        f"max_num_seqs {engine['max_num_seqs']:,}",
        f"max_num_batched_tokens {engine['max_num_batched_tokens']:,}",
    ]
    if engine.get("pool_bytes") is not None:
        parts.append(f"{engine['num_pool_blocks']:,}-block pool ({engine['pool_bytes'] / 2**20:,.1f} MiB)")
    if engine.get("batch_invariant"):
        parts.append("batch-invariant")
    return "paged: " + ", ".join(parts)


def verify_logit_rows(logits: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The paged engine's ``run.verify_logits`` as table rows; "n/a (no greedy requests)" when no output
    position was compared (only greedy requests are compared: sampled ones have no single reference)."""
    compared = logits["num_compared_tokens"] > 0
    none = "n/a (no greedy requests)"
    return [
        (
            f"argmax flips near ties / mismatches (tol {logits['tie_tolerance_nats']:g} nats)",
            f"{logits['num_flips_near_ties']} / {logits['num_mismatches']}" if compared else none,
        ),
        (
            "max |logprob diff| vs cache-off (nats)",
            f"{logits['max_abs_logprob_diff']:.2e}" if compared else none,
        ),
    ]


def engine_report_rows(runs: Sequence[Mapping[str, Any]]) -> list[tuple[str, ...]]:
    """``kvbench report``'s rows for the ``run`` metadata of each file: the engine, then every KV memory
    and ``--verify`` row any of them has (one cell per run, ``-`` where a run lacks that row). No
    memory or verify rows when no run has them; the engine row always (``-`` for files without it)."""
    memory = _aligned([dict(kv_memory_rows(run.get("kv_memory"))) for run in runs])
    verify = _aligned([dict(_verify_rows(run)) for run in runs])
    return [("engine", *(engine_text(run.get("engine")) for run in runs)), *memory, *verify]


def _aligned(per_run: Sequence[Mapping[str, str]]) -> list[tuple[str, ...]]:
    """One row per label any run has (first seen first), a cell per run (``-`` where it lacks the label)."""
    labels = dict.fromkeys(label for rows in per_run for label in rows)
    return [(label, *(rows.get(label, MISSING) for rows in per_run)) for label in labels]


def _verify_rows(run: Mapping[str, Any]) -> list[tuple[str, str]]:
    logits = run.get("verify_logits")
    return verify_logit_rows(logits) if logits else []
