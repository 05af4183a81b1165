"""KV tiers below the GPU: which tier serves each hit block, from the one pass of stack distances.

A tier is a second (third, ...) pool of KV blocks beside the GPU's, larger and slower: host memory
(vLLM's ``OffloadingConnector`` with its CPU backend, LMCache's local CPU backend, SGLang HiCache's
host pool) or a disk. A block found there is *loaded* (copied back at the tier's bandwidth) instead of
recomputed. Two policies are modelled, each exact from one pass (:func:`tier_split`) and checked
block by block against an explicit multi-tier replay (:mod:`kvbench.sim.tier_replay`):

* ``exclusive`` (*demote on evict, promote on hit*): a block the GPU evicts moves to the next tier's
  most-recent end, a tier's own LRU victim moves one tier down, the last tier's is dropped; a hit in
  a tier moves the block back to the GPU. The hierarchy is then one LRU of the summed capacity whose
  top ``C_gpu`` blocks are on the GPU and the next ``C_1`` in tier 1 (the classic exclusive
  hierarchy), so a block at stack distance ``d`` is served by the first level whose *cumulative*
  capacity is ``>= d``. Exact while every request fits the GPU (:func:`one_pass_tier_refusal`): a
  request larger than the GPU pool has blocks the GPU refuses, which the summed LRU would keep.
* ``inclusive`` (*write-through*): every block a request computes or loads is also stored in every
  lower tier, and every request touches its blocks there, so each tier is an LRU of its own capacity
  over the same access stream and holds the top ``C_i`` blocks of the same stack; a hit is served by
  the fastest level holding it: the first whose capacity is ``>= d``. This is vLLM's
  ``OffloadingConnector``: it stores every newly computed block in the CPU tier and, at each lookup,
  touches all the request's block hashes there, last block first so that block 0 ends most recent
  (``vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``
  ``get_num_new_matched_tokens``; ``vllm/v1/kv_offload/cpu/policies/lru.py`` ``touch``), then looks up
  the CPU tier from where the GPU hit ended. One difference is named, not modelled: vLLM appends a
  request's newly stored blocks in chain order (the last block most recent until the next touch),
  where this model keeps kvbench's tail-first order throughout.

Distances come from :func:`kvbench.sim.stack_distance.stack_distances`: prefix-max distances,
non-decreasing within a request, so each request's hits are a leading run and each level's share of
it a contiguous run. The same hash-cache conditions as the exact curve apply
(:func:`kvbench.sim.curve.one_pass_refusal`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum

import numpy as np

from kvbench.errors import InputError
from kvbench.memory.layout import format_bytes, parse_bytes
from kvbench.sim.stack_distance import COLD, StackDistances

# Used when a --tier gives none: assumptions, printed as such. Bandwidth (bytes/s): a PCIe 4.0 x16
# link moves ~25 GB/s in practice (32 GB/s raw); a PCIe 4.0 NVMe SSD reads ~3-7 GB/s sequentially, 3
# GB/s is the conservative end. Latency per load (ms): ~10 us to launch a host-to-device copy; ~100 us
# for an NVMe read.
DEFAULT_BANDWIDTHS_BYTES_PER_S = {"host": 25e9, "cpu": 25e9, "disk": 3e9, "ssd": 3e9}
DEFAULT_LATENCIES_MS = {"host": 0.01, "cpu": 0.01, "disk": 0.1, "ssd": 0.1}


# The bounds of a tier spec: finite, and far beyond any real device, so only a typo or an overflow
# (1e30, 1e400, 99999999999999999999999) is refused.
MAX_TIER_BLOCKS = 1 << 40  # 2^40 blocks: 2 EiB of 2 MiB blocks
MIN_BANDWIDTH_BYTES_PER_S = 1.0
MAX_BANDWIDTH_BYTES_PER_S = 1e15  # 1 PB/s; HBM3e moves ~5 TB/s
MAX_LATENCY_MS = 3_600_000.0  # an hour per load
RESERVED_TIER_NAMES = ("gpu",)  # the level above the tiers: its column is gpu_hit_tokens
_TIER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")  # also a Parquet column: NAME_hit_tokens
_NUMBER = r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)"
_BANDWIDTH = re.compile(rf"^\s*{_NUMBER}\s*(k|m|g|t)?b(?:ps|/s)\s*$", re.IGNORECASE)
_LATENCY = re.compile(rf"^\s*{_NUMBER}\s*(ms|us|s)?\s*$", re.IGNORECASE)
_DECIMAL = {None: 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_LATENCY_UNITS_MS = {"ms": 1.0, "us": 1e-3, "s": 1e3}


class TierPolicy(str, Enum):
    """How blocks move between the GPU and the tiers below it (module docstring)."""

    EXCLUSIVE = "exclusive"
    INCLUSIVE = "inclusive"


@dataclass(frozen=True)
class Tier:
    """One level below the GPU.

    Attributes:
        name: what the user called it (``host``, ``disk``, ...).
        capacity_blocks: blocks it holds; >= 0 (0: the tier is off).
        bandwidth_bytes_per_s: load bandwidth into the GPU, bytes per second; > 0.
        latency_ms: fixed cost of each load (a request's hits in this tier), ms; >= 0.
        assumed: ``True`` when bandwidth and latency are :data:`DEFAULT_BANDWIDTHS_BYTES_PER_S`'s and
            :data:`DEFAULT_LATENCIES_MS`'s, not the user's.
    """

    name: str
    capacity_blocks: int
    bandwidth_bytes_per_s: float
    latency_ms: float = 0.0
    assumed: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.capacity_blocks <= MAX_TIER_BLOCKS:
            raise ValueError(
                f"tier {self.name}: capacity must be 0 to {MAX_TIER_BLOCKS:,} blocks, "
                f"got {self.capacity_blocks}"
            )
        if not MIN_BANDWIDTH_BYTES_PER_S <= self.bandwidth_bytes_per_s <= MAX_BANDWIDTH_BYTES_PER_S:
            raise ValueError(f"tier {self.name}: bandwidth out of range, got {self.bandwidth_bytes_per_s}")
        if not 0 <= self.latency_ms <= MAX_LATENCY_MS:
            raise ValueError(
                f"tier {self.name}: latency must be 0 to {MAX_LATENCY_MS:g} ms, got {self.latency_ms}"
            )

    def with_capacity(self, capacity_blocks: int) -> Tier:
        return replace(self, capacity_blocks=capacity_blocks)


def _bounded(value: float, text: str, what: str, low: float, high: float, unit: str) -> float:
    """``value`` (parsed from ``text``) if finite and within ``[low, high]``; else ``InputError``."""
    if not (math.isfinite(value) and low <= value <= high):
        raise InputError(f"{text!r}: a {what} must be a finite number from {low:g} to {high:g} {unit}")
    return value


def parse_bandwidth(text: str) -> float:
    """``"25GBps"`` / ``"25GB/s"`` / ``"800MBps"`` -> bytes per second (decimal units, as links are
    sold), finite, from :data:`MIN_BANDWIDTH_BYTES_PER_S` to :data:`MAX_BANDWIDTH_BYTES_PER_S`.

    Raises:
        InputError: not a bandwidth, or outside those bounds (``1e400GBps`` is infinite).
    """
    match = _BANDWIDTH.match(text)
    if match is None:
        raise InputError(f"{text!r} is not a bandwidth: write e.g. 25GBps, 25GB/s or 800MBps")
    value = float(match.group(1)) * _DECIMAL[match.group(2).lower() if match.group(2) else None]
    return _bounded(
        value, text, "bandwidth", MIN_BANDWIDTH_BYTES_PER_S, MAX_BANDWIDTH_BYTES_PER_S, "bytes per second"
    )


def parse_latency_ms(text: str) -> float:
    """``"0.05ms"`` / ``"20us"`` / ``"0.1"`` (ms) -> milliseconds, finite, 0 to :data:`MAX_LATENCY_MS`.

    Raises:
        InputError: not a duration, or outside those bounds (``1e400ms`` is infinite).
    """
    match = _LATENCY.match(text)
    if match is None:
        raise InputError(f"{text!r} is not a latency: write e.g. 0.05ms or 20us")
    value = float(match.group(1)) * _LATENCY_UNITS_MS[(match.group(2) or "ms").lower()]
    return _bounded(value, text, "latency", 0.0, MAX_LATENCY_MS, "ms")


def parse_tier_blocks(text: str, bytes_per_block: int) -> int:
    """A tier's SIZE -> blocks: ASCII digits are blocks (``4096``, ``4_096``; ``²`` is a digit to
    ``str.isdigit`` but no number), anything else bytes with a unit (``64GiB``,
    :func:`~kvbench.memory.layout.parse_bytes`) in whole blocks of ``bytes_per_block``. At most
    :data:`MAX_TIER_BLOCKS`.

    Raises:
        InputError: not a size, or more than :data:`MAX_TIER_BLOCKS` blocks.
    """
    digits = text.replace("_", "")
    blocks = int(digits) if digits.isascii() and digits.isdigit() else parse_bytes(text) // bytes_per_block
    if blocks > MAX_TIER_BLOCKS:
        raise InputError(f"{text!r}: more than any tier holds (at most {MAX_TIER_BLOCKS:,} blocks)")
    return blocks


def _check_name(name: str) -> None:
    if not _TIER_NAME.match(name):
        raise InputError(
            f"{name!r} is not a tier name: a letter, then up to 31 letters, digits, - or _ "
            "(host, disk, cxl-1)"
        )
    if name.lower() in RESERVED_TIER_NAMES:
        raise InputError(f"{name!r} names the GPU level above the tiers: call the tier something else")


def parse_tier(text: str, bytes_per_block: int) -> Tier:
    """``NAME:SIZE[:BANDWIDTH[:LATENCY]]`` -> :class:`Tier`. NAME is a letter then up to 31 letters,
    digits, ``-`` or ``_`` (it names a table column and the Parquet column ``NAME_hit_tokens``), not
    ``gpu``; SIZE as :func:`parse_tier_blocks`; BANDWIDTH as :func:`parse_bandwidth`, LATENCY as
    :func:`parse_latency_ms`; without them the name's defaults (:data:`DEFAULT_BANDWIDTHS_BYTES_PER_S`,
    :data:`DEFAULT_LATENCIES_MS`), marked assumed.

    Raises:
        InputError: one line starting ``--tier TEXT:``: a malformed spec, a bad or reserved name, an
            unknown name without a bandwidth, a size, bandwidth or latency out of bounds.
    """
    parts = [part.strip() for part in text.split(":")]
    if len(parts) not in (2, 3, 4) or not all(parts):
        raise InputError(
            f"--tier {text!r}: write NAME:SIZE[:BANDWIDTH[:LATENCY]], e.g. host:64GiB:25GBps, "
            "host:4096 (blocks)"
        )
    name, size, key = parts[0], parts[1], parts[0].lower()
    try:
        _check_name(name)
        capacity = parse_tier_blocks(size, bytes_per_block)
        if len(parts) == 2 and key not in DEFAULT_BANDWIDTHS_BYTES_PER_S:
            raise InputError(f"no default bandwidth for {name!r}; add one, e.g. {name}:{size}:10GBps")
        bandwidth = parse_bandwidth(parts[2]) if len(parts) > 2 else DEFAULT_BANDWIDTHS_BYTES_PER_S[key]
        latency = parse_latency_ms(parts[3]) if len(parts) > 3 else DEFAULT_LATENCIES_MS.get(key, 0.0)
    except InputError as exc:
        raise InputError(f"--tier {text!r}: {exc}") from None
    return Tier(name, capacity, bandwidth, latency, assumed=len(parts) < 4)


def parse_tiers(texts: Sequence[str], bytes_per_block: int) -> tuple[Tier, ...]:
    """Every ``--tier`` (:func:`parse_tier`), fastest first; two tiers may not share a name (compared
    without case: each names its own column).

    Raises:
        InputError: a bad spec, or a name given twice.
    """
    tiers, seen = [], {}
    for text in texts:
        tier = parse_tier(text, bytes_per_block)
        if tier.name.lower() in seen:
            raise InputError(
                f"--tier {text!r}: the name {tier.name!r} is already the tier {seen[tier.name.lower()]!r}; "
                "give each tier its own name (host, disk, ...)"
            )
        seen[tier.name.lower()] = text
        tiers.append(tier)
    return tuple(tiers)


def describe_tier(tier: Tier, bytes_per_block: int) -> str:
    """``host: 4,096 blocks (2.0 GiB), 25 GB/s, 0.01 ms per load (defaults assumed)``."""
    assumed = " (defaults assumed)" if tier.assumed else ""
    return (
        f"{tier.name}: {tier.capacity_blocks:,} blocks "
        f"({format_bytes(tier.capacity_blocks * bytes_per_block)}), "
        f"{tier.bandwidth_bytes_per_s / 1e9:g} GB/s, {tier.latency_ms:g} ms per load{assumed}"
    )


@dataclass(frozen=True, eq=False)
class TierSplit:
    """Where each request's prompt blocks came from, at one GPU capacity and one set of tiers.

    Attributes:
        gpu_blocks: the GPU tier's capacity, blocks.
        tiers: the levels below it, fastest first.
        policy: how blocks move between levels.
        hit_blocks: int64, shape (1 + num_tiers, num_requests): blocks served by the GPU (row 0) and
            by each tier (row ``i``), per request.
        block_size: tokens per block.
        num_prompt_tokens: int64, shape (num_requests,): each request's prompt length.
        method: ``one-pass`` or ``replay``.
    """

    gpu_blocks: int
    tiers: tuple[Tier, ...]
    policy: TierPolicy
    hit_blocks: np.ndarray
    block_size: int
    num_prompt_tokens: np.ndarray
    method: str

    @property
    def hit_tokens(self) -> np.ndarray:
        """int64, shape (1 + num_tiers, num_requests): tokens served per level and request."""
        return self.hit_blocks * self.block_size

    @property
    def missed_tokens(self) -> np.ndarray:
        """int64, shape (num_requests,): prompt tokens recomputed (prefilled), per request."""
        return self.num_prompt_tokens - self.hit_tokens.sum(axis=0)

    def token_hit_rates(self) -> np.ndarray:
        """float, shape (1 + num_tiers,): each level's share of all prompt tokens."""
        total = int(self.num_prompt_tokens.sum())
        return self.hit_tokens.sum(axis=1) / total if total else np.zeros(len(self.tiers) + 1)


