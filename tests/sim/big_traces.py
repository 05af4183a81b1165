"""The big-trace generator of ``benchmarks/big_trace.py`` for the tests (tests/sim), small sizes.

Imported by its bare name, as :mod:`curve_traces` is; puts ``benchmarks/`` on ``sys.path`` once.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from big_trace import BigTrace, BigTraceConfig, generate, write_jsonl  # noqa: E402

__all__ = ["BigTrace", "BigTraceConfig", "generate", "write_jsonl", "big_trace_file"]


def big_trace_file(tmp_path: Path, num_requests: int, seed: int = 0, **shape) -> Path:
    """A generated Mooncake trace of ``num_requests`` lines under ``tmp_path``."""
    path = tmp_path / f"big-{num_requests}-{seed}.jsonl"
    write_jsonl(generate(BigTraceConfig(num_requests=num_requests, seed=seed, **shape)), path)
    return path
