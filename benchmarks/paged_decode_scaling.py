"""What one decode step of the paged engine costs at batch 1..16 (not a test): the ceiling of batching.

For each context length (``--contexts``, tokens per sequence) and batch size (``--batches``), ``b``
requests with distinct random prompts run together on one :class:`PagedEngine` (default model,
greedy, EOS ignored). Every prompt was run once before (``max_tokens=1``), so the measured
requests hit all but their last prompt token and all ``b`` sequences decode in lockstep from their
first step on. Each engine step is timed (its worker's ``step``, wrapped) and only the steps where
exactly ``b`` sequences all decode count (a request submitted a moment after the worker started
joins one step late; its steps are left out). Reported, medians over those steps:

- **step ms** and **tokens/s** (``b / step``), and the per-token speed-up over batch 1 of the same
  context: what continuous batching can buy in pure decode on this machine;
- **lm_head ms** and its **share** of the step: the ``(b, hidden) x (hidden, vocab)`` output GEMM
  (timed by forward hooks on ``lm_head``, same thread), the part that grows fastest with ``b`` on
  this CPU (MKL fp32 at M = 8 runs at ~12-14 GFLOP/s, one thread);
- **attention ms**: kvbench's paged attention function over all layers (K/V writes, gathers by
  block table, SDPA), timed by wrapping it.

Run: ``python benchmarks/paged_decode_scaling.py [--threads 1,default] [--contexts 500,3000]
[--batches 1,2,4,8,16] [--steps 12]``. Prints one Markdown table per thread setting.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch
from transformers import AttentionInterface

import kvbench.engine.paged.attention as paged_attention
from kvbench.cache.base import CacheConfig
from kvbench.engine.model import load_model
from kvbench.engine.paged.engine import PagedConfig, PagedEngine
from kvbench.engine.sampling import SamplingParams


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads", default="1", help="comma list of torch thread counts; 'default' = torch's choice"
    )
    parser.add_argument("--contexts", default="500,3000", help="comma list of context tokens per sequence")
    parser.add_argument("--batches", default="1,2,4,8,16", help="comma list of batch sizes")
    parser.add_argument("--steps", type=int, default=12, help="decode steps measured per batch")
    return parser.parse_args(argv)


class Timer:
    """Wall times of calls, in the thread that makes them (the engine's worker)."""

    def __init__(self) -> None:
        self.times_s: list[float] = []
        self._start_s = 0.0

    def start(self, *_args) -> None:
        self._start_s = time.perf_counter()

    def stop(self, *_args) -> None:
        self.times_s.append(time.perf_counter() - self._start_s)


def timed_attention(timer: Timer):
    """kvbench's attention function wrapped to add each layer's time to ``timer`` (registered in
    place of the original under the same name)."""
    original = paged_attention.paged_attention_forward

    def forward(*args, **kwargs):
        start_s = time.perf_counter()
        result = original(*args, **kwargs)
        timer.times_s.append(time.perf_counter() - start_s)
        return result

    return forward


class StepLog:
    """Per step of ``engine`` (its worker calls ``self.step``): sequences, decoding sequences, wall
    time, and the lm_head and attention time inside it (``timers``)."""

    def __init__(self, engine: PagedEngine, lm_head: Timer, attention: Timer) -> None:
        self.steps: list[tuple[int, int, float, float, float]] = []
        step, schedule, decodes = engine.step, engine.scheduler.schedule, []

        def counted_schedule():
            batch = schedule()
            decodes.append(
                sum(1 for seq, n in batch.items if n == 1 and seq.num_tokens > seq.num_prompt_tokens)
            )
            return batch

        def timed_step():
            heads, layers, start_s = len(lm_head.times_s), len(attention.times_s), time.perf_counter()
            num_seqs = step()
            self.steps.append(
                (
                    num_seqs,
                    decodes[-1],
                    time.perf_counter() - start_s,
                    sum(lm_head.times_s[heads:]),
                    sum(attention.times_s[layers:]),
                )
            )
            return num_seqs

        engine.scheduler.schedule, engine.step = counted_schedule, timed_step

    def medians_ms(self, batch: int, first: int) -> tuple[int, float, float, float]:
        """Steps from index ``first`` on where exactly ``batch`` sequences all decode: their number
        and the medians of step, lm_head and attention ms."""
        pure = [s for s in self.steps[first:] if s[0] == s[1] == batch]
        return (len(pure), *(statistics.median(s[i] for s in pure) * 1e3 for i in (2, 3, 4)))


def one_context(loaded, context: int, batches, num_steps: int, lm_head: Timer, attention: Timer):
    rng = np.random.default_rng(context)
    prompts = [rng.integers(0, loaded.vocab_size, context).tolist() for _ in range(max(batches))]
    blocks = len(prompts) * ((context + num_steps) // 16 + 2)
    engine = PagedEngine(loaded, PagedConfig(CacheConfig(blocks + 64)))  # registers kvbench's function
    AttentionInterface.register(paged_attention.ATTENTION_NAME, timed_attention(attention))
    for future in [engine.submit(p, SamplingParams(max_tokens=1, ignore_eos=True)) for p in prompts]:
        future.result()  # every prompt cached: the measured requests start decoding at once
    engine.wait_idle()
    log, rows, base_ms = StepLog(engine, lm_head, attention), [], None
    for batch in batches:
        first = len(log.steps)
        sampling = SamplingParams(max_tokens=num_steps + 1, ignore_eos=True)
        records = [f.result() for f in [engine.submit(p, sampling) for p in prompts[:batch]]]
        engine.wait_idle()
        assert all(r.cached_prompt_tokens == (context - 1) // 16 * 16 for r in records)
        num_pure, step_ms, head_ms, attn_ms = log.medians_ms(batch, first)
        per_token_ms = step_ms / batch
        base_ms = per_token_ms if base_ms is None else base_ms
        rows.append(
            (
                f"{context:,}",
                str(batch),
                f"{step_ms:.1f}",
                f"{1e3 / per_token_ms:.1f}",
                f"{base_ms / per_token_ms:.2f}x",
                f"{head_ms:.1f} ({head_ms / step_ms:.0%})",
                f"{attn_ms:.1f} ({attn_ms / step_ms:.0%})",
                str(num_pure),
            )
        )
    return rows


def one_setting(loaded, contexts, batches, num_steps) -> list[tuple[str, ...]]:
    lm_head, attention = Timer(), Timer()
    hooks = (
        loaded.model.lm_head.register_forward_pre_hook(lm_head.start),
        loaded.model.lm_head.register_forward_hook(lm_head.stop),
    )
    rows = [
        row
        for context in contexts
        for row in one_context(loaded, context, batches, num_steps, lm_head, attention)
    ]
    AttentionInterface.register(paged_attention.ATTENTION_NAME, paged_attention.paged_attention_forward)
    for hook in hooks:
        hook.remove()
    return rows


def main(argv=None) -> None:
    args = parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    loaded, default_threads = load_model(), torch.get_num_threads()
    for threads in args.threads.split(","):
        torch.set_num_threads(default_threads if threads == "default" else int(threads))
        start_s, load_before = time.perf_counter(), os.getloadavg()[0]
        rows = one_setting(loaded, contexts, batches, args.steps)
        header = (
            "context tokens",
            "batch",
            "step ms",
            "output tok/s",
            "per-token speed-up vs batch 1",
            "lm_head ms (share)",
            "attention ms (share)",
            "steps measured",
        )
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        print(
            f"\n{torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs, load average "
            f"{load_before:.1f} -> "
            f"{os.getloadavg()[0]:.1f}, {args.steps} steps per batch (medians), run "
            f"{time.perf_counter() - start_s:.0f} s, {loaded.name}, torch {torch.__version__}\n"
        )


if __name__ == "__main__":
    main()
