"""The in-process backend: the transformers engine with the pluggable prefix cache, in this process."""

from __future__ import annotations

from typing import Any

from kvbench.engine.engine import HFEngine, SamplingParams
from kvbench.run.loop import RunRequest, ServedRequest


class InProcessBackend:
    """Serves run requests on an :class:`HFEngine`, one at a time.

    ``sampling`` gives temperature / top-p / seed / ignore_eos; each request's own ``max_tokens``
    replaces the budget.
    """

    def __init__(self, engine: HFEngine, sampling: SamplingParams, model_name: str) -> None:
        self.engine = engine
        self.sampling = sampling
        self.model_name = model_name

    def describe(self) -> dict[str, Any]:
        cache = self.engine.config.cache
        return {
            "backend": "inprocess",
            "model": self.model_name,
            "cache_enabled": cache is not None,
            "cache_kind": cache.kind.value if cache else None,
            "block_size": cache.block_size if cache else None,
            "capacity_blocks": cache.capacity_blocks if cache else None,
        }

    def serve(self, request: RunRequest) -> ServedRequest:
        sampling = SamplingParams(max_tokens=request.max_tokens, temperature=self.sampling.temperature,
                                  top_p=self.sampling.top_p, seed=self.sampling.seed,
                                  ignore_eos=self.sampling.ignore_eos)
        result = self.engine.generate(request.token_ids, sampling, salt=request.salt, request_id=request.request_id)
        return ServedRequest(
            status=result.status.value,
            prompt_tokens=result.prompt_tokens,
            cached_prompt_tokens=result.cached_prompt_tokens,
            output_tokens=result.output_tokens,
            output_tokens_source="engine",
            ttft_ms=result.ttft_ms,
            tpot_ms=result.tpot_ms,
            itl_ms=list(result.itl_ms),
            e2e_ms=result.e2e_ms,
            prefill_ms=result.prefill_ms,
            error=result.error,
            output_matches_reference=result.output_matches_reference,
        )
