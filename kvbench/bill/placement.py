"""Where a request's ``cache_control`` breakpoints go, and the content-block boundaries a provider
may find a cached prefix at (token offsets into the rendered prompt).

* Chat requests (with messages): a boundary after every message (offsets from rendering
  ``messages[:k]`` with the trace's tokenizer; ChatML renders each message as its own segment).
* Token-id requests (Mooncake): a boundary every ``block_size`` tokens (one hash id = one block).

Placements (Anthropic allows up to 4 breakpoints per request):

* ``messages``: after the system prompt and after the last stable turn (every message but the last),
  what the kvbench Anthropic backend sends;
* ``system``: after the system prompt only;
* ``end``: one breakpoint at the end of the prompt (automatic caching of the whole prompt).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from kvbench.errors import InputError
from kvbench.request import Request
from kvbench.workloads.tokenizer import Tokenizer


class Placement(str, Enum):
    MESSAGES = "messages"
    SYSTEM = "system"
    END = "end"


@dataclass(frozen=True, eq=False)
class Marked:
    """A request as a provider's cache sees it: ids, arrival (s), boundaries and breakpoints
    (ascending token offsets, breakpoints a subset of boundaries plus the end), output tokens."""

    token_ids: np.ndarray
    arrival_s: float
    boundaries: tuple[int, ...]
    breakpoints: tuple[int, ...]
    output_tokens: int

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])


def message_boundaries(request: Request, tokenizer: Tokenizer) -> list[int]:
    """Token offset after each message of ``request``. Raises ``InputError`` if rendering the
    messages one prefix at a time does not reproduce the request's ids (a non-prefix chat template)."""
    messages = request.messages or ()
    empty = len(tokenizer.render_messages([]))  # the generation prompt alone
    offsets = []
    for k in range(1, len(messages) + 1):
        rendered = tokenizer.render_messages(messages[:k])
        offset = len(rendered) - empty
        if not np.array_equal(rendered[:offset], request.token_ids[:offset]):
            raise InputError(
                f"request {request.request_id}: its chat template does not render messages as "
                "prefixes; use --placement end"
            )
        offsets.append(offset)
    return offsets


def mark(request: Request, placement: Placement, tokenizer: Tokenizer | None, block_size: int) -> Marked:
    """The request's boundaries and breakpoints under ``placement``. Raises ``InputError`` for a
    ``messages``/``system`` placement on a request without messages."""
    n = request.num_tokens
    output = request.output_tokens or request.max_tokens
    if request.messages is None or tokenizer is None:
        if placement is not Placement.END:
            raise InputError(
                f"--placement {placement.value}: request {request.request_id} has no messages "
                "(a token-id trace); use --placement end"
            )
        boundaries = tuple(range(block_size, n + 1, block_size))
        return Marked(request.token_ids, request.arrival_s, boundaries, (n,), output)
    boundaries = message_boundaries(request, tokenizer)
    marks = {
        Placement.END: [n],
        Placement.SYSTEM: boundaries[:1] if request.messages[0].role == "system" else [],
        Placement.MESSAGES: (boundaries[:1] if request.messages[0].role == "system" else [])
        + boundaries[len(boundaries) - 2 : len(boundaries) - 1],
    }[placement]
    return Marked(request.token_ids, request.arrival_s, tuple(boundaries), tuple(sorted(set(marks))), output)
