"""Random traces for the one-pass curve tests (tests/sim), and the result columns they compare.

Imported by its bare name (the test folder is on ``sys.path`` under pytest's rootdir conftest
import mode, as tests/server/live_server.py is); ``tests`` itself is not a package.
"""

import json

import numpy as np
from hypothesis import strategies as st
from tiny_workloads import numbered_requests

from kvbench.request import Request
from kvbench.sim.replay import prepare_prompts

BLOCK = 4


@st.composite
def traces(draw):
    """Prompts built from a few shared prefixes (random lengths, some exact multiples of the block,
    some shorter than one block) plus random suffixes, a few salted; random arrival order."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    prefixes = [
        rng.integers(0, 50, size=int(rng.integers(0, 6 * BLOCK + 1))) for _ in range(draw(st.integers(1, 5)))
    ]
    requests = []
    for index in range(draw(st.integers(1, 40))):
        prefix = prefixes[int(rng.integers(len(prefixes)))]
        prefix = prefix[: int(rng.integers(prefix.size + 1))] if rng.random() < 0.3 else prefix
        suffix = rng.integers(0, 50, size=int(rng.integers(0, 3 * BLOCK + 1)))
        tokens = np.concatenate([prefix, suffix]).astype(np.uint32)
        requests.append(
            Request(
                index=index,
                request_id=f"r{index}",
                session_id=f"s{index}",
                turn=0,
                token_ids=tokens,
                arrival_s=float(rng.integers(0, 5)),
                salt="tenant" if rng.random() < 0.1 else None,
            )
        )
    return requests


def orphan_trace():
    """Three long prompts sharing a 32-token prefix, round robin: head-first leaves orphaned tails
    (a chain's head evicted before its tail), which inserts then evict, and the release order changes
    the hit count."""
    rng = np.random.default_rng(3)
    prefixes = [rng.integers(0, 1000, size=32) for _ in range(3)]
    return prepare_prompts(
        numbered_requests(
            np.concatenate([prefixes[i % 3], rng.integers(0, 1000, size=5)]) for i in range(30)
        ),
        BLOCK,
    )


def chat_trace_file(path, num_chats):
    """A hash-id trace (16-token ids, timestamps in seconds, out of order) of ``num_chats`` chats,
    each extending a random earlier one's ids (a shared system prompt ``[0, 1]`` at the root), some
    prompts shorter than a block or cut mid-id. Returns ``path``."""
    rng = np.random.default_rng(3)
    lines, histories = [], {}
    for chat in range(num_chats):
        parent = int(rng.integers(-1, chat)) if chat and rng.random() < 0.6 else -1
        ids = histories.get(parent, [0, 1]) + [1000 + chat * 10 + k for k in range(int(rng.integers(0, 5)))]
        histories[chat] = ids
        length = max(len(ids) * 16 - int(rng.integers(0, 16)), 1)
        lines.append(
            {
                "chat_id": chat,
                "parent_chat_id": parent,
                "timestamp": float(chat // 3 + rng.integers(0, 3)),
                "input_length": length,
                "output_length": 4,
                "hash_ids": ids,
            }
        )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def counts(result):
    """Every Parquet column but ``method`` (which says how the numbers were computed)."""
    row = result.as_row()
    assert row.pop("method") == result.method
    return row
