"""Provider prompt-caching rules and prices, read from the package's ``providers.toml``.

The TOML is the single source of every number (each with ``as_of`` and ``source``); this module
only validates it and applies overrides. Prices are USD per million tokens (``_per_mtok``).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, replace
from enum import Enum
from importlib import resources
from typing import Any

from kvbench.errors import InputError
from kvbench.words import with_article


class Provider(str, Enum):
    ANTHROPIC = "anthropic"
    OPENAI = "openai"


@dataclass(frozen=True)
class Prices:
    """USD per million tokens.

    Attributes:
        input_per_mtok: uncached input. output_per_mtok: output.
        cache_write_per_mtok: tokens written to the cache (Anthropic: 1.25x or 2x input; OpenAI: input).
        cache_read_per_mtok: tokens read from the cache (Anthropic: 0.1x input; OpenAI: the model's
            cached-input price).
    """

    input_per_mtok: float
    output_per_mtok: float
    cache_write_per_mtok: float
    cache_read_per_mtok: float

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a non-negative price, got {value!r}")


@dataclass(frozen=True)
class CacheRules:
    """How one provider's cache behaves for one model and retention choice.

    Attributes:
        provider: which semantics to simulate (:mod:`kvbench.bill.simulate`).
        model: the model name as the provider spells it. retention: ``5m``/``1h`` or ``in-memory``/``24h``.
        ttl_s: idle seconds after which an entry expires (a read refreshes it).
        min_cacheable_tokens: prefixes shorter than this are never cached.
        increment_tokens: OpenAI hits grow in steps of this many tokens (``None`` for Anthropic).
        max_breakpoints: Anthropic's limit of ``cache_control`` marks per request (``None`` for OpenAI).
        prices: the resolved prices. source / as_of: where and when the numbers were read; verified:
            whether they were checked against the live page then.
    """

    provider: Provider
    model: str
    retention: str
    ttl_s: float
    min_cacheable_tokens: int
    increment_tokens: int | None
    max_breakpoints: int | None
    prices: Prices
    source: str
    as_of: str
    verified: bool = False  # re-read from the source when the numbers were written down

    @property
    def write_multiplier(self) -> float:
        return (
            self.prices.cache_write_per_mtok / self.prices.input_per_mtok
            if self.prices.input_per_mtok
            else 1.0
        )

    @property
    def read_multiplier(self) -> float:
        return (
            self.prices.cache_read_per_mtok / self.prices.input_per_mtok
            if self.prices.input_per_mtok
            else 0.0
        )


def provider_table() -> dict[str, Any]:
    """The parsed ``providers.toml``."""
    return tomllib.loads(
        resources.files("kvbench.bill").joinpath("providers.toml").read_text(encoding="utf-8")
    )


DEFAULT_RETENTION = {Provider.ANTHROPIC: "5m", Provider.OPENAI: "in-memory"}


def cache_rules(provider: Provider | str, model: str, retention: str | None = None) -> CacheRules:
    """The rules and prices of ``model`` at ``provider`` (retention: the provider's default when ``None``).

    Raises:
        InputError: unknown provider, model or retention (the message lists the known ones).
    """
    try:
        provider = Provider(provider)
    except ValueError:
        raise InputError(
            f"--provider: {provider!r} is not one of {', '.join(p.value for p in Provider)}"
        ) from None
    table = provider_table()[provider.value]
    models = table["models"]
    if model not in models:
        raise InputError(
            f"--model: {model!r} is not {with_article(provider.value)} model in providers.toml "
            f"(known: {', '.join(models)}; or pass every price with --input-price etc.)"
        )
    retention = retention or DEFAULT_RETENTION[provider]
    if retention not in table["ttl_s"]:
        raise InputError(
            f"--retention: {retention!r} is not one of {', '.join(table['ttl_s'])} for {provider.value}"
        )
    entry = models[model]
    base = float(entry["input"])
    if provider is Provider.ANTHROPIC:
        write, read = base * table["write_multiplier"][retention], base * table["read_multiplier"]
        minimum, increment, breakpoints = entry["min_cacheable_tokens"], None, table["max_breakpoints"]
    else:
        write, read = base * table["write_multiplier"][retention], float(entry["cached_input"])
        minimum, increment, breakpoints = table["min_cacheable_tokens"], table["increment_tokens"], None
    return CacheRules(
        provider,
        model,
        retention,
        float(table["ttl_s"][retention]),
        int(minimum),
        increment,
        breakpoints,
        Prices(base, float(entry["output"]), write, read),
        entry["source"],
        entry["as_of"],
        bool(table.get("verified", False)),
    )


def with_prices(rules: CacheRules, **overrides: float | None) -> CacheRules:
    """``rules`` with any of :class:`Prices`' fields replaced (``None`` = keep). Raises ``ValueError``."""
    given = {name: value for name, value in overrides.items() if value is not None}
    return replace(rules, prices=replace(rules.prices, **given)) if given else rules
