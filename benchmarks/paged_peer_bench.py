"""kvbench's paged engine against transformers' own continuous batching, on the same trace (not a test).

The peer is transformers' ``ContinuousBatchingManager`` (``model.init_continuous_batching``, the
engine behind ``model.generate_batch``): a paged KV cache (``PagedAttentionCache``), a FIFO
scheduler, chunked prefill, and prefix sharing (``ContinuousBatchingConfig.allow_block_sharing``).
Both engines get the same requests (the first ``--scenario-requests`` of scenarios/chat.toml and
scenarios/agent.toml, ``--max-tokens`` each, EOS ignored), the same default model (a separate copy
of the same seeded weights for the peer, since each switches its model's attention function), the
same block size (16), pool (4,096 blocks), token budget per step (8,192) and sequences per step
(8), through kvbench's one send loop at concurrency 8 (a :class:`TransformersPeer` backend adapts
the manager to ``serve(request) -> RequestRecord``).

Reported per scenario, one run, the peer's number / kvbench's: requests/s, output tokens/s, TTFT
p50 (from admission to the first token: the peer's ``lifespan[0]`` to ``timestamps[0]``), TTFT +
queue p50, prompt tokens served from shared blocks (the peer's: what its
``PagedAttentionCache.search_prefix_match`` returned per request, counted by a wrapper this script
installs), and how many greedy outputs are identical.

Run: ``python benchmarks/paged_peer_bench.py [--threads 1] [--scenario-requests 16] [--max-tokens 32]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import torch
import transformers
from paged_bench import CAPACITY_BLOCKS, print_table, scenario_requests, serve_all, summarize
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching.cache import PagedAttentionCache

from kvbench.backends.inprocess import InProcessBackend
from kvbench.cache.base import CacheConfig
from kvbench.engine.engine import SamplingParams
from kvbench.engine.model import load_model
from kvbench.engine.paged.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, PagedConfig
from kvbench.engine.paged.engine import PagedEngine
from kvbench.request import RequestRecord, Status

BLOCK_SIZE = 16  # kvbench's default block; the peer's page_size
CONCURRENCY = 8


class TransformersPeer:
    """transformers' ``ContinuousBatchingManager`` behind kvbench's ``Backend`` protocol.

    ``serve`` adds the request (greedy, ``max_new_tokens = request.max_tokens``, EOS disabled as
    ``--ignore-eos`` does) and awaits its finished ``GenerationOutput``; the record's times come
    from the peer's own timestamps (``time.perf_counter``), its cached tokens from the prefix match
    the peer made at admission.
    """

    def __init__(self, model: torch.nn.Module, max_num_seqs: int = CONCURRENCY) -> None:
        generation = GenerationConfig(do_sample=False, eos_token_id=-1, max_new_tokens=16)
        batching = ContinuousBatchingConfig(
            page_size=BLOCK_SIZE,
            num_blocks=CAPACITY_BLOCKS,
            max_batch_tokens=DEFAULT_MAX_NUM_BATCHED_TOKENS,
            max_requests_per_batch=max_num_seqs,
            allow_block_sharing=True,
        )
        self.shared_tokens: dict[str, int] = {}
        self._original_match = PagedAttentionCache.search_prefix_match
        shared, original = self.shared_tokens, self._original_match

        def counting_match(cache, request_id, prompt_ids):
            matched = original(cache, request_id, prompt_ids)
            shared[request_id] = shared.get(request_id, 0) + matched
            return matched

        PagedAttentionCache.search_prefix_match = counting_match
        self.manager = model.init_continuous_batching(generation, batching)
        self.manager.start()

    async def serve(self, request) -> RequestRecord:
        done = asyncio.get_running_loop().create_future()
        request_id = f"kvbench-{request.index}"

        def on_result(output):
            if output.is_finished() and not done.done():
                done.set_result(output)

        self.manager.register_result_handler(request_id, on_result)
        self.manager.add_request(
            request.token_ids.tolist(),
            request_id=request_id,
            max_new_tokens=request.max_tokens,
            record_timestamps=True,
        )
        output = await done
        if output.error is not None:
            return RequestRecord.failed(len(request.token_ids), output.error)
        stamps, admitted_s = output.timestamps, output.lifespan[0]
        ttft_ms, e2e_ms = (stamps[0] - admitted_s) * 1e3, (stamps[-1] - admitted_s) * 1e3
        tokens = tuple(output.generated_tokens)
        return RequestRecord(
            status=Status.OK,
            prompt_tokens=len(output.prompt_ids),
            cached_prompt_tokens=self.shared_tokens.get(request_id, 0),
            output_tokens=len(tokens),
            output_token_ids=tokens,
            ttft_ms=ttft_ms,
            e2e_ms=e2e_ms,
            itl_ms=tuple((b - a) * 1e3 for a, b in zip(stamps, stamps[1:])),
            queue_ms=(admitted_s - output.created_time) * 1e3,
        )

    def describe(self) -> dict:
        return {
            "backend": "transformers-cb",
            "model": "default",
            "cache_enabled": True,
            "cache_kind": "paged",
            "block_size": BLOCK_SIZE,
            "capacity_blocks": CAPACITY_BLOCKS,
        }

    def close(self) -> None:
        self.manager.stop(block=True, timeout=30)
        PagedAttentionCache.search_prefix_match = self._original_match


def compare(args) -> list[tuple[str, ...]]:
    ours_model, peer_model = load_model(), load_model()
    rows = []
    for name in ("chat", "agent"):
        requests = scenario_requests(name, args.scenario_requests, args.max_tokens)
        engine = PagedEngine(
            ours_model, PagedConfig(CacheConfig(CAPACITY_BLOCKS, BLOCK_SIZE), max_num_seqs=CONCURRENCY)
        )
        ours = serve_all(
            requests,
            InProcessBackend(engine, SamplingParams(max_tokens=1, ignore_eos=True), ours_model.name),
            CONCURRENCY,
        )
        peer_backend = TransformersPeer(peer_model.model)
        try:
            peer = serve_all(requests, peer_backend, CONCURRENCY)
        finally:
            peer_backend.close()
        (o_rps, o_tps, o_ttft, o_wait, o_hit), (p_rps, p_tps, p_ttft, p_wait, p_hit) = (
            summarize(ours),
            summarize(peer),
        )
        same = sum(a.output_token_ids == b.output_token_ids for a, b in zip(ours, peer))
        rows.append(
            (
                name,
                f"{p_rps:.2f} / {o_rps:.2f} ({o_rps / p_rps:.2f}x)",
                f"{p_tps:.1f} / {o_tps:.1f} ({o_tps / p_tps:.2f}x)",
                f"{p_ttft:.0f} / {o_ttft:.0f}",
                f"{p_wait:.0f} / {o_wait:.0f}",
                f"{p_hit:,} / {o_hit:,}",
                f"{same} / {len(ours)}",
            )
        )
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario-requests", type=int, default=16, help="requests per scenario")
    parser.add_argument("--max-tokens", type=int, default=32, help="output tokens per request")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    start_s, load_before = time.perf_counter(), os.getloadavg()[0]
    print_table(
        (
            f"concurrency {CONCURRENCY}, {args.scenario_requests} requests x {args.max_tokens} tokens",
            "requests/s peer / kvbench",
            "output tok/s peer / kvbench",
            "TTFT p50 ms peer / kvbench",
            "TTFT + queue p50 ms peer / kvbench",
            "shared prompt tokens peer / kvbench",
            "identical greedy outputs",
        ),
        compare(args),
    )
    print(
        f"{torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs, load average {load_before:.1f} -> "
        f"{os.getloadavg()[0]:.1f}, run {time.perf_counter() - start_s:.0f} s, transformers "
        f"{transformers.__version__}"
    )


if __name__ == "__main__":
    main()
