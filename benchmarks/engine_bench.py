"""What the in-process engine's prefix cache buys on a shared 2,000-token prefix (not a test).

Workload: one 2,000-token shared prefix + a unique 50-token suffix per request, random token ids
of the default model's vocabulary (no tokenizer needed), ``max_tokens`` 32 with EOS ignored, greedy.
Measured in one run, medians over ``--num-requests`` requests, with cache-on, cache-off and ideal
requests interleaved so that a noisy machine slows all of them alike:

* warm TTFT (cache on, prefix cached) vs cold TTFT (cache off): what the cache buys;
* warm TTFT vs ideal: a forward over the same uncached tail with a ready-made past (no hashing, no
  lookup, no concatenation of blocks): what the cache's bookkeeping costs;
* the concatenation's share of warm TTFT at block size 16 vs 64 (more, smaller blocks to join);
* the first request cache on vs off: nothing to hit, plus copying and inserting its blocks;
* decode tokens/s on vs off (the cache should not change decode).

Run: ``python benchmarks/engine_bench.py [--num-requests 8] [--threads 1]``. Prints a Markdown table.
On a machine other processes keep busy, ``--threads 1`` gives steadier numbers: with as many torch
(OpenMP) threads as cores, a descheduled thread stalls the other at every barrier, and single
forwards then take 3-6x longer at random.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from kvbench.cache.base import CacheConfig
from kvbench.engine.engine import CopyConfig, HFEngine, SamplingParams
from kvbench.engine.model import load_model
from kvbench.request import RequestRecord


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=6, help="warm/cold/ideal requests each")
    parser.add_argument("--prefix-tokens", type=int, default=2000)
    parser.add_argument("--suffix-tokens", type=int, default=50)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    return parser.parse_args(argv)


def median(values) -> float:
    return statistics.median(values)


def decode_tokens_per_s(result: RequestRecord) -> float:
    return 1e3 / result.tpot_ms


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    start_s, load_before = time.perf_counter(), os.getloadavg()[0]
    loaded = load_model()
    warm, cold, firsts, ideal_ms = measure(args, loaded)
    print_table(args, loaded, warm, cold, ideal_ms, firsts)
    print(
        f"\n{torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs, load average "
        f"{load_before:.1f} -> {os.getloadavg()[0]:.1f}, run {time.perf_counter() - start_s:.0f} s, "
        f"{loaded.name}, torch {torch.__version__}"
    )


def measure(args: argparse.Namespace, loaded):
    """Interleaved warm (block 16 and 64), cold, ideal and first (empty cache) requests."""
    rng = np.random.default_rng(args.seed)
    prefix = rng.integers(0, loaded.vocab_size, args.prefix_tokens).tolist()
    prompts = [
        prefix + rng.integers(0, loaded.vocab_size, args.suffix_tokens).tolist()
        for _ in range(args.num_requests + 1)
    ]
    sampling = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    capacity_blocks = 2 * len(prompts[0]) * (args.num_requests + 1) // 16  # never evicts here
    off = HFEngine(loaded)

    def cached(block_size: int) -> HFEngine:
        return HFEngine(loaded, CopyConfig(cache=CacheConfig(capacity_blocks, block_size=block_size)))

    on = {bs: cached(bs) for bs in (16, 64)}
    first = cached(16)  # its cache is reset before each of its requests
    off.generate(prompts[0][:64], SamplingParams(max_tokens=2))  # warm up kernels and allocator
    for engine in on.values():
        engine.generate(prompts[0], sampling)  # caches the prefix
    hit_tokens = {bs: args.prefix_tokens // bs * bs for bs in (16, 64)}
    past = off.compute_kv(prompts[0][: hit_tokens[16]])  # the ideal's ready-made past
    warm, cold, firsts, ideal_ms = {16: [], 64: []}, [], [], []
    for prompt in prompts[1:]:
        for bs in (16, 64):
            warm[bs].append(on[bs].generate(prompt, sampling))
        cold.append(off.generate(prompt, sampling))
        ideal_ms.append(off.ideal_prefill(past, prompt[hit_tokens[16] :], sampling)[1])
        first.cache.reset()
        firsts.append(first.generate(prompt, sampling))
    if any(r.cached_prompt_tokens != hit_tokens[bs] for bs in (16, 64) for r in warm[bs]):
        raise RuntimeError("a warm request missed the cached prefix")
    for results in [*warm.values(), firsts]:
        if any(a.output_token_ids != b.output_token_ids for a, b in zip(results, cold)):
            raise RuntimeError("cache-on output differs from cache-off output")
    return warm, cold, firsts, ideal_ms


def print_table(args, loaded, warm, cold, ideal_ms, firsts) -> None:
    rows = (
        ttft_rows(warm, cold, ideal_ms) + concatenation_rows(warm) + first_and_decode_rows(warm, cold, firsts)
    )
    print(
        f"engine_bench: {args.prefix_tokens}-token shared prefix + {args.suffix_tokens}-token suffixes, "
        f"max_tokens {args.max_tokens}, {args.num_requests} requests each, "
        f"{loaded.kv_layout(16).bytes_per_token} KV bytes/token\n"
    )
    print("| measure | value | note |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def ttft_rows(warm, cold, ideal_ms) -> list[tuple[str, str, str]]:
    """Warm TTFT (block 16) against cold and ideal, and the warm prefill alone."""
    w16 = warm[16]
    warm_ttft = median(r.ttft_ms for r in w16)
    cold_ttft = median(r.ttft_ms for r in cold)
    ideal = median(ideal_ms)
    return [
        (
            "warm TTFT, cache on (block 16)",
            f"{warm_ttft:.1f} ms",
            f"hits {w16[0].cached_prompt_tokens} of {w16[0].prompt_tokens} tokens",
        ),
        (
            "cold TTFT, cache off",
            f"{cold_ttft:.1f} ms",
            f"warm / cold = {warm_ttft / cold_ttft:.3f} ({cold_ttft / warm_ttft:.1f}x faster)",
        ),
        (
            "ideal TTFT (forward over the tail, ready past)",
            f"{ideal:.1f} ms",
            f"warm / ideal = {warm_ttft / ideal:.2f}",
        ),
        (
            "warm prefill alone (forward over the tail)",
            f"{median(r.prefill_ms for r in w16):.1f} ms",
            "the ideal's work, inside a warm request",
        ),
    ]


def concatenation_rows(warm) -> list[tuple[str, str, str]]:
    """The concatenation of cached blocks at each block size, and its share of warm TTFT."""
    rows = []
    for bs, results in warm.items():
        load_ms = median(r.kv_load_ms for r in results)
        share = median(r.kv_load_ms / r.ttft_ms for r in results)
        rows.append(
            (
                f"concatenation, block {bs} ({results[0].cached_prompt_tokens // bs} blocks)",
                f"{load_ms:.2f} ms",
                f"{share:.1%} of warm TTFT {median(r.ttft_ms for r in results):.1f} ms",
            )
        )
    return rows


def first_and_decode_rows(warm, cold, firsts) -> list[tuple[str, str, str]]:
    """Lookup and hashing, the first request (empty cache) on vs off, and decode speed on vs off."""
    w16 = warm[16]
    cold_ttft = median(r.ttft_ms for r in cold)
    return [
        ("lookup + hashing, block 16", f"{median(r.lookup_ms for r in w16):.2f} ms", ""),
        (
            "first request TTFT, cache on / off",
            f"{median(r.ttft_ms for r in firsts):.0f} / {cold_ttft:.0f} ms",
            f"empty cache: nothing to hit; {firsts[0].num_inserted_blocks} blocks inserted after the last "
            "token",
        ),
        (
            "first request insert (copy + insert)",
            f"{median(r.insert_ms for r in firsts):.1f} ms",
            f"{median(r.insert_ms / r.e2e_ms for r in firsts):.2%} of its E2E "
            f"{median(r.e2e_ms for r in firsts):.0f} ms (off: {median(r.e2e_ms for r in cold):.0f} ms)",
        ),
        (
            "decode, cache on / off",
            f"{median(map(decode_tokens_per_s, w16)):.1f} / "
            f"{median(map(decode_tokens_per_s, cold)):.1f} tok/s",
            "TPOT-based, medians",
        ),
    ]


if __name__ == "__main__":
    main()
