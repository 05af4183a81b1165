"""The paged engine: continuous batching over one KV pool, prefix blocks read in place.

One step (:meth:`PagedEngine.step`): apply aborts, let the :class:`Scheduler` pick sequences and
allocate their blocks, run **one packed forward** over every scheduled sequence's new tokens
(``batch_invariant``: one forward per sequence, exact against concurrency 1), key newly full
blocks, sample one token for every sequence whose pending tokens are all computed, finish those at
``max_tokens`` or EOS (blocks freed tail first). A hit costs no copy: the block table points at the
cached blocks and attention reads them in the pool (:mod:`kvbench.engine.paged.attention`).

Callers: :meth:`PagedEngine.submit` (any thread; a worker thread runs the steps while there is work)
returns a ``concurrent.futures.Future`` of the :class:`~kvbench.request.RequestRecord`;
:meth:`PagedEngine.generate` is the copy engine's synchronous call. An exception from ``on_token``
or a cancelled future finishes exactly that sequence and frees its blocks; an exception in a forward
fails every sequence of that step, all blocks freed. ``on_token`` returning ``True`` ends the request
normally after that token (a stop sequence matched), as in the copy engine.

Timings (``time.perf_counter``): a record's clock starts when the sequence is first admitted;
``queue_ms`` is the wait from ``submit`` until then (as the copy engine reports its lock wait).
``kv_load_ms`` is 0: nothing is copied before the forward (the gather happens inside attention).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from kvbench.cache.base import CacheConfig, CacheKind
from kvbench.cache.block_hash import BlockHasher
from kvbench.engine.engine import check_request
from kvbench.engine.model import LoadedModel
from kvbench.engine.paged.attention import PagedForward, SequenceSlice, skip_mask_creation, use_paged_attention
from kvbench.engine.paged.kv_pool import KVPool
from kvbench.engine.paged.scheduler import Scheduler, Sequence, blocks_for
from kvbench.engine.sampling import SamplingParams, sample_next_token
from kvbench.errors import CacheBusyError, InputError
from kvbench.request import RequestRecord, Status

DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default --max-num-seqs
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # vLLM v1's default token budget per step with chunked prefill


@dataclass(frozen=True)
class PagedConfig:
    """How the paged engine runs.

    Attributes:
        pool: the pool's size (``capacity_blocks``: running and cached blocks together, as vLLM's
            ``num_gpu_blocks`` minus the null block), block size, hash and release order.
        prefix_caching: off = blocks are never keyed or looked up (vLLM's
            ``--no-enable-prefix-caching``); the pool still holds the running sequences.
        max_num_seqs / max_num_batched_tokens: vLLM's per-step limits (sequences, tokens).
        batch_invariant: one forward per sequence, so every output equals its concurrency-1 output.
        verify: re-run each request on the copy engine with the cache off; ``output_matches_reference``.
        salt: the run's salt; a request's own salt replaces it.

    Raises:
        ValueError: a non-positive limit, or a cache setting the pool does not implement (radix,
            TTL, verify_tokens, prompt_only).
    """

    pool: CacheConfig
    prefix_caching: bool = True
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    batch_invariant: bool = False  # batched forwards may differ in the last bits
    verify: bool = False
    salt: str = ""

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"--{name.replace('_', '-')}: {value!r} must be a positive integer")
        if self.pool.kind is not CacheKind.HASH:
            raise ValueError("--engine paged keys its pool by block hash: use --cache-kind hash")
        if self.pool.ttl_s is not None:
            raise ValueError("--engine paged does not implement --ttl (lazy eviction only, as vLLM)")
        if self.pool.verify_tokens:
            raise ValueError("--engine paged trusts block hashes (verify_tokens is not implemented)")
        if self.pool.prompt_only:
            raise ValueError("--engine paged caches generated blocks as vLLM does: --prompt-only applies to --engine copy")

    @property
    def cache(self) -> CacheConfig | None:
        """The prefix cache's settings, ``None`` when prefix caching is off (the copy engine's field)."""
        return self.pool if self.prefix_caching else None


class RequestFuture(Future):
    """A future of one request's :class:`RequestRecord`; ``seq_id`` names it for :meth:`PagedEngine.abort`
    (``None``: refused at submit)."""

    seq_id: int | None = None


@dataclass(eq=False)
class _Job:
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

    @property
    def num_output_tokens(self) -> int:
        return self.seq.num_tokens - self.seq.num_prompt_tokens


class PagedEngine:
    """Runs requests of token ids through one model with a paged KV pool and continuous batching.

    Example::

        engine = PagedEngine(load_model(), PagedConfig(CacheConfig(capacity_blocks=4096)))
        record = engine.generate(token_ids, SamplingParams(max_tokens=32, ignore_eos=True))

    Raises:
        InputError: the model's attention does not go through transformers' attention interface.
    """

    def __init__(self, loaded: LoadedModel, config: PagedConfig) -> None:
        if not hasattr(loaded.model, "set_attn_implementation"):
            raise InputError(f"{loaded.name}: the paged engine needs a transformers model")
        use_paged_attention(loaded.model)
        self.loaded = loaded
        self.config = config
        block_size = config.pool.block_size
        self.kv_pool = KVPool(loaded.kv_layout(block_size), config.pool.capacity_blocks, loaded.device, loaded.dtype)
        hasher = BlockHasher(block_size, config.pool.hash) if config.prefix_caching else None
        self.scheduler = Scheduler(config.pool.capacity_blocks, block_size, hasher, config.max_num_seqs,
                                   config.max_num_batched_tokens,
                                   tail_first=config.pool.release_order.value == "tail-first")
        self._jobs: dict[int, _Job] = {}
        self._seq_ids = itertools.count()
        self._lock = threading.Lock()
        self._aborted: set[int] = set()
        self._worker: threading.Thread | None = None
        self._reference = None  # the copy engine with the cache off, for verify

    @property
    def block_size(self) -> int:
        return self.config.pool.block_size

    # -- callers -----------------------------------------------------------------------------------

    def submit(self, token_ids: Seq[int] | np.ndarray, sampling: SamplingParams = SamplingParams(),
               salt: str | None = None, on_token: Callable[[int], bool | None] | None = None) -> RequestFuture:
        """Queue one request (any thread); the future gets its :class:`RequestRecord`. Bad input gives
        a record with status ``error`` at once; ``on_token`` runs in the worker thread."""
        future = RequestFuture()
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1).tolist()
        problem = self._check_request(ids, sampling)
        if problem is not None:
            future.set_result(RequestRecord.failed(len(ids), problem))
            return future
        seq = Sequence(next(self._seq_ids), ids, len(ids), self.config.salt if salt is None else salt)
        generator = None
        if sampling.temperature > 0 and sampling.seed is not None:
            generator = torch.Generator(device=self.loaded.device).manual_seed(sampling.seed)
        eos = () if sampling.ignore_eos else self.loaded.eos_token_ids
        job = _Job(seq, sampling, future, on_token, eos, time.perf_counter(), generator)
        future.seq_id = seq.seq_id
        with self._lock:
            self._jobs[seq.seq_id] = job
            self.scheduler.add(seq)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="kvbench-paged", daemon=True)
                self._worker.start()
        return future

    def generate(self, token_ids: Seq[int] | np.ndarray, sampling: SamplingParams = SamplingParams(),
                 salt: str | None = None, on_token: Callable[[int], bool | None] | None = None) -> RequestRecord:
        """Run one request and wait for it (the copy engine's call); ``on_token`` errors propagate."""
        return self.submit(token_ids, sampling, salt, on_token).result()

    def abort(self, future: RequestFuture) -> None:
        """Finish the request behind ``future`` at the next step, freeing its blocks (a client left)."""
        if future.seq_id is None:
            return
        with self._lock:
            if future.seq_id in self._jobs:
                self._aborted.add(future.seq_id)

    def reset_prefix_cache(self) -> None:
        """Drop every cached block's key (vLLM's ``reset_prefix_cache``). Raises ``CacheBusyError``
        while any request is in the engine."""
        with self._lock:
            if self.scheduler.has_work:
                raise CacheBusyError(f"cannot reset: {len(self._jobs)} requests are in the engine")
            pool = self.scheduler.pool
            for block_id in list(pool.evictable_block_ids()):
                pool.uncache(block_id)

    def _check_request(self, ids: list[int], sampling: SamplingParams) -> str | None:
        problem = check_request(self.loaded, ids, sampling)  # the copy engine's rules, then the pool's
        if problem is not None:
            return problem
        need = blocks_for(len(ids) + sampling.max_tokens - 1, self.block_size)
        if need > self.config.pool.capacity_blocks:
            return (f"prompt + max_tokens need {need} blocks of {self.block_size} tokens; the KV pool has "
                    f"{self.config.pool.capacity_blocks} (raise --cache-size)")
        return None

    # -- the step loop -----------------------------------------------------------------------------

    def _work(self) -> None:
        """The worker thread: steps while there is work, then ends (``submit`` starts a new one), so an
        idle engine holds no thread and can be garbage-collected with its pool."""
        while True:
            with self._lock:
                if not self.scheduler.has_work and not self._aborted:
                    self._worker = None
                    return
            try:
                self.step()
            except Exception:  # noqa: BLE001 - the step's sequences got the error through their futures
                continue

    @torch.inference_mode()
    def step(self) -> int:
        """One scheduling step (module docstring); returns the sequences it ran."""
        with self._lock:
            aborted, self._aborted = self._aborted, set()
            for seq_id in aborted:
                if seq_id in self._jobs:
                    self._fail(self._jobs[seq_id], None)
            batch = self.scheduler.schedule()
        now = time.perf_counter()
        for seq, _ in batch.items:
            job = self._jobs[seq.seq_id]
            if job.admitted_s is None:
                job.admitted_s = now
        groups = [[item] for item in batch.items] if self.config.batch_invariant else [list(batch.items)]
        for group in groups:
            if group:
                self._run_group(group)
        return len(batch.items)

    def _run_group(self, group: list[tuple[Sequence, int]]) -> None:
        try:
            logits = self._forward(group)  # (sampled sequences, vocab)
        except BaseException as error:
            with self._lock:
                for seq, _ in group:
                    self._fail(self._jobs[seq.seq_id], error)
            raise
        row = 0
        for seq, num_new in group:
            with self._lock:
                self.scheduler.computed(seq, num_new)
            if seq.num_pending_tokens == 0:
                self._sample(self._jobs[seq.seq_id], logits[row])
                row += 1

    def _forward(self, group: list[tuple[Sequence, int]]) -> torch.Tensor:
        """One packed forward; logits of the sequences that sample after it, ``(n, vocab)``."""
        device, block_size = self.loaded.device, self.block_size
        ids, positions, slot_blocks, slices, keep = [], [], [], [], []
        for seq, num_new in group:
            start, stop = seq.num_computed_tokens, seq.num_computed_tokens + num_new
            table = seq.block_table
            slices.append(SequenceSlice(len(ids), num_new, torch.tensor(table, device=device), stop))
            ids.extend(seq.token_ids[start:stop])
            positions.extend(range(start, stop))
            slot_blocks.extend(table[p // block_size] for p in range(start, stop))
            if stop == seq.num_tokens:
                keep.append(len(ids) - 1)
        position_tensor = torch.tensor(positions, device=device)  # (tokens,)
        paged = PagedForward.plan(self.kv_pool, torch.tensor(slot_blocks, device=device),  # (tokens,)
                                  position_tensor % block_size, slices)
        output = self.loaded.model(input_ids=torch.tensor([ids], device=device),  # (1, tokens)
                                   position_ids=position_tensor[None], use_cache=False,
                                   attention_mask=skip_mask_creation(device),
                                   logits_to_keep=torch.tensor(keep, device=device), kvbench_paged=paged)
        return output.logits[0]  # (sampled sequences, vocab)

    def _sample(self, job: _Job, logits: torch.Tensor) -> None:
        token = sample_next_token(logits, job.sampling, job.generator)
        seq = job.seq
        seq.token_ids.append(token)
        job.token_s.append(time.perf_counter())
        if job.prefill_ms is None:
            job.prefill_ms = (job.token_s[0] - job.admitted_s) * 1e3
        try:
            stop = job.on_token is not None and job.on_token(token) is True  # True: a stop sequence matched
        except BaseException as error:  # the caller's callback stops its own request only
            with self._lock:
                self._fail(job, error)
            return
        if stop or job.num_output_tokens >= job.sampling.max_tokens or token in job.eos:
            with self._lock:
                self.scheduler.finish(seq)
                del self._jobs[seq.seq_id]
            self._complete(job)

    def _fail(self, job: _Job, error: BaseException | None) -> None:
        """Finish ``job`` now, blocks freed; its future raises ``error`` (``None``: cancelled). Lock held."""
        self.scheduler.finish(job.seq)
        self._jobs.pop(job.seq.seq_id, None)
        if not job.future.done():
            if error is None:
                job.future.cancel()
            else:
                job.future.set_exception(error)

    def _complete(self, job: _Job) -> None:
        record = _record(job)
        if self.config.verify:
            reference = self._reference_engine().generate(job.seq.token_ids[:job.seq.num_prompt_tokens],
                                                           job.sampling, salt=job.seq.salt)
            matches = reference.output_token_ids == record.output_token_ids
            record = replace(record, output_matches_reference=matches if job.sampling.is_reproducible else None)
        if not job.future.done():
            job.future.set_result(record)

    def _reference_engine(self):
        if self._reference is None:
            from kvbench.engine.engine import HFEngine

            self._reference = HFEngine(self.loaded)
        return self._reference

    # -- memory ------------------------------------------------------------------------------------

    def held_kv_bytes(self) -> int:
        """Bytes of the pool's blocks that hold K/V someone can use: running and cached blocks."""
        pool = self.scheduler.pool
        num_held = pool.num_used_blocks + pool.num_evictable_blocks
        return num_held * self.kv_pool.bytes_per_block

    def check_invariants(self) -> None:
        """The scheduler's and pool's invariants (``AssertionError``); for randomized tests."""
        with self._lock:
            self.scheduler.check_invariants(job.seq for job in self._jobs.values())


def _record(job: _Job) -> RequestRecord:
    seq, token_s, start_s = job.seq, job.token_s, job.admitted_s
    ttft_ms, e2e_ms = (token_s[0] - start_s) * 1e3, (token_s[-1] - start_s) * 1e3
    tokens = tuple(seq.token_ids[seq.num_prompt_tokens:])
    return RequestRecord(
        status=Status.OK, prompt_tokens=seq.num_prompt_tokens, cached_prompt_tokens=seq.num_cached_tokens,
        output_tokens=len(tokens), output_tokens_source="engine", output_token_ids=tokens,
        ttft_ms=ttft_ms, tpot_ms=(e2e_ms - ttft_ms) / (len(tokens) - 1) if len(tokens) > 1 else None,
        itl_ms=tuple((b - a) * 1e3 for a, b in zip(token_s, token_s[1:])), e2e_ms=e2e_ms,
        prefill_ms=job.prefill_ms, lookup_ms=None, kv_load_ms=0.0, insert_ms=0.0,
        num_inserted_blocks=seq.num_inserted_blocks, queue_ms=(start_s - job.submitted_s) * 1e3,
    )
