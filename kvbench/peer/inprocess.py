"""kvbench's in-process engine on the same trace and checkpoint as vLLM, for the TTFT comparison.

The requests go through :class:`kvbench.backends.inprocess.InProcessBackend` and the one send loop
(``driver.drive``, concurrency 1), exactly as ``kvbench run`` sends them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kvbench.peer.comparisons import PreparedComparison
from kvbench.peer.driver import WARM_UP_SALT, drive
from kvbench.request import Request, RequestRecord

WARM_UP_TOKENS = 64  # one short request first, so one-time start-up costs do not land on the cold request
BACKEND = "kvbench-inprocess"


def inprocess_rows(model_dir: Path, prepared: PreparedComparison, block_size: int, num_threads: int | None,
                   context: dict[str, Any], log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Replay ``prepared`` on the exported checkpoint ``model_dir`` (the files vLLM serves); one row
    per request (:func:`replay_rows`).

    ``num_threads`` sets torch's intra-op threads for the replay (vLLM's CPU engine drops to 1 thread
    on a 2-core machine; ``None`` keeps torch's default); the previous setting is restored afterwards.
    """
    from kvbench.engine.model import ModelConfig, load_model
    from kvbench.engine.threads import torch_threads

    with torch_threads(num_threads):
        return replay_rows(load_model(ModelConfig(path=model_dir)), prepared, block_size, context, log)




def replay_rows(loaded: Any, prepared: PreparedComparison, block_size: int, context: dict[str, Any],
                log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Replay ``prepared`` on ``loaded`` (a :class:`kvbench.engine.model.LoadedModel`) with a hash
    cache of ``block_size``-token blocks that never evicts, greedy with ``ignore_eos``, after one
    warm-up request in its own namespace; one row per request, in trace order."""
    from kvbench.backends.inprocess import InProcessBackend
    from kvbench.cache.base import CacheConfig
    from kvbench.engine.engine import EngineConfig, HFEngine, SamplingParams

    requests = prepared.requests
    capacity = sum(r.num_tokens // block_size + 1 for r in requests) + 1
    engine = HFEngine(loaded, EngineConfig(cache=CacheConfig(capacity_blocks=capacity, block_size=block_size)))
    backend = InProcessBackend(engine, SamplingParams(ignore_eos=True), BACKEND)
    warm_up = Request(0, "warm-up", "warm-up", 0, np.arange(WARM_UP_TOKENS, dtype=np.uint32), max_tokens=2,
                      salt=WARM_UP_SALT)
    drive([warm_up], backend)

    def progress(request: Request, record: RequestRecord) -> None:
        if log is not None:
            log(f"in-process {request.request_id}: cached {record.cached_prompt_tokens}, "
                f"TTFT {record.ttft_ms or 0:.0f} ms")

    records = drive(requests, backend, progress)
    return [_row(prepared, request, record, context) for request, record in zip(requests, records)]


def _row(prepared: PreparedComparison, request: Request, record: RequestRecord,
         context: dict[str, Any]) -> dict[str, Any]:
    return {**context, "comparison": prepared.comparison.name, "backend": BACKEND,
            "request_index": request.index, "request_id": request.request_id, "session_id": request.session_id,
            "turn": request.turn, "prompt_tokens": request.num_tokens, "output_tokens": request.max_tokens,
            "output_tokens_reported": record.output_tokens, "cached_tokens_reported": record.cached_prompt_tokens,
            "ttft_ms": record.ttft_ms, "e2e_ms": record.e2e_ms, "status": record.status.value, "error": record.error}
