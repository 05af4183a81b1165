"""Small comparisons (the harness's trace kinds, cut down)."""

import pytest
from tiny_workloads import tiny_chat

from kvbench.peer.comparisons import Comparison, prepare
from kvbench.workloads.generators import SharedPrefixConfig
from kvbench.workloads.tokenizer import load_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer()


@pytest.fixture
def shared(tokenizer):
    """4 requests sharing a 100-token system prompt, 3 output tokens each."""
    comparison = Comparison(
        "shared_small",
        "shared-prefix",
        SharedPrefixConfig(num_requests=4, system_tokens=100, question_tokens=20, max_tokens=3, seed=0),
    )
    return prepare(comparison, tokenizer, "peer-test-shared")


@pytest.fixture
def chat(tokenizer):
    """2 conversations of 2 turns (turn 2 resends turn 1 and the trace's reply)."""
    comparison = Comparison(
        "chat_small",
        "chat",
        tiny_chat(),
    )
    return prepare(comparison, tokenizer, "peer-test-chat")
