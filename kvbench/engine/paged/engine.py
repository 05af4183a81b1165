"""The paged engine: continuous batching over one KV pool, prefix blocks read in place.

One step (:meth:`PagedEngine.step`): apply aborts, let the :class:`Scheduler` pick sequences and
allocate their blocks, run **one packed forward** over every scheduled sequence's new tokens
(``batch_invariant``: one forward per sequence, exact against concurrency 1), key newly full
blocks, sample one token for every sequence whose pending tokens are all computed, finish those at
``max_tokens`` or EOS (blocks freed tail first). A hit costs no copy: the block table points at the
cached blocks and attention reads them in the pool (:mod:`kvbench.engine.paged.attention`).

Callers (:mod:`kvbench.engine.paged.calls`, the :class:`kvbench.engine.protocol.Engine` interface):
:meth:`PagedEngine.submit` (any thread; a worker thread, :mod:`kvbench.engine.worker`, runs the steps
while there is work) returns a ``concurrent.futures.Future`` of the :class:`~kvbench.request.RequestRecord`;
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

import itertools
import threading
import time

import torch

from kvbench.cache.base import Clock
from kvbench.cache.block_hash import BlockHasher
from kvbench.engine.model import LoadedModel
from kvbench.engine.paged.attention import (
    PagedForward,
    SequenceSlice,
    skip_mask_creation,
    use_paged_attention,
)
from kvbench.engine.paged.calls import PagedCalls
from kvbench.engine.paged.config import PagedConfig
from kvbench.engine.paged.held import PoolMeter
from kvbench.engine.paged.jobs import Job, job_record
from kvbench.engine.paged.kernels import start_kernel
from kvbench.engine.paged.kv_pool import HostKV, KVPool
from kvbench.engine.paged.scheduler import Scheduler, Sequence
from kvbench.engine.paged.verify import Verifier
from kvbench.engine.sampling import sample_next_token
from kvbench.engine.stamps import stamp_s
from kvbench.engine.worker import Task, Worker
from kvbench.errors import InputError


class PagedEngine(PagedCalls):
    """Runs requests of token ids through one model with a paged KV pool and continuous batching.

    Example::

        engine = PagedEngine(load_model(), PagedConfig(CacheConfig(capacity_blocks=4096)))
        record = engine.generate(token_ids, SamplingParams(max_tokens=32, ignore_eos=True))

    ``clock`` (seconds) is the TTL clock, injectable for tests as the copy engine's; latencies always
    use ``time.perf_counter``.

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
        self.kv_pool = KVPool(
            loaded.kv_layout(block_size), config.pool.capacity_blocks, loaded.device, loaded.dtype
        )
        self.attention_kernel, self._decode_kernel = start_kernel(self.kv_pool, config.attention_kernel)
        hasher = BlockHasher(block_size, config.pool.hash) if config.prefix_caching else None
        self.scheduler = Scheduler(
            config.pool.capacity_blocks,
            block_size,
            hasher,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            tail_first=config.pool.release_order.value == "tail-first",
            ttl_s=config.pool.ttl_s,
            clock=clock,
            kind=config.pool.kind,
            host_tier_blocks=config.host_tier_blocks,
        )
        self.host_kv = HostKV(self.kv_pool, config.host_tier_blocks) if config.host_tier_blocks else None
        self.meter = PoolMeter(self.kv_pool.bytes_per_block, self.kv_pool.allocated_bytes)
        self._jobs: dict[int, Job] = {}
        self._seq_ids = itertools.count()
        self._lock = threading.Lock()
        self._aborted: set[int] = set()
        self._worker = Worker(self._lock, self._next_task, "kvbench-paged")
        self._verifier = Verifier(loaded) if config.verify else None  # the cache-off copy engine, for verify

    # -- the step loop -----------------------------------------------------------------------------

    def _next_task(self) -> Task | None:
        """The worker thread's next task (lock held): a step while there is work, then the deferred
        ``--verify`` checks one at a time (each re-checks for new work first), then ``None``: the thread
        ends (``submit`` starts a new one), so an idle engine holds no thread and can be
        garbage-collected with its pool."""
        if self.scheduler.has_work or self._aborted:
            return self.step  # an exception in it reached the step's sequences through their futures
        if self._verifier is not None and self._verifier.num_deferred > 0:
            return self._verifier.run_deferred  # one reference pass, then look for new work again
        return None

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
        paged = PagedForward.plan(
            self.kv_pool,
            torch.tensor(slot_blocks, device=device),  # (tokens,)
            position_tensor % block_size,
            slices,
            kernel=self._decode_kernel,
        )
        output = self.loaded.model(
            input_ids=torch.tensor([ids], device=device),  # (1, tokens)
            position_ids=position_tensor[None],
            use_cache=False,
            attention_mask=skip_mask_creation(device),
            logits_to_keep=torch.tensor(keep, dtype=torch.long, device=device),  # (sampled,)
            kvbench_paged=paged,
        )
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
            self._verifier.defer(
                job.future,
                record,
                job.seq.token_ids[: job.seq.num_prompt_tokens],
                job.sampling,
                job.seq.salt,
                job.chosen_logprobs,
            )
        elif not job.future.done():
            job.future.set_result(record)
