"""kvbench's in-process engine on the same trace and checkpoint as vLLM, for the TTFT comparison."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kvbench.peer.comparisons import PreparedComparison

WARM_UP_TOKENS = 64  # one short request first, so one-time start-up costs do not land on the cold request


def inprocess_rows(model_dir: Path, prepared: PreparedComparison, block_size: int, num_threads: int | None,
                   context: dict[str, Any], log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Replay ``prepared`` through ``HFEngine`` with a cache that never evicts; one row per request.

    The engine loads the exported checkpoint (the files vLLM serves). ``num_threads`` sets torch's
    intra-op threads for the replay (vLLM's CPU engine drops to 1 thread on a 2-core machine; ``None``
    keeps torch's default); the previous setting is restored afterwards.
    """
    import torch  # only to match vLLM's thread count; the engine itself lives in hf_engine.py

    from kvbench.cache.base import CacheConfig
    from kvbench.engine.engine import EngineConfig, HFEngine, SamplingParams
    from kvbench.engine.model import ModelConfig, load_model

    previous_threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        requests = prepared.token_requests
        capacity = sum(r.num_tokens // block_size + 1 for r in requests) + 1
        engine = HFEngine(load_model(ModelConfig(path=model_dir)),
                          EngineConfig(cache=CacheConfig(capacity_blocks=capacity, block_size=block_size)))
        engine.generate(np.arange(WARM_UP_TOKENS, dtype=np.int64), SamplingParams(max_tokens=2), salt="kvbench-warm-up")
        rows = []
        for index, (request, tokens) in enumerate(zip(prepared.trace.requests, requests, strict=True)):
            result = engine.generate(tokens.token_ids, SamplingParams(max_tokens=request.max_tokens, ignore_eos=True),
                                     salt=tokens.salt, request_id=request.id)
            rows.append({**context, "comparison": prepared.comparison.name, "backend": "kvbench-inprocess",
                         "request_index": index, "request_id": request.id, "session_id": request.session_id,
                         "turn": request.turn, "prompt_tokens": tokens.num_tokens,
                         "output_tokens": request.max_tokens, "output_tokens_reported": result.output_tokens,
                         "cached_tokens_reported": result.cached_prompt_tokens, "ttft_ms": result.ttft_ms,
                         "e2e_ms": result.e2e_ms, "status": result.status.value, "error": result.error})
            if log is not None:
                log(f"in-process {request.id}: cached {result.cached_prompt_tokens}, TTFT {result.ttft_ms:.0f} ms")
        return rows
    finally:
        torch.set_num_threads(previous_threads)