def level_boundaries(gpu_blocks: int, tiers: tuple[Tier, ...], policy: TierPolicy) -> np.ndarray:
    """The largest stack distance each level serves, GPU first; int64, shape (1 + num_tiers,).

    Exclusive: cumulative capacities. Inclusive: running maximum of capacities (a tier no larger
    than a faster one above it serves nothing)."""
    capacities = np.array([gpu_blocks, *(t.capacity_blocks for t in tiers)], dtype=np.int64)
    if policy is TierPolicy.EXCLUSIVE:
        return np.cumsum(capacities)
    return np.maximum.accumulate(capacities)


def one_pass_tier_refusal(distances: StackDistances, gpu_blocks: int, policy: TierPolicy) -> str | None:
    """Why :func:`tier_split` would differ from the replay, or ``None`` when it is exact."""
    if policy is TierPolicy.EXCLUSIVE and distances.num_full_blocks.size:
        largest = int(distances.num_full_blocks.max())
        if largest > gpu_blocks:
            return (
                f"a request of {largest:,} blocks exceeds the GPU's {gpu_blocks:,}: the GPU refuses some of "
                "its blocks, which an exclusive hierarchy of the summed size would keep"
            )
    return None


def tier_split(
    distances: StackDistances,
    gpu_blocks: int,
    tiers: tuple[Tier, ...],
    policy: TierPolicy,
    block_size: int,
    num_prompt_tokens: np.ndarray,
) -> TierSplit:
    """Per request, the blocks each level serves, from the one pass (module docstring); O(num_blocks).

    Raises:
        ValueError: ``gpu_blocks`` is not positive.
    """
    if gpu_blocks <= 0:
        raise ValueError(f"gpu_blocks must be positive, got {gpu_blocks}")
    boundaries = level_boundaries(gpu_blocks, tiers, policy)
    num_levels, num_requests = boundaries.size, distances.offsets.size - 1
    block_distances = distances.distances
    level = np.searchsorted(boundaries, block_distances, side="left")  # num_levels: a miss
    level[block_distances == COLD] = num_levels
    level[~distances.hit_mask()] = num_levels  # the last-token cap: never looked up
    request = np.repeat(np.arange(num_requests, dtype=np.int64), distances.num_full_blocks)
    hits = level < num_levels
    counts = np.bincount(level[hits] * num_requests + request[hits], minlength=num_levels * num_requests)
    return TierSplit(
        gpu_blocks,
        tuple(tiers),
        policy,
        counts.reshape(num_levels, num_requests),
        block_size,
        np.asarray(num_prompt_tokens, dtype=np.int64),
        "one-pass",
    )
