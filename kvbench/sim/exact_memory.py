"""Whether the exact curve of a Mooncake / hash-id trace fits in memory, told before reading it.

:func:`exact_memory_refusal` estimates the trace's block ids from its size and its first lines
(:data:`SAMPLE_BYTES`), and the exact curve's worst case from them: the streamed pass
(:mod:`kvbench.sim.streamed_curve`) holds ~12 bytes per distinct block between chunks and ~12 more
while it reorders the stack, so :data:`BYTES_PER_ID` bytes an id when every id is distinct (no id
shared: the most distinct blocks a trace of that size can have), plus :data:`BASE_BYTES` for one
chunk, the imports and the curve files (measured: 794 MiB of peak RSS on a 1M-request,
24.5M-id trace, docs/measured-results.md). When that exceeds the memory available, ``kvbench sim``
says so and offers the sampled curve, which holds a fixed number of keys.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

SAMPLE_BYTES = 1 << 20  # the first lines read to count ids per byte
BYTES_PER_ID = 24  # worst case: every id distinct
BASE_BYTES = 1 << 30


def available_memory_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` (Linux), else free physical pages; ``None`` if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def estimated_ids(path: str | Path, limit: int | None = None) -> int:
    """Block ids in the first ``limit`` lines (all: ``None``) of a hash-id trace, estimated from
    its size and its first :data:`SAMPLE_BYTES` (0 for a file whose first lines are not JSON)."""
    size = Path(path).stat().st_size
    with open(path, "rb") as file:
        sample = file.read(SAMPLE_BYTES)
    lines = sample.splitlines()[:-1] if len(sample) == SAMPLE_BYTES else sample.splitlines()
    num_ids = num_bytes = num_lines = 0
    for line in lines:
        try:
            num_ids += len(json.loads(line).get("hash_ids") or ())
        except (ValueError, AttributeError, TypeError):
            return 0
        num_bytes, num_lines = num_bytes + len(line) + 1, num_lines + 1
    if not num_bytes:
        return 0
    estimate = size * num_ids / num_bytes
    if limit is not None:
        estimate = min(estimate, limit * num_ids / max(num_lines, 1))
    return round(estimate)


def exact_memory_refusal(path: str | Path, limit: int | None, available: int | None) -> str | None:
    """One line saying why the exact curve may not fit in ``available`` bytes (``None``: it fits,
    or the memory is unknown), naming the sampled curve to run instead."""
    num_ids = estimated_ids(path, limit)
    needed = num_ids * BYTES_PER_ID + BASE_BYTES
    if available is None or needed <= available:
        return None
    return (
        f"{Path(path).name}: ~{num_ids:,} block ids (estimated from its size): the exact curve may "
        f"need up to {needed / 2**30:,.1f} GiB, and {available / 2**30:,.1f} GiB is available. Run "
        "the sampled curve instead (bounded memory; it prints its error, 1 sd): "
        f"kvbench sim {path} --sample-keys 65536"
    )
