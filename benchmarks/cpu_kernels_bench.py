"""The CPU fixes of kvbench/engine/cpu_kernels.py and kvbench/engine/native.py, each with and without,
in one run (not a test).

    python benchmarks/cpu_kernels_bench.py [--threads 1] [--repeats 7] [--prefill-tokens 2000]

1. **Linears over n rows**, the default model's shapes (fp32): the LM head (100,277 x 512), a
   gate/up projection (2,816 x 512) and a down projection (512 x 2,816), the layer weights 64 of
   each cycled so none sits in a cache: MKL (``F.linear``), oneDNN (``SmallBatchLinear``'s op) and
   kvbench's few-row kernel, thread CPU ms per weight, medians of ``--repeats``; the kernel's
   outputs are checked against MKL's.
2. **Paged decode attention**, one layer of the default model (8 query heads, 2 KV heads, head_dim
   64, 32-token blocks scattered over a 4,096-block pool): every sequence's blocks gathered and one
   SDPA call per sequence (``sdpa-gathered`` on the CPU) against ``kvbench-cpu``, which reads the
   blocks in place; the outputs are compared.
3. **A prefill with the freed memory returned or kept**: two child processes (``keep_freed_memory``
   skipped in one), each the default model's forward over ``--prefill-tokens`` random ids three
   times after one warm-up; per forward the user and system CPU ms and minor page faults
   (``getrusage``).

CPU time, not wall time: on a shared machine the wall clock mostly measures the neighbours.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CHILD = """
import json, resource, sys, torch
import kvbench.engine.cpu_kernels as kernels
if sys.argv[1] == "returned":
    kernels._memory_kept = True  # pretend it was done: glibc keeps its defaults
torch.set_num_threads(int(sys.argv[2]))
from kvbench.engine.model import load_model
model = load_model().model
ids = torch.randint(0, 100_000, (1, int(sys.argv[3])))
rows = []
with torch.inference_mode():
    for index in range(4):
        before = resource.getrusage(resource.RUSAGE_SELF)
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
        after = resource.getrusage(resource.RUSAGE_SELF)
        if index:  # the first forward grows the heap either way
            rows.append([(after.ru_utime - before.ru_utime) * 1e3, (after.ru_stime - before.ru_stime) * 1e3,
                         after.ru_minflt - before.ru_minflt])
print(json.dumps(rows))
"""


def cpu_ms(call, repeats: int) -> float:
    """Median thread CPU ms of ``call()`` over ``repeats`` runs, after one unmeasured run."""
    call()
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        call()
        times.append((time.thread_time() - start) * 1e3)
    return statistics.median(times)


def linears(threads: int, repeats: int) -> None:
    import torch

    from kvbench.engine.native import native_kernels, native_kernels_reason

    torch.set_num_threads(threads)
    kernel = native_kernels()
    if kernel is None:
        print(f"no native kernels: {native_kernels_reason()}")
    onednn = torch.ops.mkldnn._linear_pointwise
    kinds = {
        "MKL": lambda x, w: torch.nn.functional.linear(x, w),
        "oneDNN": lambda x, w: onednn(x, w, None, "none", [None], ""),
    }
    if kernel is not None:
        kinds["kvbench"] = kernel.linear
    shapes = {
        "LM head 100,277 x 512": (100_277, 512, 1),
        "gate/up 2,816 x 512": (2_816, 512, 64),
        "down 512 x 2,816": (512, 2_816, 64),
    }
    print("linears, fp32: thread CPU ms per weight (median)")
    print(f"{'weight':<22} {'rows':>4} " + " ".join(f"{name:>8}" for name in kinds))
    with torch.inference_mode():
        for label, (out_features, in_features, copies) in shapes.items():
            weights = [torch.randn(out_features, in_features) for _ in range(copies)]
            for rows in (1, 2, 4, 8, 16, 32, 48, 64):
                x = torch.randn(rows, in_features)
                if kernel is not None:
                    torch.testing.assert_close(
                        kernel.linear(x, weights[0]), x @ weights[0].T, rtol=1e-4, atol=1e-4
                    )
                times = [
                    cpu_ms(lambda: [call(x, w) for w in weights], repeats) / copies for call in kinds.values()
                ]
                print(f"{label:<22} {rows:>4} " + " ".join(f"{t:>8.2f}" for t in times))


def paged_decode(threads: int, repeats: int) -> None:
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from kvbench.engine.native import native_kernels

    torch.set_num_threads(threads)
    kernel = native_kernels()
    if kernel is None:
        return
    heads, kv_heads, head_dim, block_size, pages = 8, 2, 64, 32, 4096
    keys, values = (
        torch.randn(kv_heads, pages, block_size, head_dim),
        torch.randn(kv_heads, pages, block_size, head_dim),
    )
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = heads // kv_heads, True
    print("\npaged decode attention, one layer: thread CPU ms per call (median)")
    print(f"{'sequences x context':>20} {'gathered':>9} {'kvbench':>8} {'ratio':>6}")
    for num_seqs, context in ((1, 2000), (8, 500), (8, 2000)):
        generator = torch.Generator().manual_seed(num_seqs * context)
        # (n, blocks)
        tables = torch.stack(
            [
                torch.randperm(pages - 1, generator=generator)[: -(-context // block_size)] + 1
                for _ in range(num_seqs)
            ]
        ).int()
        lengths = torch.full((num_seqs,), context, dtype=torch.int32)
        query = torch.randn(num_seqs, heads, head_dim, generator=generator)

        def gathered():
            outputs = []
            for i in range(num_seqs):
                k, v = (
                    t.index_select(1, tables[i].long()).flatten(1, 2)[:, :context][None]
                    for t in (keys, values)
                )
                out, _ = sdpa_attention_forward(
                    module, query[i][None, :, None], k, v, None, scaling=head_dim**-0.5
                )
                outputs.append(out[0, 0])
            return torch.stack(outputs)

        def ours():
            return kernel.paged_decode(query, keys, values, tables, lengths, head_dim**-0.5)

        with torch.inference_mode():
            torch.testing.assert_close(ours(), gathered(), rtol=1e-4, atol=1e-5)
            before, after = cpu_ms(gathered, repeats), cpu_ms(ours, repeats)
        print(f"{f'{num_seqs} x {context}':>20} {before:>9.2f} {after:>8.2f} {before / after:>5.2f}x")


def prefill_memory(threads: int, tokens: int) -> None:
    print(
        f"\nprefill of {tokens} tokens, default model, per forward (forwards 2-4): user ms, system ms, faults"
    )
    for mode in ("returned", "kept", "returned", "kept"):
        output = subprocess.run(
            [sys.executable, "-c", CHILD, mode, str(threads), str(tokens)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows = json.loads(output.strip().splitlines()[-1])
        print(f"{mode:>9}: " + "  ".join(f"{u:.0f}/{s:.0f}/{f}" for u, s, f in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--prefill-tokens", type=int, default=2000)
    args = parser.parse_args()
    linears(args.threads, args.repeats)
    paged_decode(args.threads, args.repeats)
    prefill_memory(args.threads, args.prefill_tokens)


if __name__ == "__main__":
    main()
