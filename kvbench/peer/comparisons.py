"""The traces the peer harness replays against vLLM, and kvbench's prediction for each request.

Three comparisons by default, each a kvbench text trace sized for a 2-core CPU, and a fourth on request:

* ``shared_2k``: the shared_2k scenario cut to a few requests: a 2,000-token system prompt shared
  by all, a unique 50-token question each (the cold request prefills ~2,060 tokens, the rest ~60).
* ``chat``: multi-turn conversations in replay mode: turn t+1 resends turn t's prompt plus the
  *trace's* reply and a new question, so it hits turn t's prompt blocks but never the blocks that
  hold vLLM's own output (which differs from the trace's reply).
* ``zipf``: 8 system prompts of 256 tokens with Zipf popularity and short unique questions, run on a
  server whose pool is 40 blocks (the prefixes alone need 64), so cached prefixes are evicted all
  the time, and sized so that each vLLM accounting rule changes some predictions (:data:`ZIPF_MAX_TOKENS`).
* ``kv_events`` (not run unless chosen): 4 system prompts of 256 tokens, Zipf popularity, on a server of
  its own that publishes KV cache events and has the small pool; after every request vLLM's block map
  (from its events) is compared with kvbench's (:mod:`kvbench.peer.vllm_events`).

Every request's ``cached_tokens`` is predicted by :mod:`kvbench.sim.vllm_pool` for the server's real pool
size and block size; requests are sent with ``ignore_eos`` so their output lengths are exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvbench.request import Request, RequestRecord
from kvbench.sim.bounds import possible_cached_tokens
from kvbench.sim.predict import expected_cached_tokens
from kvbench.sim.replay import prompt_blocks_of
from kvbench.sim.vllm_pool import VllmPoolConfig
from kvbench.workloads.conversations import ChatConfig
from kvbench.workloads.dists import IntDist
from kvbench.workloads.formats.kvbench_trace import Trace
from kvbench.workloads.formats.kvbench_trace_reader import trace_requests
from kvbench.workloads.generators import MultiPrefixTextConfig, SharedPrefixConfig
from kvbench.workloads.kinds import generate_trace
from kvbench.workloads.tokenizer import Tokenizer

# zipf prompts render to 301 tokens; 20 output tokens make the KV exactly 301 + 20 - 1 = 320 tokens =
# 10 full blocks of 32. On a 40-block pool, a model that gets the null block, the output blocks or the
# "- 1" wrong, or a prompt-only LRU cache, mispredicts 7-15 of the 100 requests (checked offline).
ZIPF_MAX_TOKENS = 20
SMALL_POOL = "small"
LARGE_POOL = "large"
EVENTS_POOL = "events"  # the small pool on a server that publishes KV cache events
POOLS = (LARGE_POOL, SMALL_POOL, EVENTS_POOL)  # in the order a run starts their servers
KV_EVENTS = "kv_events"
KV_EVENTS_REQUESTS = 30  # 4 prefixes of 8 blocks and 10 blocks a request: the 39 usable blocks evict


@dataclass(frozen=True)
class Comparison:
    """One trace to replay on one server.

    Attributes:
        name: ``shared_2k``, ``chat``, ``zipf`` or ``kv_events``.
        kind: the trace generator (``kvbench.workloads.kinds``).
        config: the generator's config.
        pool: which server it runs on: ``large`` (the default pool), ``small`` (a pool under pressure)
            or ``events`` (the small pool on a server that publishes KV cache events).
    """

    name: str
    kind: str
    config: Any
    pool: str = LARGE_POOL

    def __post_init__(self) -> None:
        if self.pool not in POOLS:
            raise ValueError(f"pool must be one of {', '.join(POOLS)}, got {self.pool!r}")


def default_comparisons(seed: int = 0) -> tuple[Comparison, ...]:
    """The three comparisons, sized so one run takes minutes on 2 CPU cores."""
    return (
        Comparison(
            "shared_2k",
            "shared-prefix",
            SharedPrefixConfig(
                num_requests=8, system_tokens=2000, question_tokens=50, max_tokens=32, seed=seed
            ),
        ),
        Comparison(
            "chat",
            "chat",
            ChatConfig(
                num_conversations=6,
                turns=IntDist.parse("uniform:3,5"),
                system_tokens=300,
                user_tokens=IntDist.parse("lognormal:60,0.5"),
                reply_tokens=IntDist.parse("lognormal:40,0.5"),
                conversation_rate_per_s=0.5,
                think_time_s=10.0,
                seed=seed,
            ),
        ),
        Comparison(
            "zipf",
            "multi-prefix-text",
            MultiPrefixTextConfig(
                num_prefixes=8,
                prefix_tokens=256,
                unique_tokens=32,
                num_requests=100,
                zipf_exponent=0.9,
                max_tokens=ZIPF_MAX_TOKENS,
                seed=seed,
            ),
            pool=SMALL_POOL,
        ),
    )


def kv_events_comparison(num_requests: int = KV_EVENTS_REQUESTS, seed: int = 0) -> Comparison:
    """The KV events check's trace: 4 system prompts of 256 tokens with Zipf popularity and a unique
    32-token question each (301-token prompts), 20 output tokens: 10 full blocks of 32 per request."""
    config = MultiPrefixTextConfig(
        num_prefixes=4,
        prefix_tokens=256,
        unique_tokens=32,
        num_requests=num_requests,
        zipf_exponent=0.9,
        max_tokens=ZIPF_MAX_TOKENS,
        seed=seed,
    )
    return Comparison(KV_EVENTS, "multi-prefix-text", config, pool=EVENTS_POOL)


def known_comparisons(seed: int = 0, kv_events_requests: int = KV_EVENTS_REQUESTS) -> tuple[Comparison, ...]:
    """Every comparison a run can choose: :func:`default_comparisons` and the KV events check."""
    return (*default_comparisons(seed), kv_events_comparison(kv_events_requests, seed))


@dataclass(frozen=True, eq=False)
class PreparedComparison:
    """A comparison's trace, its token ids under kvbench's tokenizer, and its salt.

    Attributes:
        comparison: what was generated.
        trace: the text trace (sent as is).
        requests: the trace as requests: ids as kvbench renders them, text form for HTTP, salt set
            to what the server sees (the comparison's namespace joined with the trace's own); same order.
        salt: the run's namespace for this comparison (vLLM ``cache_salt``).
    """

    comparison: Comparison
    trace: Trace
    requests: list[Request]
    salt: str


def prepare(comparison: Comparison, tokenizer: Tokenizer, salt: str) -> PreparedComparison:
    """Generate the trace and render every request (salt joined as the driver joins it)."""
    trace = generate_trace(comparison.kind, comparison.config, tokenizer)
    requests = trace_requests(trace, tokenizer)
    # "-", not "/": vLLM 0.32 refuses a cache_salt with "/" (kvbench.peer.engines.round_requests)
    salted = [dataclasses.replace(r, salt=f"{salt}-{r.salt}" if r.salt else salt) for r in requests]
    return PreparedComparison(comparison, trace, salted, salt)


def predict(prepared: PreparedComparison, num_gpu_blocks: int, block_size: int) -> np.ndarray:
    """kvbench's predicted ``cached_tokens`` per request on a fresh pool; shape (num_requests,).

    A fresh pool predicts a used one too: earlier comparisons used other salts, so their cached
    blocks can never hit and are popped like empty ones (all blocks are free between comparisons).
    """
    predicted = expected_cached_tokens(prepared.requests, VllmPoolConfig(num_gpu_blocks, block_size))
    return np.array(predicted, dtype=np.int64)


def reported_cached_tokens(record: RequestRecord) -> int | None:
    """The ``cached_tokens`` vLLM reported: 0 where it sent usage without ``prompt_tokens_details``
    (with ``--enable-prompt-tokens-details`` it leaves them out when nothing was cached); ``None``
    when it sent no usage at all."""
    if record.cached_prompt_tokens is not None:
        return record.cached_prompt_tokens
    return 0 if record.output_tokens_source == "usage" else None


def agreement_rows(
    prepared: PreparedComparison,
    records: Sequence[RequestRecord],
    predicted: np.ndarray,
    context: dict[str, Any],
) -> list[dict[str, Any]]:
    """One row per request: what kvbench rendered and predicted beside what vLLM reported.
    ``records`` are in trace order (``driver.drive``)."""
    rows = []
    for index, (request, tokens, record) in enumerate(
        zip(prepared.trace.requests, prepared.requests, records, strict=True)
    ):
        expected_ids = tokens.token_ids.tolist()
        reported_ids = record.prompt_token_ids
        cached = reported_cached_tokens(record)
        rows.append(
            {
                **context,
                "comparison": prepared.comparison.name,
                "backend": "vllm",
                "request_index": index,
                "request_id": request.id,
                "session_id": request.session_id,
                "turn": request.turn,
                "prompt_tokens": len(expected_ids),
                "prompt_tokens_reported": record.prompt_tokens
                if record.output_tokens_source == "usage"
                else None,
                "prompt_ids_match": None if reported_ids is None else list(reported_ids) == expected_ids,
                "output_tokens": request.max_tokens,
                "output_tokens_reported": record.output_tokens
                if record.output_tokens_source == "usage"
                else None,
                "cached_tokens_predicted": int(predicted[index]),
                "cached_tokens_reported": cached,
                "agrees": record.ok and cached == int(predicted[index]),
                "ttft_ms": record.ttft_ms,
                "e2e_ms": record.e2e_ms,
                "status": record.status.value,
                "error": record.error,
            }
        )
    return rows


def explain_disagreement(
    prepared: PreparedComparison, index: int, reported: int | None, block_size: int
) -> str:
    """A one-line reading of a request whose reported ``cached_tokens`` differs from the prediction:
    how many leading tokens it shares with any earlier request (the most any cache could give: the
    order-free bound of :func:`kvbench.sim.bounds.possible_cached_tokens` with back-to-back requests)."""
    prompts = prompt_blocks_of(prepared.requests, block_size)
    back_to_back = [(float(i), i + 0.5) for i in range(len(prompts))]
    shared = possible_cached_tokens(prompts, back_to_back)[index]
    cap = prompts[index].max_hit_blocks * block_size
    return (
        f"{prepared.trace.requests[index].id}: reported {reported}, at most {shared} "
        f"tokens shared with earlier prompts (cap {cap})"
    )
