"""The paged engine: continuous batching over one KV pool, prefix blocks read in place.

One step (:meth:`PagedEngine.step`): apply aborts, let the :class:`Scheduler` pick sequences and
allocate their blocks, run **one packed forward** over every scheduled sequence's new tokens
(``batch_invariant``: one forward per sequence, exact against concurrency 1), key newly full
blocks, sample one token for every sequence whose pending tokens are all computed, finish those at
``max_tokens`` or EOS (blocks freed tail first). A hit costs no copy: the block table points at the
cached blocks and attention reads them in the pool (:mod:`kvbench.engine.paged.attention`).

Callers: :meth:`PagedEngine.submit` (any thread; a worker thread runs the steps while there is work)
returns a ``concurrent.futures.Future`` of the :class:`~kvbench.request.RequestRecord`;
:meth:`PagedEngine.generate` is the copy engine's synchronous call; :meth:`PagedEngine.submit_samples`
queues ``n`` parallel samples (one prefill, then forks sharing its blocks; copy-on-write copies run
before the step's forward). An exception from ``on_token`` or a cancelled future finishes exactly
that sequence and frees its blocks; an exception in a forward fails every sequence of that step, all
blocks freed. ``on_token`` returning ``True`` ends the request normally after that token (a stop
sequence matched), as in the copy engine.

Timings (``perf_counter``; token stamps after the device finished, :mod:`kvbench.engine.stamps`): a
record's clock starts at its first admission; ``queue_ms`` is the wait from ``submit``. ``kv_load_ms``
is 0 (GPU hits are read in place; ``--host-tier`` loads are copied within the step). Under ``--verify``
the reference passes run only while nothing runs or waits (no TTFT, ITL or E2E includes one).
"""

from __future__ import annotations

import atexit
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Sequence as Seq
from concurrent.futures import Future
from functools import partial

import numpy as np
import torch

from kvbench.cache.base import Clock
from kvbench.cache.block_hash import BlockHasher
from kvbench.engine.engine import check_request
from kvbench.engine.model import LoadedModel
from kvbench.engine.paged.attention import PagedForward, SequenceSlice, skip_mask_creation, use_paged_attention
from kvbench.engine.paged.config import PagedConfig
from kvbench.engine.paged.held import PoolMeter
from kvbench.engine.paged.jobs import Job, job_record, sample_sampling
from kvbench.engine.paged.kernels import start_kernel
from kvbench.engine.paged.kv_pool import HostKV, KVPool
from kvbench.engine.paged.scheduler import Scheduler, Sequence, blocks_for
from kvbench.engine.paged.verify import Verifier, VerifyReport
from kvbench.engine.sampling import SamplingParams, sample_next_token
from kvbench.engine.stamps import stamp_s
from kvbench.errors import CacheBusyError, InputError
from kvbench.request import RequestRecord

_WORKERS: dict[threading.Thread, weakref.ref] = {}  # every worker thread not known to have ended -> its engine


@atexit.register
def _stop_workers_at_exit() -> None:
    """A worker thread still inside torch, or still tearing down its thread state, when the interpreter
    finalizes aborts the process (``terminate called without an active exception``, exit status 134):
    seen when a server, benchmark or interrupted run leaves with requests in flight, and after an
    interrupt even once the engine was collected. Stop every live engine's worker at a step boundary
    and join every worker thread (atexit handlers run before finalization; a step is one forward)."""
    for engine in [ref() for ref in list(_WORKERS.values())]:
        if engine is not None:
            engine._stopping = True
    for thread in list(_WORKERS):
        thread.join(timeout=60.0)


class RequestFuture(Future):
    """A future of one request's :class:`RequestRecord`; ``seq_id`` names it for :meth:`PagedEngine.abort`
    (``None``: refused at submit)."""

    seq_id: int | None = None


