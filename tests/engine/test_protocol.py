"""One engine interface: both engines built by make_engine, the copy engine's FIFO submit,
abort, reset, describe and memory through the protocol."""

import threading
from dataclasses import replace

import numpy as np
import pytest

from kvbench.cache.base import CacheConfig
from kvbench.engine.factory import EngineConfig, EngineKind, make_engine
from kvbench.engine.native import native_kernels
from kvbench.engine.protocol import Engine
from kvbench.engine.sampling import SamplingParams
from kvbench.request import Request, Status

GREEDY = SamplingParams(max_tokens=4, ignore_eos=True)
CACHE = CacheConfig(capacity_blocks=64, block_size=16)

# engine/paged/kernels.py
CPU_DECODE_KERNEL = "kvbench-cpu" if native_kernels() is not None else "sdpa-gathered"


def prompt(start: int, num_tokens: int = 40) -> list[int]:
    return [int(t) for t in np.arange(start, start + num_tokens) % 997 + 3]


@pytest.mark.parametrize("kind", list(EngineKind))
def test_make_engine_builds_both_kinds_behind_the_protocol(loaded, kind):
    engine = make_engine(loaded, EngineConfig(kind, cache=CACHE))
    assert isinstance(engine, Engine)
    assert engine.cache_config == CACHE and engine.block_size == 16
    record = engine.submit(prompt(0), GREEDY).result(timeout=120)
    again = engine.submit(prompt(0), GREEDY).result(timeout=120)
    assert record.status is Status.OK and record.output_tokens == 4 and record.cached_prompt_tokens == 0
    assert again.cached_prompt_tokens == 32 and again.output_token_ids == record.output_token_ids
    assert engine.reset_prefix_cache() is True
    assert engine.submit(prompt(0), GREEDY).result(timeout=120).cached_prompt_tokens == 0


def test_describe_gives_the_run_engine_metadata(loaded):
    assert make_engine(loaded, EngineConfig(cache=CACHE)).describe() == {"kind": "copy"}
    paged = make_engine(loaded, EngineConfig(EngineKind.PAGED, pool=CACHE, max_num_seqs=4))
    bytes_per_block = loaded.kv_layout(16).bytes_per_block
    assert paged.describe() == {
        "kind": "paged",
        "max_num_seqs": 4,
        "max_num_batched_tokens": 8192,
        "batch_invariant": False,
        "num_pool_blocks": 64,
        "pool_bytes": (64 + 1) * bytes_per_block,
        "host_tier_blocks": 0,
        "host_tier_bytes": 0,
        "attention_kernel": CPU_DECODE_KERNEL,
        "attention_kernel_reason": paged.describe()["attention_kernel_reason"],
    }
    assert paged.describe()["attention_kernel_reason"]  # why the kernel was chosen, in words
    assert paged.cache_config is None and paged.reset_prefix_cache() is False  # prefix caching off


def test_memory_gives_the_run_kv_memory_of_either_engine(loaded):
    for kind in EngineKind:
        engine = make_engine(loaded, EngineConfig(kind, cache=CACHE))
        record = engine.submit(prompt(0), GREEDY).result(timeout=120)
        memory = engine.memory([(Request(0, "r0", "s0", 0, np.asarray(prompt(0), dtype=np.uint32)), record)])
        assert memory["engine"] == kind.value
        # 43 tokens: 2 full blocks
        assert memory["end_held_kv_bytes"] == 2 * loaded.kv_layout(16).bytes_per_block


def test_the_copy_engine_runs_submitted_requests_one_at_a_time_in_order(loaded):
    engine = make_engine(loaded, EngineConfig(cache=CACHE))
    reference = [engine.generate(prompt(100 * i), GREEDY) for i in range(3)]
    engine.reset_prefix_cache()
    order, running = [], []

    def on_token(index):
        def seen(token_id):
            running.append(engine.num_sequences())
            order.append(index)

        return seen

    futures = [engine.submit(prompt(100 * i), GREEDY, on_token=on_token(i)) for i in range(3)]
    records = [future.result(timeout=120) for future in futures]
    assert order == [0] * 4 + [1] * 4 + [2] * 4  # FIFO, never interleaved
    assert running[0] == (1, 2) and running[-1] == (1, 0)
    assert [r.output_token_ids for r in records] == [r.output_token_ids for r in reference]
    # queue_ms: the wait from submit to start, at least the requests before it took
    assert records[0].queue_ms < records[1].queue_ms < records[2].queue_ms
    assert records[2].queue_ms >= records[0].e2e_ms + records[1].e2e_ms - 1.0


