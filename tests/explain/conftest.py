"""Small hand-built traces for ``kvbench explain``: each built so that exactly one cause applies."""

import numpy as np
import pytest

from kvbench.request import Message, Request
from kvbench.workloads.tokenizer import load_tokenizer

STABLE = ("You are the support assistant of a storage company. Answer in plain words, cite the manual, "
          "never guess, and keep every answer short. The manual covers quotas, snapshots, replication, "
          "billing, retention and access control. When a question is about billing, send the user to the "
          "billing portal. When a question is about access control, explain roles before permissions. "
          "Snapshots are read only. Replication is asynchronous across regions and synchronous inside one.\n")


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer()


@pytest.fixture
def chat(tokenizer):
    """chat(index, messages as (role, content) pairs, session=..., turn=..., arrival_s=..., salt=...)."""

    def make(index, pairs, session=None, turn=0, arrival_s=0.0, salt=None, max_tokens=4, token_ids=None):
        messages = tuple(Message(role, content) for role, content in pairs)
        ids = tokenizer.render_messages(messages) if token_ids is None else np.asarray(token_ids, dtype=np.uint32)
        return Request(index, f"r{index}", session or f"s{index}", turn, ids, arrival_s=arrival_s,
                       max_tokens=max_tokens, salt=salt, messages=messages)

    return make


def first_difference(a, b) -> int:
    n = min(len(a), len(b))
    different = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(different[0]) if different.size else n