class PagedEngine:
    """Runs requests of token ids through one model with a paged KV pool and continuous batching.

    Example::

        engine = PagedEngine(load_model(), PagedConfig(CacheConfig(capacity_blocks=4096)))
        record = engine.generate(token_ids, SamplingParams(max_tokens=32, ignore_eos=True))

    ``clock`` (seconds) is the TTL clock, injectable for tests; latencies always use ``perf_counter``.

    Raises:
        InputError: the model's attention does not go through transformers' attention interface.
    """

    def __init__(self, loaded: LoadedModel, config: PagedConfig, clock: Clock | None = None) -> None:
        if not hasattr(loaded.model, "set_attn_implementation"):
            raise InputError(f"{loaded.name}: the paged engine needs a transformers model")
        use_paged_attention(loaded.model)
        self.loaded = loaded
        self.config = config
        block_size = config.pool.block_size
        self.kv_pool = KVPool(loaded.kv_layout(block_size), config.pool.capacity_blocks, loaded.device, loaded.dtype)
        self.attention_kernel, self._decode_kernel = start_kernel(self.kv_pool, config.attention_kernel)
        hasher = BlockHasher(block_size, config.pool.hash) if config.prefix_caching else None
        self.scheduler = Scheduler(config.pool.capacity_blocks, block_size, hasher, config.max_num_seqs,
                                   config.max_num_batched_tokens,
                                   tail_first=config.pool.release_order.value == "tail-first",
                                   ttl_s=config.pool.ttl_s, clock=clock, kind=config.pool.kind,
                                   host_tier_blocks=config.host_tier_blocks)
        self.host_kv = HostKV(self.kv_pool, config.host_tier_blocks) if config.host_tier_blocks else None
        self.meter = PoolMeter(self.kv_pool.bytes_per_block, self.kv_pool.allocated_bytes)
        self._jobs: dict[int, Job] = {}
        self._seq_ids = itertools.count()
        self._lock = threading.Lock()
        self._aborted: set[int] = set()
        self._worker: threading.Thread | None = None
        self._stopping = False  # set at interpreter exit: the worker ends after its current step
        self._verifier = Verifier(loaded) if config.verify else None  # the cache-off copy engine, for verify

    @property
    def block_size(self) -> int:
        return self.config.pool.block_size

    # -- callers -----------------------------------------------------------------------------------

    def submit(self, token_ids: Seq[int] | np.ndarray, sampling: SamplingParams = SamplingParams(),
               salt: str | None = None, on_token: Callable[[int], bool | None] | None = None) -> RequestFuture:
        """Queue one request (any thread); the future gets its :class:`RequestRecord`. Bad input gives
        a record with status ``error`` at once; ``on_token`` runs in the worker thread."""
        callback = None if on_token is None else (lambda _sample, token_id: on_token(token_id))
        return self.submit_samples(token_ids, sampling, 1, salt, callback)[0]

    def submit_samples(self, token_ids: Seq[int] | np.ndarray, sampling: SamplingParams, n: int,
                       salt: str | None = None,
                       on_token: Callable[[int, int], bool | None] | None = None) -> list[RequestFuture]:
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
        jobs = [self._job(Sequence(next(self._seq_ids), list(ids), len(ids), salt), sample_sampling(sampling, index),
                          future, on_token, index) for index, future in enumerate(futures)]
        jobs[0].forks = jobs[1:]  # forked from sample 0 once its prefill has run
        with self._lock:
            for job in jobs:
                self._jobs[job.seq.seq_id] = job
            self.scheduler.add(jobs[0].seq)
            if self._worker is None and not self._stopping:
                self._worker = threading.Thread(target=self._work, name="kvbench-paged", daemon=True)
                for ended in [thread for thread in _WORKERS if not thread.is_alive()]:
                    del _WORKERS[ended]
                _WORKERS[self._worker] = weakref.ref(self)
                self._worker.start()
        return futures

    def _job(self, seq: Sequence, sampling: SamplingParams, future: RequestFuture,
             on_token: Callable[[int, int], bool | None] | None, index: int) -> Job:
        generator = None
        if sampling.temperature > 0 and sampling.seed is not None:
            generator = torch.Generator(device=self.loaded.device).manual_seed(sampling.seed)
        eos = () if sampling.ignore_eos else self.loaded.eos_token_ids
        callback = None if on_token is None else partial(on_token, index)
        future.seq_id = seq.seq_id
        return Job(seq, sampling, future, callback, eos, time.perf_counter(), generator)

    def generate(self, token_ids: Seq[int] | np.ndarray, sampling: SamplingParams = SamplingParams(),
                 salt: str | None = None, on_token: Callable[[int], bool | None] | None = None) -> RequestRecord:
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

    def wait_idle(self, timeout_s: float | None = None) -> None:
        """Block until the worker thread has ended (no request left), e.g. before the process exits:
        a daemon thread still inside torch at interpreter shutdown aborts the process."""
        with self._lock:
            worker = self._worker
        if worker is not None:
            worker.join(timeout_s)

    def reset_prefix_cache(self) -> None:
        """Drop every cached block's key (vLLM's ``reset_prefix_cache``). Raises ``CacheBusyError``
        while any request is in the engine."""
        with self._lock:
            if self.scheduler.has_work:
                raise CacheBusyError(f"cannot reset: {len(self._jobs)} requests are in the engine")
            pool = self.scheduler.pool
            for block_id in list(pool.evictable_block_ids()):
                pool.uncache(block_id)
            if self.scheduler.host is not None:
                self.scheduler.host.clear()

    def _check_request(self, ids: list[int], sampling: SamplingParams) -> str | None:
        problem = check_request(self.loaded, ids, sampling)  # the copy engine's rules, then the pool's
        return problem if problem is not None else self.pool_refusal(len(ids), sampling.max_tokens)

    def pool_refusal(self, num_prompt_tokens: int, max_tokens: int) -> str | None:
        """Why a request of ``num_prompt_tokens`` + ``max_tokens`` can never fit the pool (its sequence
        needs more blocks than the pool has), or ``None``; such a request is refused at submit."""
        need = blocks_for(num_prompt_tokens + max_tokens - 1, self.block_size)
        if need > self.config.pool.capacity_blocks:
            return (f"prompt + max_tokens need {need} blocks of {self.block_size} tokens; the KV pool has "
                    f"{self.config.pool.capacity_blocks} (raise --cache-size)")
        return None

    # -- the step loop -----------------------------------------------------------------------------

    def _work(self) -> None:
        """The worker thread: steps while there is work, then runs the deferred ``--verify`` checks
        one at a time (each re-checks for new work first), then ends (``submit`` starts a new one), so
        an idle engine holds no thread and can be garbage-collected with its pool."""
        while True:
            with self._lock:
                idle = not self.scheduler.has_work and not self._aborted
                checks = idle and self._verifier is not None and self._verifier.num_deferred > 0
                if self._stopping or (idle and not checks):
                    self._worker = None
                    return
            if checks:
                self._verifier.run_deferred()  # one reference pass, then look for new work again
                continue
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
            self.meter.observe(self.scheduler, {seq.seq_id: num_new for seq, num_new in batch.items})
        if self.host_kv is not None:  # released blocks out before reused ones are written, then the loads
            self.host_kv.store(self.kv_pool, batch.host_stores)
            self.host_kv.load(self.kv_pool, batch.host_loads)
        self.kv_pool.copy_blocks(batch.copies)  # copy-on-write, before any forward writes
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
                                  position_tensor % block_size, slices, kernel=self._decode_kernel)
        output = self.loaded.model(input_ids=torch.tensor([ids], device=device),  # (1, tokens)
                                   position_ids=position_tensor[None], use_cache=False,
                                   attention_mask=skip_mask_creation(device),
                                   logits_to_keep=torch.tensor(keep, dtype=torch.long, device=device),  # (sampled,)
                                   kvbench_paged=paged)
        return output.logits[0]  # (sampled sequences, vocab)

    def _sample(self, job: Job, logits: torch.Tensor) -> None:
        if not job.forks:
            self._accept(job, sample_next_token(logits, job.sampling, job.generator), logits)
            return
        forks, job.forks = job.forks, []  # the prefill has run: fork the other samples
        with self._lock:
            live = [sample for sample in forks if sample.seq.seq_id in self._jobs]  # not aborted
            started = {seq.seq_id for seq in self.scheduler.fork(job.seq, [sample.seq for sample in live])}
        # samples past --max-num-seqs wait in the queue and sample from their own prefill later
        for sample in [job, *(sample for sample in live if sample.seq.seq_id in started)]:
            sample.admitted_s = job.admitted_s
            self._accept(sample, sample_next_token(logits, sample.sampling, sample.generator), logits)

    def _accept(self, job: Job, token: int, logits: torch.Tensor) -> None:
        if self.config.verify:  # log p of the sampled token, nats (verify.py)
            job.chosen_logprobs.append(float(torch.log_softmax(logits.float(), dim=-1)[token]))
        seq = job.seq
        seq.token_ids.append(token)
        job.token_s.append(stamp_s(self.loaded.device))  # after the device finished (engine/stamps.py)
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

    def _fail(self, job: Job, error: BaseException | None) -> None:
        """Finish ``job`` now, blocks freed; its future raises ``error`` (``None``: cancelled), as do its
        samples not yet forked. Lock held."""
        for sample in job.forks:
            self._fail(sample, error)
        job.forks = []
        self.scheduler.finish(job.seq)
        self._jobs.pop(job.seq.seq_id, None)
        if not job.future.done():
            if error is None:
                job.future.cancel()
            else:
                job.future.set_exception(error)

    def _complete(self, job: Job) -> None:
        """Hand ``job``'s record to its future; under ``--verify`` the check is deferred until no
        sequence is running or waiting (``_work``; :meth:`Verifier.defer`)."""
        record = job_record(job)
        if self._verifier is not None:
            self._verifier.defer(job.future, record, job.seq.token_ids[:job.seq.num_prompt_tokens], job.sampling,
                                 job.seq.salt, job.chosen_logprobs)
        elif not job.future.done():
            job.future.set_result(record)

    # -- memory ------------------------------------------------------------------------------------

    def held_kv_bytes(self) -> int:
        """Bytes of the pool's blocks that hold K/V someone can use: running and cached blocks."""
        pool = self.scheduler.pool
        num_held = pool.num_used_blocks + pool.num_evictable_blocks
        return num_held * self.kv_pool.bytes_per_block

    def num_sequences(self) -> tuple[int, int]:
        """``(running, waiting)`` sequences in the scheduler now (vLLM's ``num_requests_running`` /
        ``num_requests_waiting``); samples not yet forked count in neither."""
        with self._lock:
            return len(self.scheduler.running), len(self.scheduler.waiting)

    def memory_summary(self) -> dict[str, int]:
        """Measured pool bytes of the engine's life so far (:meth:`PoolMeter.summary`): peaks and now."""
        with self._lock:
            return self.meter.summary(self.scheduler)

    @property
    def verify_report(self) -> VerifyReport | None:
        """``--verify``'s counts (flips near ties, mismatches); ``None`` without verify."""
        return None if self._verifier is None else self._verifier.report

    def check_invariants(self) -> None:
        """The scheduler's and pool's invariants (``AssertionError``); for randomized tests."""
        with self._lock:
            self.scheduler.check_invariants(job.seq for job in self._jobs.values())
