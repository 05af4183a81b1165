"""The paged engine's calls from outside its worker thread (the :class:`kvbench.engine.protocol.Engine`
interface): submit, parallel samples, abort, reset, the pool's refusal, gauges, describe and memory.

:class:`PagedCalls` is mixed into :class:`~kvbench.engine.paged.engine.PagedEngine`; every call takes
the engine's lock around the scheduler and the job table, and :meth:`PagedCalls.submit_samples` wakes
the worker thread (:class:`~kvbench.engine.worker.Worker`), which runs the engine's steps while there
is work (:mod:`kvbench.engine.paged.engine`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from functools import partial
from typing import Any

import numpy as np
import torch

from kvbench.cache.base import CacheConfig
from kvbench.engine.kinds import EngineKind
from kvbench.engine.paged.jobs import Job, sample_sampling
from kvbench.engine.paged.scheduler import Sequence, blocks_for
from kvbench.engine.paged.verify import VerifyReport
from kvbench.engine.request_check import check_request
from kvbench.engine.sampling import SamplingParams
from kvbench.engine.worker import WAIT_IDLE_S, RequestFuture
from kvbench.errors import CacheBusyError
from kvbench.request import Request, RequestRecord


class PagedCalls:
    """The paged engine's caller-side calls (module docstring); the engine provides ``loaded``,
    ``config``, ``scheduler``, ``kv_pool``, ``host_kv``, ``meter``, ``_lock``, ``_jobs``, ``_seq_ids``,
    ``_aborted``, ``_worker`` and ``_verifier``."""

    spec = EngineKind.PAGED.spec  # one KV pool, continuous batching: many sequences per step

    @property
    def block_size(self) -> int:
        return self.config.pool.block_size

    @property
    def cache_config(self) -> CacheConfig | None:
        return self.config.cache

    def submit(
        self,
        token_ids: Seq[int] | np.ndarray,
        sampling: SamplingParams = SamplingParams(),
        salt: str | None = None,
        on_token: Callable[[int], bool | None] | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> RequestFuture:
        """Queue one request (any thread); the future gets its :class:`RequestRecord`. Bad input gives
        a record with status ``error`` at once; ``on_token`` runs in the worker thread; ``on_start()``
        runs here, at once (the scheduler queues; a client that leaves later is aborted)."""
        if on_start is not None:
            on_start()
        callback = None if on_token is None else (lambda _sample, token_id: on_token(token_id))
        return self.submit_samples(token_ids, sampling, 1, salt, callback)[0]

    def submit_samples(
        self,
        token_ids: Seq[int] | np.ndarray,
        sampling: SamplingParams,
        n: int,
        salt: str | None = None,
        on_token: Callable[[int, int], bool | None] | None = None,
    ) -> list[RequestFuture]:
        """Queue ``n`` parallel samples of one prompt (the OpenAI API's ``n``): one prefill, then ``n``
        sequences sharing the prompt's blocks, copy-on-write for the partly filled last block
        (:mod:`kvbench.engine.paged.scheduler`). With a seed, sample ``i`` samples with ``seed + i``
        (vLLM ``v1/engine/parallel_sampling.py``, ``get_child_sampling_params``), so samples differ
        and every one is reproducible; sample 0 is what ``n = 1`` gives. ``on_token(sample, token_id)``
        runs in the worker thread. Returns one future per sample, in sample order; bad input gives
        every future the same ``error`` record at once.

        Raises:
            ValueError: ``n`` is not a positive integer.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1).tolist()
        futures = [RequestFuture() for _ in range(n)]
        problem = self._check_request(ids, sampling)
        if problem is not None:
            for future in futures:
                future.set_result(RequestRecord.failed(len(ids), problem))
            return futures
        salt = self.config.salt if salt is None else salt
        jobs = [
            self._job(
                Sequence(next(self._seq_ids), list(ids), len(ids), salt),
                sample_sampling(sampling, index),
                future,
                on_token,
                index,
            )
            for index, future in enumerate(futures)
        ]
        jobs[0].forks = jobs[1:]  # forked from sample 0 once its prefill has run
        with self._lock:
            for job in jobs:
                self._jobs[job.seq.seq_id] = job
            self.scheduler.add(jobs[0].seq)
            self._worker.wake()
        return futures

    def _job(
        self,
        seq: Sequence,
        sampling: SamplingParams,
        future: RequestFuture,
        on_token: Callable[[int, int], bool | None] | None,
        index: int,
    ) -> Job:
        generator = None
        if sampling.temperature > 0 and sampling.seed is not None:
            generator = torch.Generator(device=self.loaded.device).manual_seed(sampling.seed)
        eos = () if sampling.ignore_eos else self.loaded.eos_token_ids
        callback = None if on_token is None else partial(on_token, index)
        future.seq_id = seq.seq_id
        return Job(seq, sampling, future, callback, eos, time.perf_counter(), generator)

    def generate(
        self,
        token_ids: Seq[int] | np.ndarray,
        sampling: SamplingParams = SamplingParams(),
        salt: str | None = None,
        on_token: Callable[[int], bool | None] | None = None,
    ) -> RequestRecord:
        """Run one request and wait for it (the copy engine's call); ``on_token`` errors propagate."""
        return self.submit(token_ids, sampling, salt, on_token).result()

    def abort(self, future: RequestFuture) -> RequestRecord | None:
        """Finish the request behind ``future`` at the next step, freeing its blocks (a client left).
        Returns its record if it had already finished and only its ``--verify`` check was pending
        (the check is dropped; the caller keeps what was measured), else ``None``."""
        if future.seq_id is None:
            return None
        if self._verifier is not None and (record := self._verifier.take_unchecked(future)) is not None:
            return record
        with self._lock:
            if future.seq_id in self._jobs:
                self._aborted.add(future.seq_id)
        return None

    def wait_idle(self, timeout_s: float | None = None) -> None:
        """Block until the worker thread has ended (no request left), e.g. before the process exits:
        a daemon thread still inside torch at interpreter shutdown aborts the process."""
        self._worker.join(timeout_s)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block's key (vLLM's ``reset_prefix_cache``); ``False`` when prefix caching
        is off. Raises ``CacheBusyError`` while any request is in the engine."""
        if self.config.cache is None:
            return False
        with self._lock:
            if self.scheduler.has_work:
                raise CacheBusyError(f"cannot reset: {len(self._jobs)} requests are in the engine")
            pool = self.scheduler.pool
            for block_id in list(pool.evictable_block_ids()):
                pool.uncache(block_id)
            if self.scheduler.host is not None:
                self.scheduler.host.clear()
        return True

    def _check_request(self, ids: list[int], sampling: SamplingParams) -> str | None:
        problem = check_request(self.loaded, ids, sampling)  # the copy engine's rules, then the pool's
        return problem if problem is not None else self.pool_refusal(len(ids), sampling.max_tokens)

    def pool_refusal(self, num_prompt_tokens: int, max_tokens: int) -> str | None:
        """Why a request of ``num_prompt_tokens`` + ``max_tokens`` can never fit the pool (its sequence
        needs more blocks than the pool has), or ``None``; such a request is refused at submit."""
        need = blocks_for(num_prompt_tokens + max_tokens - 1, self.block_size)
        if need > self.config.pool.capacity_blocks:
            return (
                f"prompt + max_tokens need {need} blocks of {self.block_size} tokens; the KV pool has "
                f"{self.config.pool.capacity_blocks} (raise --cache-size)"
            )
        return None

    def num_sequences(self) -> tuple[int, int]:
        """``(running, waiting)`` sequences in the scheduler now (vLLM's ``num_requests_running`` /
        ``num_requests_waiting``); samples not yet forked count in neither."""
        with self._lock:
            return len(self.scheduler.running), len(self.scheduler.waiting)

    def host_tier_counters(self) -> tuple[int, int] | None:
        """``(queried, hit)`` host-tier prompt tokens; ``None`` without a host tier."""
        return self.scheduler.host_tier_counters()

    def describe(self) -> dict[str, Any]:
        """``run.engine``: the kind, the per-step limits, the pool (blocks, bytes, host tier) and the
        attention kernel of the batched decode (:mod:`kvbench.engine.paged.kernels`)."""
        config = self.config
        return {
            "kind": "paged",
            "max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "batch_invariant": config.batch_invariant,
            "num_pool_blocks": config.pool.capacity_blocks,
            "pool_bytes": self.kv_pool.allocated_bytes,
            "host_tier_blocks": config.host_tier_blocks,
            "host_tier_bytes": self.host_kv.allocated_bytes if self.host_kv is not None else 0,
            "attention_kernel": self.attention_kernel.kernel.value,
            "attention_kernel_reason": self.attention_kernel.reason,
        }

    def memory(self, records: Seq[tuple[Request, RequestRecord]] = ()) -> dict[str, int | str]:
        """``run.kv_memory``, measured on the pool (:class:`kvbench.engine.paged.held.PoolMeter`): the
        peak and end bytes of running + cached blocks, the peak unfilled slots, and what the copy
        engine's design would hold for the same steps. Waits at most ``WAIT_IDLE_S`` for the worker to
        end first (after Ctrl-C the cut requests are aborted at its next step), so the end reading
        holds no running blocks."""
        self.wait_idle(WAIT_IDLE_S)
        return {"engine": "paged", **self.memory_summary()}

    def memory_summary(self) -> dict[str, int]:
        """Measured pool bytes of the engine's life so far (:meth:`PoolMeter.summary`): peaks and now."""
        with self._lock:
            return self.meter.summary(self.scheduler)

    def held_kv_bytes(self) -> int:
        """Bytes of the pool's blocks that hold K/V someone can use: running and cached blocks."""
        pool = self.scheduler.pool
        num_held = pool.num_used_blocks + pool.num_evictable_blocks
        return num_held * self.kv_pool.bytes_per_block

    @property
    def verify_report(self) -> VerifyReport | None:
        """``--verify``'s counts (flips near ties, mismatches); ``None`` without verify."""
        return None if self._verifier is None else self._verifier.report

    def check_invariants(self) -> None:
        """The scheduler's and pool's invariants (``AssertionError``); for randomized tests."""
        with self._lock:
            self.scheduler.check_invariants(job.seq for job in self._jobs.values())
