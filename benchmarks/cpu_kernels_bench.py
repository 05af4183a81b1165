"""The two CPU fixes of kvbench/engine/cpu_kernels.py, each with and without, in one run (not a test).

    python benchmarks/cpu_kernels_bench.py [--threads 1] [--repeats 7] [--prefill-tokens 2000]

1. **The LM head over n rows** on the default model's head (100,277 x 512 fp32): MKL (``F.linear``,
   what every forward used) against :class:`SmallBatchLinear` (oneDNN for 3-48 rows), thread CPU ms,
   medians of ``--repeats``; n = 1 and 2 must be the same kernel (identical outputs are checked).
2. **A prefill with the freed memory returned or kept**: two child processes (``keep_freed_memory``
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


def lm_head_rows(threads: int, repeats: int) -> None:
    import torch

    from kvbench.engine.cpu_kernels import SMALL_BATCH_ROWS, SmallBatchLinear
    from kvbench.engine.model import CL100K_VOCAB_SIZE

    torch.set_num_threads(threads)
    plain = torch.nn.Linear(512, CL100K_VOCAB_SIZE, bias=False).eval()
    small = torch.nn.Linear(512, CL100K_VOCAB_SIZE, bias=False).eval()
    small.weight = plain.weight
    small.__class__ = SmallBatchLinear
    print("LM head, 100,277 x 512 fp32: thread CPU ms per call (median)")
    print(f"{'rows':>5} {'MKL':>8} {'kvbench':>8} {'ratio':>6}")
    with torch.inference_mode():
        for rows in (1, 2, 4, 8, 16, 32, 64):
            x = torch.randn(rows, 512)
            if rows not in SMALL_BATCH_ROWS and not torch.equal(plain(x), small(x)):
                raise SystemExit(f"{rows} rows: not the plain linear's bits")
            mkl, ours = cpu_ms(lambda: plain(x), repeats), cpu_ms(lambda: small(x), repeats)
            print(f"{rows:>5} {mkl:>8.1f} {ours:>8.1f} {mkl / ours:>5.2f}x")


def prefill_memory(threads: int, tokens: int) -> None:
    print(f"\nprefill of {tokens} tokens, default model, per forward (forwards 2-4): user ms, system ms, faults")
    for mode in ("returned", "kept", "returned", "kept"):
        output = subprocess.run([sys.executable, "-c", CHILD, mode, str(threads), str(tokens)],
                                capture_output=True, text=True, check=True).stdout
        rows = json.loads(output.strip().splitlines()[-1])
        print(f"{mode:>9}: " + "  ".join(f"{u:.0f}/{s:.0f}/{f}" for u, s, f in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--prefill-tokens", type=int, default=2000)
    args = parser.parse_args()
    lm_head_rows(args.threads, args.repeats)
    prefill_memory(args.threads, args.prefill_tokens)


if __name__ == "__main__":
    main()
