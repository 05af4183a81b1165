"""What one decode step of the paged engine costs at batch 1..16 (not a test): the ceiling of batching.

For each context length (``--contexts``, tokens per sequence) and batch size (``--batches``), ``b``
requests with distinct random prompts run together on one :class:`PagedEngine` (default model,
greedy, EOS ignored). Every prompt was run once before (``max_tokens=1``), so the measured
requests hit all but their last prompt token and all ``b`` sequences decode in lockstep from their
first step on: every inter-token latency after the first token is one decode step of exactly ``b``
sequences (checked: the engine's steps are counted). Reported, medians over the steps:

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

import kvbench.engine.paged.attention as paged_attention
from kvbench.cache.base import CacheConfig
from kvbench.engine.model import load_model
from kvbench.engine.paged.engine import PagedConfig, PagedEngine
from kvbench.engine.sampling import SamplingParams
from transformers import AttentionInterface


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1", help="comma list of torch thread counts; 'default' = torch's choice")
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


def one_setting(loaded, contexts, batches, num_steps) -> list[tuple[str, ...]]:
    lm_head, attention = Timer(), Timer()
    hooks = (loaded.model.lm_head.register_forward_pre_hook(lm_head.start),
             loaded.model.lm_head.register_forward_hook(lm_head.stop))
    num_layers = loaded.model.config.num_hidden_layers
    rows = []
    for context in contexts:
        rng = np.random.default_rng(context)
        prompts = [rng.integers(0, loaded.vocab_size, context).tolist() for _ in range(max(batches))]
        blocks = len(prompts) * ((context + num_steps) // 16 + 2)
        engine = PagedEngine(loaded, PagedConfig(CacheConfig(blocks + 64)))  # registers kvbench's function
        AttentionInterface.register(paged_attention.ATTENTION_NAME, timed_attention(attention))
        for future in [engine.submit(p, SamplingParams(max_tokens=1, ignore_eos=True)) for p in prompts]:
            future.result()  # every prompt cached: the measured requests start decoding at once
        engine.wait_idle()
        base_ms = None
        for batch in batches:
            sampling = SamplingParams(max_tokens=num_steps + 1, ignore_eos=True)
            lm_head.times_s.clear(), attention.times_s.clear()
            steps_before = engine.meter.num_steps
            records = [f.result() for f in [engine.submit(p, sampling) for p in prompts[:batch]]]
            engine.wait_idle()
            assert all(r.cached_prompt_tokens == (context - 1) // 16 * 16 for r in records)
            assert engine.meter.num_steps - steps_before == num_steps + 1, "the batch did not decode in lockstep"
            step_ms = statistics.median(itl for r in records for itl in r.itl_ms)
            head_ms = statistics.median(lm_head.times_s[1:]) * 1e3  # after the first (1-token prefill) step
            attn_ms = statistics.median(sum(attention.times_s[i:i + num_layers])
                                        for i in range(num_layers, len(attention.times_s), num_layers)) * 1e3
            per_token_ms = step_ms / batch
            base_ms = per_token_ms if base_ms is None else base_ms
            rows.append((f"{context:,}", str(batch), f"{step_ms:.1f}", f"{1e3 / per_token_ms:.1f}",
                         f"{base_ms / per_token_ms:.2f}x", f"{head_ms:.1f} ({head_ms / step_ms:.0%})",
                         f"{attn_ms:.1f} ({attn_ms / step_ms:.0%})"))
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
        header = ("context tokens", "batch", "step ms", "output tok/s", "per-token speed-up vs batch 1",
                  "lm_head ms (share)", "attention ms (share)")
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        print(f"\n{torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs, load average {load_before:.1f} -> "
              f"{os.getloadavg()[0]:.1f}, {args.steps} steps per batch (medians), run "
              f"{time.perf_counter() - start_s:.0f} s, {loaded.name}, torch {torch.__version__}\n")


if __name__ == "__main__":
    main()
