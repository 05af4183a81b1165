"""The run-results schema: one Parquet row per request, units in every column name.

Every backend (in-process engine, OpenAI-compatible HTTP) writes these columns; readers (report,
compare, scoreboard) rely on them. Run-level facts (config, trace header and content hash, versions,
machine, seed) go into the file's key-value metadata (see :mod:`kvbench.results.parquet`), under
``kvbench.run``.

Times are milliseconds, measured with ``time.perf_counter``:

* ``arrival_ms``: the trace's arrival offset; ``sent_ms``: when the send loop actually sent the
  request (open loop: its due time plus any wait), ms from the start of the run; ``due_ms``: when
  it was due (open loop, ``--schedule trace``) or taken by a client (closed loop), and ``end_ms``:
  when its response ended, both ms from the start of the run. ``sent_ms - due_ms`` is the replay
  lag; ``due_ms``, ``sent_ms``, ``end_ms`` rebuild the run's timeline and throughput.
* ``queue_ms``: from the request being due (open loop) or taken by a client (closed loop) to the
  moment it started being served: waiting time, never counted inside TTFT.
* ``ttft_ms``: from the start of service to the first output token.
* ``tpot_ms``: (e2e - ttft) / (output_tokens - 1), vLLM's definition; null with < 2 tokens.
* ``itl_ms``: the gaps between consecutive output tokens (``output_tokens - 1`` values).
* ``e2e_ms``: from the start of service to the last token.
"""

from __future__ import annotations

import pyarrow as pa

RUN_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string()),
        pa.field("request_index", pa.int64()),  # position in the trace
        pa.field("request_id", pa.string()),
        pa.field("session_id", pa.string()),
        pa.field("turn", pa.int64()),  # turn (chat) or step (agent); 0 for one-shot prompts
        pa.field("phase", pa.string()),  # "warmup" or "measure"
        pa.field("backend", pa.string()),  # "inprocess" or "openai"
        pa.field("model", pa.string()),
        pa.field("cache_enabled", pa.bool_()),
        pa.field("cache_kind", pa.string()),  # "hash" or "radix"
        pa.field("block_size", pa.int64()),
        pa.field("capacity_blocks", pa.int64()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("cached_prompt_tokens", pa.int64()),
        pa.field("expected_cached_tokens", pa.int64()),  # what an ideal cache allows (null if unknown)
        pa.field("local_prompt_tokens", pa.int64()),  # the prompt by kvbench's tokenizer (expected's units)
        pa.field("output_tokens", pa.int64()),
        pa.field("output_tokens_source", pa.string()),  # "engine", "usage" or "tokenizer"
        pa.field("max_tokens", pa.int64()),
        pa.field("arrival_ms", pa.float64()),
        pa.field("queue_ms", pa.float64()),
        pa.field("sent_ms", pa.float64()),  # when the send loop sent it, ms from the start of the run
        pa.field("due_ms", pa.float64()),  # when it was due (open loop / trace replay) or taken (closed)
        pa.field("end_ms", pa.float64()),  # when its response ended, ms from the start of the run
        pa.field("ttft_ms", pa.float64()),
        pa.field("tpot_ms", pa.float64()),
        pa.field("e2e_ms", pa.float64()),
        pa.field("prefill_ms", pa.float64()),
        pa.field("lookup_ms", pa.float64()),  # engine: hashing + cache lookup (null elsewhere)
        pa.field("kv_load_ms", pa.float64()),  # engine: gathering hit blocks into the KV
        pa.field("insert_ms", pa.float64()),  # engine: copying + inserting new blocks, after E2E
        pa.field("itl_ms", pa.list_(pa.float64())),
        pa.field("status", pa.string()),  # "ok" or "error"
        pa.field("http_status", pa.int64()),
        pa.field("error", pa.string()),
        pa.field("output_matches_reference", pa.bool_()),
        # Anthropic usage: tokens written (null elsewhere)
        pa.field("cache_creation_input_tokens", pa.int64()),
        # paged --host-tier: cached tokens loaded from the host tier
        pa.field("host_cached_tokens", pa.int64()),
        pa.field("replica", pa.int64()),  # which --base-url served it (0-based; null with one endpoint)
        pa.field("num_retries", pa.int64()),  # HTTP attempts beyond the first (nothing received, retried)
        pa.field("replica_id", pa.string()),  # the X-Kvbench-Replica response header (null: none sent)
    ]
)

RUN_COLUMNS = tuple(RUN_SCHEMA.names)


def empty_row() -> dict:
    """A row with every column present and null, to fill in."""
    return dict.fromkeys(RUN_COLUMNS)
