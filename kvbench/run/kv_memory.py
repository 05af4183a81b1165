"""The KV bytes one in-process run held, for the results file's ``run.kv_memory`` and the summary table.

* ``--engine paged``: measured on its pool (:class:`kvbench.engine.paged.held.PoolMeter`): the peak
  and end bytes of running + cached blocks, the peak unfilled slots, and what the copy engine's
  design would hold for the same steps (its block tensors plus every running sequence's contiguous
  copy, computed from the token counts).
  After Ctrl-C the cut requests are aborted at the worker's next step, so the end reading holds no
  running blocks (it waits at most ``WAIT_IDLE_S`` for that step).
* ``--engine copy``: the block tensors its cache keeps alive at the end (measured:
  ``HFEngine.held_kv_bytes``, distinct storages) and the largest request's contiguous copy (computed:
  prompt + output - 1 tokens x KV bytes per token; one request runs at a time).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvbench.request import Request, RequestRecord, Status

WAIT_IDLE_S = 60.0  # the worker ends within a step (one forward) once nothing runs; never hang an interrupt on it


def kv_memory(engine, records: Sequence[tuple[Request, RequestRecord]], block_size: int) -> dict:
    """``run.kv_memory`` (bytes; module docstring) of ``engine`` after its run of ``records``."""
    from kvbench.engine.paged.engine import PagedEngine

    if isinstance(engine, PagedEngine):
        engine.wait_idle(WAIT_IDLE_S)  # every request has finished or was aborted: the end reading is final
        return {"engine": "paged", **engine.memory_summary()}
    per_token = engine.loaded.kv_layout(block_size).bytes_per_token
    tokens = [r.prompt_tokens + r.output_tokens - 1 for _, r in records if r.status is Status.OK and r.output_tokens]
    contiguous = max(tokens, default=0) * per_token
    held = engine.held_kv_bytes()
    return {"engine": "copy", "end_held_kv_bytes": held, "peak_contiguous_kv_bytes": contiguous,
            "peak_copy_engine_kv_bytes": held + contiguous}
