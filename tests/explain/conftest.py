"""Small hand-built traces for ``kvbench explain``: each built so that exactly one cause applies."""

import numpy as np
import pytest

from kvbench.request import Message, Request
from kvbench.workloads.tokenizer import load_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer()


@pytest.fixture
def chat(tokenizer):
    """chat(index, messages as (role, content) pairs, session=..., turn=..., arrival_s=..., salt=...)."""

    def make(index, pairs, session=None, turn=0, arrival_s=0.0, salt=None, max_tokens=4, token_ids=None):
        messages = tuple(Message(role, content) for role, content in pairs)
        ids = (
            tokenizer.render_messages(messages)
            if token_ids is None
            else np.asarray(token_ids, dtype=np.uint32)
        )
        return Request(
            index,
            f"r{index}",
            session or f"s{index}",
            turn,
            ids,
            arrival_s=arrival_s,
            max_tokens=max_tokens,
            salt=salt,
            messages=messages,
        )

    return make
