"""Read a trace's arrivals and lengths for ``kvbench memory waste``: kvbench, Mooncake, or bare lengths.

The file is opened once (:func:`kvbench.workloads.formats.jsonl.open_jsonl`) and its first line
decides the reader:

* a kvbench trace header (``kvbench_trace``): the project's trace reader
  (:class:`kvbench.workloads.formats.kvbench_trace_reader.TraceReader`, which validates every line,
  the header's request count and content hash). The real output length is ``output_tokens``
  where the trace has it, else ``max_tokens`` (in chat and agent traces that is exactly the reply
  the next turn carries). No text is rendered: the prompt length is ``expected_prompt_tokens``.
* anything else: the lengths-only reader (:mod:`kvbench.workloads.formats.lengths`: bare length
  lines, or Mooncake lines read for their lengths).
"""

from __future__ import annotations

from pathlib import Path

from kvbench.errors import InputError
from kvbench.memory.waste import WasteRequest
from kvbench.workloads.formats.jsonl import KVBENCH_TRACE, open_jsonl
from kvbench.workloads.formats.kvbench_trace_reader import TraceReader
from kvbench.workloads.formats.lengths import read_lengths


def read_waste_trace(
    path: str | Path, default_max_tokens: int | None = None, limit: int | None = None
) -> list[WasteRequest]:
    """Requests of a kvbench, Mooncake or bare-length trace, in file order (at most ``limit``).

    Raises:
        InputError: missing or unreadable file, a line that is not a JSON object, a missing or bad
            field (the message names file, line number and field), or no requests at all.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: cannot read trace (No such file or directory)")
    with open_jsonl(path) as file:
        if file.format == KVBENCH_TRACE:
            trace = TraceReader(path).read(file, limit)
            requests = [
                WasteRequest(
                    r.id,
                    r.arrival_ms,
                    r.expected_prompt_tokens,
                    r.output_tokens or r.max_tokens,
                    r.max_tokens,
                )
                for r in trace.requests
            ]
        else:
            requests = [
                WasteRequest(r.request_id, r.arrival_ms, r.prompt_tokens, r.output_tokens, r.max_tokens)
                for r in read_lengths(file, default_max_tokens, limit)
            ]
    if not requests:
        raise InputError(f"{path}: no requests in the trace")
    return requests
