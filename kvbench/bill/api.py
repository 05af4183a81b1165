"""Price a trace under a provider's prompt caching: the library call behind ``kvbench bill``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvbench.bill.invoice import Bill, make_bill
from kvbench.bill.placement import Placement, mark
from kvbench.bill.rules import CacheRules
from kvbench.bill.simulate import Usage, simulate
from kvbench.errors import InputError
from kvbench.request import Request
from kvbench.results.rows import rows_from_dicts
from kvbench.workloads.tokenizer import Tokenizer


def default_placement(requests: Sequence[Request]) -> Placement:
    """``messages`` for chat requests, ``end`` for token-id ones."""
    return Placement.MESSAGES if requests and requests[0].messages is not None else Placement.END


def bill_requests(
    requests: Sequence[Request],
    rules: CacheRules,
    placement: Placement | None = None,
    tokenizer: Tokenizer | None = None,
    block_size: int = 16,
) -> Bill:
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


def bill_results(path: Path, rules: CacheRules) -> Bill:
    """Price a measured run from its recorded usage (a ``kvbench run`` results file): per ok measured
    row, reads = ``cached_prompt_tokens``, writes = ``cache_creation_input_tokens`` (0 where the
    server did not report it, as OpenAI-style servers do not), the rest of the prompt as input.

    Raises:
        InputError: not a results file.
    """
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path).to_pylist()
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not a kvbench results file ({exc})") from None
    if table and "prompt_tokens" not in table[0]:
        raise InputError(f"{path}: not a kvbench run results file (no prompt_tokens column)")
    usages = []
    for row in rows_from_dicts(table):
        if row.status != "ok" or row.phase != "measure":
            continue
        read, written = row.cached_prompt_tokens or 0, row.cache_creation_input_tokens or 0
        usages.append(Usage(row.prompt_tokens - read - written, written, read, row.output_tokens or 0))
    return make_bill(usages, rules)
