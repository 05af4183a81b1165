"""Small workloads several test files run: command lines and configs kept in one place.

Imported by its bare name (``from tiny_workloads import TINY_TIMESTAMP``): tests/ is on ``sys.path``
through tests/conftest.py and is not a package."""

from kvbench.workloads.conversations import ChatConfig
from kvbench.workloads.dists import IntDist


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
