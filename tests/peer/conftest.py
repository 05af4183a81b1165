"""Small comparisons (the harness's trace kinds, cut down)."""

import pytest
from tiny_workloads import prepared_chat, prepared_shared

from kvbench.workloads.tokenizer import load_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer()


@pytest.fixture
def shared(tokenizer):
    """4 requests sharing a 100-token system prompt, 3 output tokens each."""
    return prepared_shared(
        tokenizer, "shared_small", "peer-test-shared", 4, 100, question_tokens=20, max_tokens=3
    )


@pytest.fixture
def chat(tokenizer):
    """2 conversations of 2 turns (turn 2 resends turn 1 and the trace's reply)."""
    return prepared_chat(tokenizer, "chat_small", "peer-test-chat")
