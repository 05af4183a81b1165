"""The summary table's rows for a run's ``run.kv_memory`` metadata (written by the engine's
``memory(records)``, :mod:`kvbench.engine.protocol`: measured pool bytes of the paged engine, or the
copy engine's blocks and contiguous copy)."""

from __future__ import annotations


def kv_memory_rows(memory: dict | None) -> list[tuple[str, str]]:
    """The summary table's rows for ``run.kv_memory`` (none when the run has none: HTTP backends)."""
    if memory is None:
        return []
    if memory["engine"] == "paged":
        return [
            (
                "KV pool held, running + cached: peak / end (MiB)",
                f"{_mib(memory['peak_held_kv_bytes'])} / {_mib(memory['end_held_kv_bytes'])}",
            ),
            (
                "KV the copy engine would hold at its peak (MiB, computed)",
                _mib(memory["peak_copy_engine_kv_bytes"]),
            ),
        ]
    return [
        (
            "KV held: cache blocks at end + largest contiguous copy (MiB)",
            f"{_mib(memory['end_held_kv_bytes'])} + {_mib(memory['peak_contiguous_kv_bytes'])}",
        )
    ]


def _mib(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:,.1f}"
