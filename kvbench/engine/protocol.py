"""The one interface of kvbench's in-process engines: what every caller outside ``engine/`` may use.

Both engines implement :class:`Engine`: the copy engine (:class:`kvbench.engine.engine.HFEngine`, one
request at a time on a FIFO worker thread) and the paged engine
(:class:`kvbench.engine.paged.engine.PagedEngine`, continuous batching over one KV pool). They are
built by :func:`kvbench.engine.factory.make_engine` from one
:class:`~kvbench.engine.factory.EngineConfig`; code outside ``engine/`` never asks which one it holds
(``tests/test_layers.py`` checks); what differs between them is the engine's ``spec``
(:mod:`kvbench.engine.kinds`). The shape is vLLM's engine client and nano-vllm's ``LLMEngine``:
submit a request, get a future of its record; abort it; reset the prefix cache; describe; memory.

A third engine plugs in by implementing this protocol in its own module under ``engine/`` and adding
its kind to :class:`~kvbench.engine.kinds.EngineKind`, its spec to
:data:`~kvbench.engine.kinds.ENGINE_SPECS` and its builder to the factory's registry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from kvbench.cache.base import CacheConfig
from kvbench.engine.kinds import EngineSpec
from kvbench.engine.model import LoadedModel
from kvbench.engine.sampling import SamplingParams
from kvbench.engine.worker import RequestFuture
from kvbench.request import Request, RequestRecord

TokenIds = Sequence[int] | np.ndarray
OnToken = Callable[[int], bool | None]  # (token id) -> True ends the request normally (a stop sequence)
OnSampleToken = Callable[[int, int], bool | None]  # (sample index, token id), the same contract


@runtime_checkable
class Engine(Protocol):
    """One in-process engine (module docstring). Every method may be called from any thread.

    Attributes:
        loaded: the model it runs (:class:`~kvbench.engine.model.LoadedModel`: vocabulary, context, device).
        cache_config: the prefix cache's settings, ``None`` when prefix caching is off.
        block_size: tokens per KV block (``None``: the copy engine with its cache off).
        spec: what kind of engine it is (:class:`~kvbench.engine.kinds.EngineSpec`: KV pool, batching,
            most parallel samples, ...), its kind's ``EngineKind.spec``: the server derives its gauges,
            ``n`` and abort from it, never from the engine's class.
    """

    loaded: LoadedModel
    spec: EngineSpec

    @property
    def cache_config(self) -> CacheConfig | None: ...

    @property
    def block_size(self) -> int | None: ...

    def submit(
        self,
        token_ids: TokenIds,
        sampling: SamplingParams = SamplingParams(),
        salt: str | None = None,
        on_token: OnToken | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> RequestFuture:
        """Queue one request; returns at once. The future gets its :class:`RequestRecord` (``queue_ms``:
        the wait from submit until it started); bad input (empty prompt, an id outside the vocabulary,
        prompt + ``max_tokens`` beyond the context or the KV pool) gives a record with status ``error``.
        ``salt`` ``None`` = the engine's run salt. ``on_token(token_id)`` runs in the engine's thread with
        every output token as it is sampled; returning ``True`` ends the request normally after that
        token (the prompt is cached as usual); an exception it raises stops that request only (nothing
        of it cached) and becomes the future's. ``on_start()`` is called once before the request can
        run (copy engine: in its thread when its turn has come; paged: at submit, its scheduler then
        queues); an exception it raises becomes the future's and the request never runs."""
        ...

    def submit_samples(
        self,
        token_ids: TokenIds,
        sampling: SamplingParams,
        n: int,
        salt: str | None = None,
        on_token: OnSampleToken | None = None,
    ) -> list[RequestFuture]:
        """Queue ``n`` parallel samples of one prompt (one prefill; the OpenAI API's ``n``); one future
        per sample, in order.

        Raises:
            ValueError: ``n`` is not a positive integer, or (copy engine, any ``n``) the engine runs one
                sequence per request: ``"n > 1 needs --engine paged ..."``.
        """
        ...

    def generate(
        self,
        token_ids: TokenIds,
        sampling: SamplingParams = SamplingParams(),
        salt: str | None = None,
        on_token: OnToken | None = None,
    ) -> RequestRecord:
        """``submit(...).result()``: run one request (behind those queued before it) and wait for its
        record; ``on_token``'s errors propagate."""
        ...

    def abort(self, future: RequestFuture) -> RequestRecord | None:
        """Stop the request behind ``future`` (its client left): a queued one never runs, a running one
        stops at its next token or step, its blocks freed; the future is cancelled. Returns the record
        when the request had finished and only its ``--verify`` check was pending (paged engine; the
        caller keeps what was measured), else ``None``."""
        ...

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block (vLLM's ``reset_prefix_cache``); ``False`` when the cache is off.
        Copy engine: blocks until every request queued before it has finished (requests queued after it
        wait). Paged engine: at once.

        Raises:
            CacheBusyError: paged engine only, while any request is in it (running or waiting).
        """
        ...

    def pool_refusal(self, num_prompt_tokens: int, max_tokens: int) -> str | None:
        """Why a request of this size can never run (the paged engine's KV pool is too small), or
        ``None``; the copy engine never refuses for size."""
        ...

    def num_sequences(self) -> tuple[int, int]:
        """``(running, waiting)`` sequences now (vLLM's ``num_requests_running`` / ``_waiting``)."""
        ...

    def host_tier_counters(self) -> tuple[int, int] | None:
        """``(queried, hit)`` host-tier prompt tokens (``/metrics``), ``None`` without a host tier."""
        ...

    def describe(self) -> dict[str, Any]:
        """The ``run.engine`` metadata of a results file: ``{"kind": "copy"}``, or for ``paged`` its
        limits (``max_num_seqs``, ``max_num_batched_tokens``, ``batch_invariant``) and pool
        (``num_pool_blocks``, ``pool_bytes``, ``host_tier_blocks``, ``host_tier_bytes``)."""
        ...

    def memory(self, records: Sequence[tuple[Request, RequestRecord]]) -> dict[str, int | str]:
        """The ``run.kv_memory`` metadata (bytes) after a run of ``records``
        (docs/results-reference.md lists the keys; each engine's ``memory`` docstring says how it
        measures them); waits at most a minute for running work to end."""
        ...

    @property
    def verify_report(self) -> Any:
        """``--verify``'s logits report (paged: :class:`~kvbench.engine.paged.verify.VerifyReport`),
        ``None`` when there is none (the copy engine's check is exact: nothing to report)."""
        ...

    def wait_idle(self, timeout_s: float | None = None) -> None:
        """Block until the engine's worker thread has ended (nothing queued or running)."""
        ...
