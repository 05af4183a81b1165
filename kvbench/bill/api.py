"""Price a trace under a provider's prompt caching: the library call behind ``kvbench bill``."""

from __future__ import annotations

from collections.abc import Sequence

from kvbench.bill.invoice import Bill, make_bill
from kvbench.bill.placement import Placement, mark
from kvbench.bill.rules import CacheRules
from kvbench.bill.simulate import simulate
from kvbench.request import Request
from kvbench.workloads.tokenizer import Tokenizer


def default_placement(requests: Sequence[Request]) -> Placement:
    """``messages`` for chat requests, ``end`` for token-id ones."""
    return Placement.MESSAGES if requests and requests[0].messages is not None else Placement.END


def bill_requests(requests: Sequence[Request], rules: CacheRules, placement: Placement | None = None,
                  tokenizer: Tokenizer | None = None, block_size: int = 16) -> Bill:
    """Mark every request's breakpoints, simulate the provider's cache on the arrival times, sum the bill.

    Args:
        tokenizer: renders chat messages to find their boundaries (``None`` for token-id traces).
        block_size: content-block size of token-id requests (a Mooncake hash id: 512).

    Raises:
        InputError: a placement that needs messages on a token-id trace, or too many breakpoints.
    """
    placement = placement or default_placement(requests)
    marked = [mark(r, placement, tokenizer, block_size) for r in requests]
    return make_bill(simulate(marked, rules), rules)
