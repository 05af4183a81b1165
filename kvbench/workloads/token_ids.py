"""Token-id workloads: requests as token ids, no text and no tokenizer (the simulator's input).

The built-in multi-prefix workload: ``num_prefixes`` system prompts of ``prefix_tokens`` tokens;
every request is one of them followed by ``unique_tokens`` fresh tokens. Popularity is Zipf
(P(prefix k) proportional to 1 / k**zipf_exponent, k = 1..num_prefixes) or round robin. Token ids
are drawn uniformly from the cl100k vocabulary with a seeded generator, so equal seeds give equal
workloads.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from kvbench.request import Request

CL100K_VOCAB_SIZE = 100_277  # tiktoken cl100k_base: 100,256 BPE ranks + special tokens
DEFAULT_MAX_TOKENS = 64  # budget of token-id requests whose source records no output length


class Popularity(str, Enum):
    ZIPF = "zipf"
    ROUND_ROBIN = "rr"


@dataclass(frozen=True)
class MultiPrefixShape:
    """The multi-prefix workload's prefixes, requests and popularity (the module docstring), with
    their defaults: the fields the token-id config and the text one
    (:class:`kvbench.workloads.generators.MultiPrefixTextConfig`) share. Each checks them."""

    num_prefixes: int = 8
    prefix_tokens: int = 2048
    unique_tokens: int = 50
    num_requests: int = 2000
    popularity: Popularity = Popularity.ZIPF
    zipf_exponent: float = 0.9


@dataclass(frozen=True)
class MultiPrefixConfig(MultiPrefixShape):
    """The multi-prefix token-id workload (see the module docstring). All counts positive."""

    seed: int = 0
    vocab_size: int = CL100K_VOCAB_SIZE

    def __post_init__(self) -> None:
        object.__setattr__(self, "popularity", Popularity(self.popularity))
        for name in ("num_prefixes", "prefix_tokens", "num_requests", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.unique_tokens, int) or self.unique_tokens < 0:
            raise ValueError(f"unique_tokens must be a non-negative integer, got {self.unique_tokens!r}")
        if not self.zipf_exponent >= 0:
            raise ValueError(f"zipf_exponent must be >= 0, got {self.zipf_exponent!r}")


def zipf_weights(num_items: int, exponent: float) -> np.ndarray:
    """P(rank k) for k = 1..num_items, proportional to 1 / k**exponent; shape (num_items,)."""
    weights = 1.0 / np.arange(1, num_items + 1, dtype=np.float64) ** exponent
    return weights / weights.sum()


def prefix_choices(config: MultiPrefixConfig, rng: np.random.Generator) -> np.ndarray:
    """Which prefix each request uses; shape (num_requests,), values in [0, num_prefixes)."""
    if config.popularity is Popularity.ROUND_ROBIN:
        return np.arange(config.num_requests) % config.num_prefixes
    weights = zipf_weights(config.num_prefixes, config.zipf_exponent)
    return rng.choice(config.num_prefixes, size=config.num_requests, p=weights)


def multi_prefix_requests(config: MultiPrefixConfig) -> list[Request]:
    """The multi-prefix workload as token-id requests, deterministic in ``config.seed``.

    Request ``i`` is ``r{i:06d}``, its own session, arrival 0, budget ``DEFAULT_MAX_TOKENS``, no salt.
    """
    rng = np.random.default_rng(config.seed)
    prefixes = rng.integers(
        0, config.vocab_size, size=(config.num_prefixes, config.prefix_tokens), dtype=np.uint32
    )
    choices = prefix_choices(config, rng)
    uniques = rng.integers(
        0, config.vocab_size, size=(config.num_requests, config.unique_tokens), dtype=np.uint32
    )
    return [
        Request(
            index,
            f"r{index:06d}",
            f"r{index:06d}",
            0,
            np.concatenate((prefixes[choice], uniques[index])),
            max_tokens=DEFAULT_MAX_TOKENS,
        )
        for index, choice in enumerate(choices)
    ]
