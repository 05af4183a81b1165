"""One request inside the paged engine, as its caller sees it: the :class:`Job` (a sequence, its
sampling, its future and callback, its timestamps) and the :class:`~kvbench.request.RequestRecord` it
ends as. Timings are ``time.perf_counter`` seconds; the record's are milliseconds from admission
(:mod:`kvbench.engine.paged.engine`)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import torch

from kvbench.engine.paged.scheduler import Sequence
from kvbench.engine.sampling import SamplingParams
from kvbench.request import RequestRecord, Status


@dataclass(eq=False)
class Job:
    """A sequence with what its caller gave and what it will get back."""

    seq: Sequence
    sampling: SamplingParams
    future: Future
    on_token: Callable[[int], bool | None] | None
    eos: tuple[int, ...]
    submitted_s: float
    generator: torch.Generator | None = None
    admitted_s: float | None = None
    token_s: list[float] = field(default_factory=list)
    prefill_ms: float | None = None
    forks: list[Job] = field(default_factory=list)  # parallel samples not yet forked from this one
    chosen_logprobs: list[float] = field(default_factory=list)  # verify: log p of each sampled token, nats

    @property
    def num_output_tokens(self) -> int:
        return self.seq.num_tokens - self.seq.num_prompt_tokens


def sample_sampling(sampling: SamplingParams, index: int) -> SamplingParams:
    """Sample ``index``'s sampling: the seed plus the index (vLLM's rule; submit_samples)."""
    return sampling if index == 0 or sampling.seed is None else replace(sampling, seed=sampling.seed + index)


def job_record(job: Job) -> RequestRecord:
    seq, token_s, start_s = job.seq, job.token_s, job.admitted_s
    ttft_ms, e2e_ms = (token_s[0] - start_s) * 1e3, (token_s[-1] - start_s) * 1e3
    tokens = tuple(seq.token_ids[seq.num_prompt_tokens :])
    return RequestRecord(
        status=Status.OK,
        prompt_tokens=seq.num_prompt_tokens,
        cached_prompt_tokens=seq.num_cached_tokens,
        output_tokens=len(tokens),
        output_tokens_source="engine",
        output_token_ids=tokens,
        ttft_ms=ttft_ms,
        itl_ms=tuple((b - a) * 1e3 for a, b in zip(token_s, token_s[1:])),
        e2e_ms=e2e_ms,
        prefill_ms=job.prefill_ms,
        lookup_ms=None,
        kv_load_ms=0.0,
        insert_ms=0.0,
        num_inserted_blocks=seq.num_inserted_blocks,
        queue_ms=(start_s - job.submitted_s) * 1e3,
        host_cached_tokens=seq.num_host_cached_tokens,
    )