def test_abort_cancels_a_queued_request_and_stops_a_running_one_at_its_next_token(loaded):
    engine = make_engine(loaded, EngineConfig(cache=CACHE))
    started, tokens = [], []
    holder = {}

    def stop_self(token_id):
        tokens.append(token_id)
        engine.abort(holder["running"])  # the client leaves after the first token

    holder["running"] = engine.submit(
        prompt(0), SamplingParams(max_tokens=8, ignore_eos=True), on_token=stop_self
    )
    queued = engine.submit(prompt(500), GREEDY, on_start=lambda: started.append("queued"))
    assert engine.abort(queued) is None
    after = engine.submit(prompt(900), GREEDY).result(timeout=120)
    assert holder["running"].cancelled() and queued.cancelled()
    assert len(tokens) == 1 and started == []  # stopped at its next token; the queued one never started
    assert after.status is Status.OK and engine.cache.num_cached_blocks == 2  # only the last request's blocks
    assert engine.cache.num_evictable_blocks == 2  # nothing left pinned


def test_an_on_start_error_becomes_the_futures_and_nothing_runs(loaded):
    engine = make_engine(loaded, EngineConfig(cache=CACHE))

    def client_left():
        raise ConnectionResetError("client left")

    future = engine.submit(prompt(0), GREEDY, on_start=client_left)
    with pytest.raises(ConnectionResetError):
        future.result(timeout=120)
    engine.wait_idle(60)
    assert engine.cache.num_cached_blocks == 0


def test_the_copy_engines_reset_runs_after_every_request_queued_before_it(loaded):
    engine = make_engine(loaded, EngineConfig(cache=CACHE))
    gate = threading.Event()
    first = engine.submit(prompt(0), GREEDY, on_token=lambda _: gate.wait(60) and None)
    reset = {}
    resetter = threading.Thread(target=lambda: reset.update(done=engine.reset_prefix_cache()))
    resetter.start()
    resetter.join(0.2)
    assert resetter.is_alive() and not first.done()  # the reset waits behind the running request
    gate.set()
    resetter.join(60)
    assert reset == {"done": True} and first.result(timeout=60).status is Status.OK
    assert engine.cache.num_cached_blocks == 0  # the first request's blocks were cached, then dropped
    assert make_engine(loaded).reset_prefix_cache() is False  # cache off


def test_the_copy_engine_refuses_parallel_samples_in_one_line(loaded):
    with pytest.raises(ValueError, match=r"^n > 1 needs --engine paged \(the copy engine runs one sequence"):
        make_engine(loaded).submit_samples(prompt(0), GREEDY, 2)


def test_engine_config_names_what_an_engine_cannot_take():
    with pytest.raises(ValueError, match="--engine paged needs a KV pool"):
        EngineConfig(EngineKind.PAGED)
    with pytest.raises(ValueError, match="apply to --engine paged only"):
        EngineConfig(EngineKind.COPY, cache=CACHE, batch_invariant=True)
    assert EngineConfig("paged", cache=CACHE).kind is EngineKind.PAGED


@pytest.mark.parametrize("kind", list(EngineKind))
def test_cancelling_a_backend_request_aborts_it_in_the_engine_on_either_engine(loaded, kind):
    """One backend path (submit, await, abort on cancel): before it, a cancelled copy-engine request
    kept running in its thread after the backend's lock was released."""
    import asyncio

    from kvbench.backends.inprocess import InProcessBackend

    engine = make_engine(loaded, EngineConfig(kind, cache=CACHE))
    backend = InProcessBackend(engine, SamplingParams(ignore_eos=True), "tiny")
    first_token = threading.Event()
    request = Request(0, "r0", "s0", 0, np.asarray(prompt(0), dtype=np.uint32), max_tokens=200)

    async def cut_after_the_first_token():
        task = asyncio.ensure_future(backend.serve(request, on_token=lambda _: first_token.set()))
        while not first_token.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await backend.serve(
            replace(request, token_ids=np.asarray(prompt(500), dtype=np.uint32), max_tokens=4)
        )

    after = asyncio.run(cut_after_the_first_token())
    engine.wait_idle(60)
    # the cut request did not run on to 200 tokens
    assert after.status is Status.OK and after.queue_ms < 1_000
    num_held_blocks = engine.memory([])["end_held_kv_bytes"] // loaded.kv_layout(16).bytes_per_block
    # run to the end, the cut request alone would leave (40 + 200 - 1) // 16 = 14 blocks cached; the copy
    # engine caches nothing of a stopped request, the paged one keeps the blocks it had computed
    assert num_held_blocks == 2 if kind is EngineKind.COPY else 4 <= num_held_blocks < 8
