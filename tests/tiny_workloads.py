"""Small workloads several test files run: command lines, configs, numbered requests and the tiny
model's shape, kept in one place.

Imported by its bare name (``from tiny_workloads import TINY_TIMESTAMP``): tests/ is on ``sys.path``
through tests/conftest.py and is not a package."""

from collections.abc import Iterable

import numpy as np

from kvbench.peer.comparisons import Comparison, PreparedComparison, prepare
from kvbench.request import Request
from kvbench.workloads.conversations import ChatConfig
from kvbench.workloads.dists import IntDist
from kvbench.workloads.generators import SharedPrefixConfig


def tiny_timestamp(requests: int = 3) -> list:
    """``kvbench break timestamp`` at its smallest (32-token system prompt, 16-token questions, one
    output token), ``requests`` per variant; add ``--out FILE``."""
    return [
        "break",
        "timestamp",
        "--requests",
        requests,
        "--system-tokens",
        32,
        "--question-tokens",
        16,
        "--max-tokens",
        1,
    ]


def tiny_shared_prefix(num_requests: int, system_tokens: int = 64, max_tokens: int = 3) -> str:
    """A scenario file's ``[workload]`` table: ``num_requests`` shared-prefix requests, a
    ``system_tokens``-token system prompt, 16-token questions, ``max_tokens`` output tokens, seed 1."""
    return f"""
[workload]
kind = "shared-prefix"
num_requests = {num_requests}
system_tokens = {system_tokens}
question_tokens = 16
max_tokens = {max_tokens}
seed = 1
"""


def tiny_chat(num_conversations: int = 2) -> ChatConfig:
    """Conversations of 2 turns (turn 2 resends turn 1 and the trace's reply), 40-token system
    prompt, 20-token user messages, 10-token replies."""
    return ChatConfig(
        num_conversations=num_conversations,
        turns=IntDist.parse("uniform:2,2"),
        system_tokens=40,
        user_tokens=IntDist.parse("uniform:20,20"),
        reply_tokens=IntDist.parse("uniform:10,10"),
        conversation_rate_per_s=1.0,
        think_time_s=1.0,
        seed=0,
    )


def prepared_shared(
    tokenizer, name: str, salt: str, num_requests: int = 3, system_tokens: int = 64, seed: int = 0, **sizes
) -> PreparedComparison:
    """A peer shared-prefix comparison ``name`` prepared under ``salt``: ``num_requests`` requests on a
    ``system_tokens``-token system prompt, 16-token questions and 2 output tokens unless ``sizes``
    (``question_tokens``, ``max_tokens``) say otherwise."""
    config = SharedPrefixConfig(
        num_requests=num_requests,
        system_tokens=system_tokens,
        seed=seed,
        **{"question_tokens": 16, "max_tokens": 2} | sizes,
    )
    return prepare(Comparison(name, "shared-prefix", config), tokenizer, salt)


def prepared_chat(tokenizer, name: str, salt: str, num_conversations: int = 2) -> PreparedComparison:
    """A peer chat comparison ``name`` of ``tiny_chat(num_conversations)``, prepared under ``salt``."""
    return prepare(Comparison(name, "chat", tiny_chat(num_conversations)), tokenizer, salt)


# `kvbench trace gen agent`: 3 agent runs of 3-4 steps, 400-token system prompts that start with a
# volatile header; add `-o FILE`.
AGENT_WITH_HEADER = (
    "trace",
    "gen",
    "agent",
    "--num-agents",
    "3",
    "--system-tokens",
    "400",
    "--steps",
    "uniform:3,4",
    "--volatile-header",
    "--volatile-header-at",
    "start",
)


def numbered_requests(prompts: Iterable, **fields) -> list[Request]:
    """Request ``i`` holds ``prompts[i]`` as uint32 token ids: id ``r{i}``, session ``s``, turn 0,
    arriving at second ``i``. ``fields`` set other Request fields, the same for every request, or per
    request as a function of ``i``."""
    return [
        Request(
            **{"request_id": f"r{i}", "session_id": "s", "turn": 0, "arrival_s": float(i)}
            | {name: value(i) if callable(value) else value for name, value in fields.items()},
            index=i,
            token_ids=np.asarray(token_ids).astype(np.uint32),
        )
        for i, token_ids in enumerate(prompts)
    ]


# The tiny Llama's sizes (2 layers, hidden 64; ``default_llama_config(**TINY_LLAMA)``): what the
# session's tiny_loaded model and the model tests build on.
TINY_LLAMA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)
