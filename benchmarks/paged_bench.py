"""The paged engine against the copy engine (not a test): TTFT vs ideal, pool bytes, throughput.

Measured in one run on the default model, medians over interleaved requests (a noisy machine slows
all variants alike), ratios between variants of the same run:

1. **warm TTFT vs ideal** (shared_2k's shape: a 2,000-token prefix + unique 50-token suffixes,
   random ids, greedy, prefix cached): copy engine, paged engine, and the ideal (a forward over the
   same tail with a ready-made past: no hashing, lookup, concatenation or gather).
2. **bytes for 8 concurrent requests sharing the prefix**: the paged engine's pool blocks in use or
   cached at the peak (measured from the block pool while the 8 run), vs the copy engine's block
   tensors (measured storage) plus the 8 contiguous caches it would build, one per request
   (``(prompt + output) x KV bytes per token``; the copy engine runs one request at a time, so it
   never holds them together: that is the point).
3. **throughput at concurrency 8** on scenarios/chat.toml and scenarios/agent.toml through the one
   send loop, closed loop, both engines on the same requests in one run, per torch thread setting
   (``--threads 1,default``). Two ways to pick the requests (``--setup``):

   - ``sessions`` (default, the representative one): every one of the first ``--sessions`` K
     sessions' first ``--turns`` T turns, sent round-robin by turn (turn 1 of each session, then
     turn 2, ...), each with the scenario's own ``max_tokens`` (chat: the reply's length, lognormal
     median 180; agent: the tool call's, ~26, and 200 for a final step), EOS ignored. A session's
     next turn waits for its previous one (the send loop's rule), so in trace order the first
     requests cover few sessions (chat's first 16: 9 conversations; agent's: 3 runs) and the batch
     never fills; round-robin keeps ~8 sessions in flight until the last turns drain.
   - ``first-n``: the first ``--scenario-requests`` requests in trace order, ``--max-tokens`` each
     (the setup of the first version of this benchmark).

   Reported: requests/s and output tokens/s (over the run's wall time), TTFT p50 and TTFT + queue
   p50, cached prompt tokens, the process CPU seconds each engine used (``time.process_time``, all
   threads: on a shared machine the wall-clock ratio depends on what else runs, the CPU-time ratio
   much less), and how full the paged engine's batches were: sequences per step, decoding
   sequences per step that decodes, and the decode batch the average output token was sampled in
   (the copy engine's is 1).

Run: ``python benchmarks/paged_bench.py [--num-requests 6] [--threads 1,default] [--skip ttft,memory]``.
Prints Markdown tables. The decode-step ceiling: ``benchmarks/paged_decode_scaling.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from kvbench.backends.inprocess import InProcessBackend
from kvbench.cache.base import CacheConfig
from kvbench.engine.engine import CopyConfig, HFEngine, SamplingParams
from kvbench.engine.model import load_model
from kvbench.engine.paged.engine import PagedConfig, PagedEngine
from kvbench.run.config import RunFlags
from kvbench.run.execute import prepared_requests
from kvbench.run.loop import LoadConfig, run_requests
from kvbench.run.setup import run_section
from kvbench.run.source import load_source
from kvbench.workloads.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parent.parent
CAPACITY_BLOCKS = 4096  # never evicts here


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=6, help="warm requests per variant (part 1)")
    parser.add_argument(
        "--setup",
        choices=("sessions", "first-n"),
        default=None,
        help="part 3's requests (default: first-n if --scenario-requests or --max-tokens is given)",
    )
    parser.add_argument("--sessions", type=int, default=8, help="sessions per scenario (part 3, sessions)")
    parser.add_argument("--turns", type=int, default=3, help="turns per session (part 3, sessions)")
    parser.add_argument(
        "--scenario-requests", type=int, default=None, help="requests per scenario (first-n; 16)"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="output tokens per request (first-n; 16)"
    )
    parser.add_argument(
        "--threads", default="default", help="comma list of torch thread counts; 'default' = torch's"
    )
    parser.add_argument("--skip", default="", help="comma list of parts to skip: ttft,memory,throughput")
    args = parser.parse_args(argv)
    first_n_flags = args.scenario_requests is not None or args.max_tokens is not None
    if args.setup == "sessions" and first_n_flags:
        parser.error("--scenario-requests / --max-tokens belong to --setup first-n")
    args.setup = args.setup or ("first-n" if first_n_flags else "sessions")
    args.scenario_requests, args.max_tokens = args.scenario_requests or 16, args.max_tokens or 16
    return args


def ttft_vs_ideal(loaded, num_requests: int) -> list[tuple[str, str, str]]:
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, loaded.vocab_size, 2000).tolist()
    prompts = [prefix + rng.integers(0, loaded.vocab_size, 50).tolist() for _ in range(num_requests + 1)]
    sampling = SamplingParams(max_tokens=1, ignore_eos=True)
    copy = HFEngine(loaded, CopyConfig(cache=CacheConfig(CAPACITY_BLOCKS)))
    paged = PagedEngine(loaded, PagedConfig(CacheConfig(CAPACITY_BLOCKS)))
    for engine in (copy, paged):
        engine.generate(prompts[0], sampling)  # caches the prefix
    past = HFEngine(loaded).compute_kv(prompts[0][:2000])
    copy_ms, paged_ms, ideal_ms = [], [], []
    for prompt in prompts[1:]:
        warm_copy, warm_paged = copy.generate(prompt, sampling), paged.generate(prompt, sampling)
        assert warm_copy.cached_prompt_tokens == warm_paged.cached_prompt_tokens == 2000
        assert warm_copy.output_token_ids == warm_paged.output_token_ids
        copy_ms.append(warm_copy.ttft_ms)
        paged_ms.append(warm_paged.ttft_ms)
        ideal_ms.append(HFEngine(loaded).ideal_prefill(past, prompt[2000:], sampling)[1])
    copy_t, paged_t, ideal_t = map(statistics.median, (copy_ms, paged_ms, ideal_ms))
    return [
        ("warm TTFT, copy engine", f"{copy_t:.1f} ms", f"copy / ideal = {copy_t / ideal_t:.3f}"),
        ("warm TTFT, paged engine", f"{paged_t:.1f} ms", f"paged / ideal = {paged_t / ideal_t:.3f}"),
        (
            "ideal (forward over the tail, ready past)",
            f"{ideal_t:.1f} ms",
            f"paged / copy = {paged_t / copy_t:.3f}",
        ),
    ]


def bytes_for_eight(loaded) -> list[tuple[str, str, str]]:
    rng = np.random.default_rng(1)
    prefix = rng.integers(0, loaded.vocab_size, 2000).tolist()
    prompts = [prefix + rng.integers(0, loaded.vocab_size, 50).tolist() for _ in range(8)]
    sampling = SamplingParams(max_tokens=8, ignore_eos=True)
    layout = loaded.kv_layout(16)
    paged = PagedEngine(loaded, PagedConfig(CacheConfig(CAPACITY_BLOCKS)))
    paged.generate(prefix + [1], SamplingParams(max_tokens=1))  # caches the prefix's 125 blocks
    peak = []
    futures = [
        paged.submit(p, sampling, on_token=lambda _: peak.append(paged.held_kv_bytes())) for p in prompts
    ]
    assert all(f.result().cached_prompt_tokens == 2000 for f in futures)
    copy = HFEngine(loaded, CopyConfig(cache=CacheConfig(CAPACITY_BLOCKS)))
    copy.generate(prompts[0], sampling)
    copy_blocks = copy.held_kv_bytes()
    contiguous = 8 * layout.bytes_for_tokens(len(prompts[0]) + sampling.max_tokens - 1)
    one_prefix_plus_tails = layout.bytes_for_tokens(2000) + 8 * layout.bytes_for_tokens(
        50 + sampling.max_tokens
    )
    mib = 2**20
    return [
        (
            "paged: pool blocks used or cached, peak",
            f"{max(peak) / mib:.1f} MiB",
            f"one prefix + 8 tails = {one_prefix_plus_tails / mib:.1f} MiB (block-rounded: tails fill whole "
            "blocks)",
        ),
        (
            "copy: block tensors + 8 contiguous caches",
            f"{(copy_blocks + contiguous) / mib:.1f} MiB",
            f"blocks {copy_blocks / mib:.1f} MiB (measured) + 8 x {contiguous / 8 / mib:.1f} MiB",
        ),
        ("ratio copy / paged", f"{(copy_blocks + contiguous) / max(peak):.1f}x", ""),
    ]


def scenario_requests(name: str, num_requests: int, max_tokens: int) -> list:
    """The first ``num_requests`` requests of scenarios/NAME.toml, ``max_tokens`` each, EOS ignored
    (``--setup first-n``; also benchmarks/paged_peer_bench.py's requests)."""
    source = load_source(REPO / "scenarios" / f"{name}.toml", load_tokenizer(None), limit=num_requests)
    settings = run_section(
        source, RunFlags(num_requests=num_requests, max_tokens=max_tokens, ignore_eos=True)
    )
    return prepared_requests(source, settings)


def session_requests(name: str, num_sessions: int, num_turns: int) -> list:
    """The first ``num_turns`` turns of each of the first ``num_sessions`` sessions of
    scenarios/NAME.toml, round-robin by turn, each with its own ``max_tokens``, EOS ignored
    (``--setup sessions``, module docstring)."""
    source = load_source(REPO / "scenarios" / f"{name}.toml", load_tokenizer(None))
    every = prepared_requests(
        source, run_section(source, RunFlags(num_requests=len(source.requests), ignore_eos=True))
    )
    by_session: dict[str, list] = {}
    for request in every:
        by_session.setdefault(request.session_id, []).append(request)
    sessions = list(by_session.values())[:num_sessions]
    return [turns[t] for t in range(num_turns) for turns in sessions if t < len(turns)]


def serve_all(requests, backend, concurrency: int = 8) -> list:
    """The records of ``requests`` sent through the one send loop (closed loop, ``concurrency``), in
    request order (the loop returns them in the order they finished, which differs between engines:
    comparing two engines' outputs row by row needs the request order)."""
    pairs = run_requests(requests, backend, LoadConfig(concurrency=concurrency))
    return [record for _, record in sorted(pairs, key=lambda pair: pair[0].index)]


def summarize(records) -> tuple[float, float, float, float, int]:
    """requests/s, output tokens/s (over the run's wall time), TTFT p50 ms, TTFT + queue p50 ms,
    cached (shared) prompt tokens."""
    wall_s = max(r.ended_s for r in records)
    return (
        len(records) / wall_s,
        sum(r.output_tokens for r in records) / wall_s,
        statistics.median(r.ttft_ms for r in records),
        statistics.median(r.ttft_ms + r.queue_ms for r in records),
        sum(r.cached_prompt_tokens or 0 for r in records),
    )


class BatchStats:
    """How full a paged engine's steps were: wraps its scheduler's ``schedule`` and counts, per
    step, the scheduled sequences and the decoding ones (one new token after an output token)."""

    def __init__(self, engine: PagedEngine) -> None:
        self.steps: list[tuple[int, int]] = []  # (sequences, decoding sequences)
        schedule = engine.scheduler.schedule

        def counted():
            batch = schedule()
            decodes = sum(
                1 for seq, num_new in batch.items if num_new == 1 and seq.num_tokens > seq.num_prompt_tokens
            )
            self.steps.append((len(batch.items), decodes))
            return batch

        engine.scheduler.schedule = counted

    def summary(self) -> str:
        """``sequences per step / decodes per decoding step / decode batch per output token``."""
        steps = [s for s in self.steps if s[0]]
        decoding = [d for _, d in steps if d]
        # each decode step samples d tokens in a batch of d
        per_token = sum(d * d for d in decoding) / sum(decoding)
        return (
            f"{statistics.mean(n for n, _ in steps):.1f} / {statistics.mean(decoding):.1f} / {per_token:.1f}"
            f" ({len(steps)} steps)"
        )


def one_engine(loaded, kind: str, requests) -> tuple:
    """One engine's run of ``requests``: :func:`summarize`'s numbers, CPU seconds, batch fill."""
    cache = CacheConfig(CAPACITY_BLOCKS)
    engine = (
        HFEngine(loaded, CopyConfig(cache=cache))
        if kind == "copy"
        else PagedEngine(loaded, PagedConfig(cache))
    )
    stats = BatchStats(engine) if kind == "paged" else None
    cpu_s = time.process_time()
    records = serve_all(
        requests, InProcessBackend(engine, SamplingParams(max_tokens=1, ignore_eos=True), loaded.name)
    )
    assert all(r.status.value == "ok" for r in records), [r.error for r in records if r.error][:1]
    return (*summarize(records), time.process_time() - cpu_s, "1" if stats is None else stats.summary())


def throughput(loaded, args) -> list[tuple[str, ...]]:
    rows = []
    for name in ("chat", "agent"):
        requests = (
            session_requests(name, args.sessions, args.turns)
            if args.setup == "sessions"
            else scenario_requests(name, args.scenario_requests, args.max_tokens)
        )
        copy, paged = one_engine(loaded, "copy", requests), one_engine(loaded, "paged", requests)
        (
            (c_rps, c_tps, c_ttft, c_wait, c_hit, c_cpu, _),
            (p_rps, p_tps, p_ttft, p_wait, p_hit, p_cpu, fill),
        ) = copy, paged
        rows.append(
            (
                f"{name}: {len(requests)} requests, {len({r.session_id for r in requests})} sessions, "
                f"{sum(r.max_tokens for r in requests):,} output tokens",
                f"{c_rps:.3f} / {p_rps:.3f} ({p_rps / c_rps:.2f}x)",
                f"{c_tps:.1f} / {p_tps:.1f} ({p_tps / c_tps:.2f}x)",
                f"{c_ttft:.0f} / {p_ttft:.0f}",
                f"{c_wait:.0f} / {p_wait:.0f}",
                f"{c_hit:,} / {p_hit:,}",
                f"{c_cpu:.1f} / {p_cpu:.1f} ({c_cpu / p_cpu:.2f}x)",
                fill,
            )
        )
    return rows


def print_table(header, rows):
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


def main(argv=None) -> None:
    args = parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    loaded, default_threads = load_model(), torch.get_num_threads()
    for threads in args.threads.split(","):
        torch.set_num_threads(default_threads if threads == "default" else int(threads))
        start_s, load_before = time.perf_counter(), os.getloadavg()[0]
        if "ttft" not in skip:
            print_table(
                ("shared_2k, concurrency 1", "median", "ratio"), ttft_vs_ideal(loaded, args.num_requests)
            )
        if "memory" not in skip:
            print_table(("8 concurrent, 2,000-token shared prefix", "bytes", "note"), bytes_for_eight(loaded))
        if "throughput" not in skip:
            setup = (
                f"{args.sessions} sessions x {args.turns} turns round-robin, own max_tokens"
                if args.setup == "sessions"
                else f"first {args.scenario_requests} requests x {args.max_tokens} tokens"
            )
            print_table(
                (
                    f"concurrency 8, {setup}",
                    "requests/s copy / paged",
                    "output tok/s copy / paged",
                    "TTFT p50 ms copy / paged",
                    "TTFT + queue p50 ms copy / paged",
                    "cached prompt tokens copy / paged",
                    "process CPU s copy / paged",
                    "paged: seqs per step / decodes per decode step / decode batch per output token",
                ),
                throughput(loaded, args),
            )
        print(
            f"{torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs, load average "
            f"{load_before:.1f} -> "
            f"{os.getloadavg()[0]:.1f}, run {time.perf_counter() - start_s:.0f} s, {loaded.name}, "
            f"torch {torch.__version__}\n",
            flush=True,
        )


if __name__ == "__main__":
    main()
