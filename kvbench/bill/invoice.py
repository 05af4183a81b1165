"""The bill: what the usage costs with prompt caching and without it, and the break-even.

Lines (USD, prices per million tokens from :class:`kvbench.bill.rules.Prices`):

* input: ``input_tokens`` (neither read nor written) x input price;
* cache writes: ``cache_creation_input_tokens`` x write price (Anthropic 1.25x / 2x; OpenAI 1x);
* cache reads: ``cache_read_input_tokens`` x read price (Anthropic 0.1x; OpenAI the cached price);
* output: ``output_tokens`` x output price.

Without caching every prompt token is input. Break-even: caching a prefix of P tokens costs
``w P`` once instead of ``P``, and each read within the TTL costs ``r P`` instead of ``P``; after n
reads the cached total ``w + n r`` is at most the uncached ``1 + n`` once ``n >= (w - 1) / (1 - r)``:
``ceil`` of that is the number of reads a write needs to pay off (1 for Anthropic's 5-minute TTL,
2 for the 1-hour one, 0 where writes cost no premium).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvbench.bill.rules import CacheRules
from kvbench.bill.simulate import Usage

MTOK = 1_000_000


def break_even_reads(write_multiplier: float, read_multiplier: float) -> int | None:
    """Reads within the TTL for one write to pay off (``None`` when reads are not cheaper than input)."""
    if read_multiplier >= 1.0:
        return None
    return max(0, math.ceil((write_multiplier - 1.0) / (1.0 - read_multiplier) - 1e-12))


@dataclass(frozen=True)
class Bill:
    """Token totals and costs (USD) of one trace under one provider's rules."""

    rules: CacheRules
    num_requests: int
    input_tokens: int
    cache_write_tokens: int
    cache_read_tokens: int
    output_tokens: int
    num_writes: int  # requests that wrote to the cache
    num_reads: int  # requests that read from it

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_write_tokens + self.cache_read_tokens

    def _cost(self, tokens: int, price_per_mtok: float) -> float:
        return tokens * price_per_mtok / MTOK

    def lines(self) -> dict[str, float]:
        """USD per bill line, in invoice order."""
        p = self.rules.prices
        return {
            "input": self._cost(self.input_tokens, p.input_per_mtok),
            "cache writes": self._cost(self.cache_write_tokens, p.cache_write_per_mtok),
            "cache reads": self._cost(self.cache_read_tokens, p.cache_read_per_mtok),
            "output": self._cost(self.output_tokens, p.output_per_mtok),
        }

    @property
    def total_usd(self) -> float:
        return sum(self.lines().values())

    @property
    def no_cache_usd(self) -> float:
        p = self.rules.prices
        return self._cost(self.prompt_tokens, p.input_per_mtok) + self._cost(
            self.output_tokens, p.output_per_mtok
        )

    @property
    def saving_usd(self) -> float:
        return self.no_cache_usd - self.total_usd

    def as_row(self) -> dict[str, Any]:
        """One Parquet row (USD and tokens in the names)."""
        r = self.rules
        return {
            "provider": r.provider.value,
            "model": r.model,
            "retention": r.retention,
            "ttl_s": r.ttl_s,
            "num_requests": self.num_requests,
            "prompt_tokens": self.prompt_tokens,
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_write_tokens,
            "cache_read_input_tokens": self.cache_read_tokens,
            "output_tokens": self.output_tokens,
            **{f"{name.replace(' ', '_')}_usd": cost for name, cost in self.lines().items()},
            "total_usd": self.total_usd,
            "no_cache_usd": self.no_cache_usd,
            "saving_usd": self.saving_usd,
            "saving_fraction": self.saving_usd / self.no_cache_usd if self.no_cache_usd else 0.0,
            "break_even_reads": break_even_reads(r.write_multiplier, r.read_multiplier),
            "input_per_mtok": r.prices.input_per_mtok,
            "cache_write_per_mtok": r.prices.cache_write_per_mtok,
            "cache_read_per_mtok": r.prices.cache_read_per_mtok,
            "output_per_mtok": r.prices.output_per_mtok,
            "prices_source": r.source,
            "prices_as_of": r.as_of,
        }


def make_bill(usages: Sequence[Usage], rules: CacheRules) -> Bill:
    """Sum ``usages`` into a :class:`Bill`."""
    return Bill(
        rules,
        len(usages),
        sum(u.input_tokens for u in usages),
        sum(u.cache_creation_input_tokens for u in usages),
        sum(u.cache_read_input_tokens for u in usages),
        sum(u.output_tokens for u in usages),
        sum(u.cache_creation_input_tokens > 0 for u in usages),
        sum(u.cache_read_input_tokens > 0 for u in usages),
    )
