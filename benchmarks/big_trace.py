"""A Mooncake-format trace of any size, seeded: conversations on a few hundred system prompts plus
one-off prompts that each start with a new first block: the shape that strains both the sampled
curve's key budget and the exact curve's memory.

    PYTHONPATH=. python benchmarks/big_trace.py --requests 1000000 --out /tmp/big-1m.jsonl [--seed 0]

Lines as Mooncake's (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids`` of 512-token
blocks, prefix-chained). The shape (defaults of :class:`BigTraceConfig`):

* ``one_off_share`` (10%) of the requests are one-off prompts: ``one_off_blocks`` blocks (uniform),
  all ids new, so each has a first block of its own;
* the others are turns of conversations: a session picks one of ``num_system_prompts`` system
  prompts (Zipf ``zipf_exponent``; 1 .. ``max_system_blocks`` blocks each), then every turn adds
  ``turn_blocks`` blocks (uniform) of history, and its prompt is the system prompt plus the history
  so far; 1 + Geometric turns (mean ``mean_turns``), log-normal gaps between turns (median
  ``median_gap_s``), sessions starting uniformly over the trace (``requests_per_s`` on average).

At 1,000,000 requests: 100,253 distinct first blocks, 24.8M block accesses (24.8 per request),
273 MB (the target: 100,421 first blocks, 24.8M accesses, 278 MB). Everything is numpy but the text:
ids are written with one ``str.join`` per chunk of requests.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BLOCK_TOKENS = 512  # Mooncake's block (FAST'25 trace README)
_CHUNK_REQUESTS = 1 << 16  # requests formatted per str.join
_POWERS_OF_10 = 10 ** np.arange(1, 19, dtype=np.int64)


@dataclass(frozen=True)
class BigTraceConfig:
    """The trace's shape (see the module docstring); every count in requests or blocks."""

    num_requests: int = 1_000_000
    seed: int = 0
    one_off_share: float = 0.10  # the target shape: "10% one-off prompts, each with a new first block"
    one_off_blocks: tuple[int, int] = (4, 46)  # inclusive range; mean 25 blocks like the conversations
    num_system_prompts: int = 300  # the target shape: "a few hundred system prompts"
    zipf_exponent: float = 1.0
    max_system_blocks: int = 8
    mean_turns: float = 5.85
    turn_blocks: tuple[int, int] = (2, 5)  # history added per turn (inclusive range)
    median_gap_s: float = 900.0  # between a session's turns; with requests_per_s ~ 9,000 requests
    requests_per_s: float = 10.0

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be positive, got {self.num_requests}")
        if not 0 <= self.one_off_share <= 1:
            raise ValueError(f"one_off_share must be in [0, 1], got {self.one_off_share}")


@dataclass(frozen=True, eq=False)
class BigTrace:
    """The requests in arrival order: ``hash_ids[offsets[r]:offsets[r + 1]]`` is request ``r``'s.

    Attributes:
        timestamps_ms, input_lengths, output_lengths: int64, shape (num_requests,).
        hash_ids: int64, shape (num_blocks,); offsets: int64, shape (num_requests + 1,).
    """

    timestamps_ms: np.ndarray
    input_lengths: np.ndarray
    output_lengths: np.ndarray
    hash_ids: np.ndarray
    offsets: np.ndarray

    @property
    def num_distinct_first_blocks(self) -> int:
        return int(np.unique(self.hash_ids[self.offsets[:-1]]).size)


def _system_prompts(config: BigTraceConfig, rng) -> tuple[np.ndarray, np.ndarray]:
    """First id and block count of each system prompt (ids 0 .. total - 1)."""
    blocks = rng.integers(1, config.max_system_blocks + 1, size=config.num_system_prompts)
    return np.concatenate([[0], np.cumsum(blocks)[:-1]]), blocks


def _conversations(config: BigTraceConfig, num_turns_wanted: int, rng, first_id: int):
    """``(times_ms, segments)`` of ``num_turns_wanted`` conversation turns; segments are
    ``(system start, system blocks, history start, history blocks)`` per turn."""
    num_sessions = int(num_turns_wanted / config.mean_turns * 1.3) + 16
    turns = rng.geometric(1 / config.mean_turns, size=num_sessions)  # 1, 2, ...: mean mean_turns
    ends = np.cumsum(turns)
    num_sessions = int(np.searchsorted(ends, num_turns_wanted)) + 1
    turns = turns[:num_sessions]
    turns[-1] -= int(ends[num_sessions - 1]) - num_turns_wanted
    turns = turns[turns > 0]
    session = np.repeat(np.arange(turns.size), turns)
    first_turn = np.concatenate([[0], np.cumsum(turns)[:-1]])
    growth = rng.integers(config.turn_blocks[0], config.turn_blocks[1] + 1, size=session.size)
    history = np.cumsum(growth)
    session_base = history[first_turn] - growth[first_turn]  # history before each session's first turn
    history_blocks = history - session_base[session]
    duration_s = config.num_requests / config.requests_per_s
    gaps_s = rng.lognormal(np.log(config.median_gap_s), 1.0, size=session.size)
    gaps_s[first_turn] = rng.uniform(0, duration_s, size=turns.size)  # the session's start
    elapsed_s = np.cumsum(gaps_s)
    times_s = elapsed_s - (elapsed_s[first_turn] - gaps_s[first_turn])[session]
    weights = 1.0 / np.arange(1, config.num_system_prompts + 1) ** config.zipf_exponent
    prompt = rng.choice(config.num_system_prompts, size=turns.size, p=weights / weights.sum())[session]
    system_start, system_blocks = _system_prompts(config, rng)
    return times_s * 1000.0, (
        system_start[prompt],
        system_blocks[prompt],
        first_id + session_base[session],
        history_blocks,
    )


def generate(config: BigTraceConfig) -> BigTrace:
    """The whole trace in memory (numpy arrays, ~8 bytes per block and ~40 per request)."""
    rng = np.random.default_rng(config.seed)
    num_one_offs = round(config.one_off_share * config.num_requests)
    num_system_ids = config.num_system_prompts * config.max_system_blocks
    times_ms, (sys_start, sys_blocks, hist_start, hist_blocks) = _conversations(
        config, config.num_requests - num_one_offs, rng, num_system_ids
    )
    one_off_blocks = rng.integers(config.one_off_blocks[0], config.one_off_blocks[1] + 1, size=num_one_offs)
    first_one_off_id = int((hist_start + hist_blocks).max(initial=num_system_ids))
    one_off_start = first_one_off_id + np.concatenate([[0], np.cumsum(one_off_blocks)[:-1]]).astype(np.int64)
    one_off_ms = rng.uniform(0, config.num_requests / config.requests_per_s * 1000.0, size=num_one_offs)
    zeros = np.zeros(num_one_offs, dtype=np.int64)
    starts = np.stack(
        [np.concatenate([sys_start, one_off_start]), np.concatenate([hist_start, zeros])], axis=1
    )
    lengths = np.stack(
        [np.concatenate([sys_blocks, one_off_blocks]), np.concatenate([hist_blocks, zeros])], axis=1
    )
    order = np.argsort(np.concatenate([times_ms, one_off_ms]), kind="stable")
    stamps_ms = np.sort(np.concatenate([times_ms, one_off_ms]), kind="stable").astype(np.int64)
    starts, lengths = starts[order].ravel(), lengths[order].ravel()  # two segments per request
    num_blocks = lengths.reshape(-1, 2).sum(axis=1)
    segment_offsets = np.concatenate([[0], np.cumsum(lengths)])
    within = np.arange(int(segment_offsets[-1]), dtype=np.int64) - np.repeat(segment_offsets[:-1], lengths)
    hash_ids = np.repeat(starts, lengths) + within
    input_lengths = num_blocks * BLOCK_TOKENS - rng.integers(0, BLOCK_TOKENS, size=num_blocks.size)
    return BigTrace(
        stamps_ms,
        input_lengths,
        rng.integers(1, 1001, size=num_blocks.size),
        hash_ids,
        np.concatenate([[0], np.cumsum(num_blocks)]),
    )


def write_jsonl(trace: BigTrace, path: str | Path) -> int:
    """Write ``trace`` as Mooncake JSONL (one request a line); returns the bytes written."""
    num_requests, written = trace.timestamps_ms.size, 0
    with open(path, "w", encoding="ascii") as file:
        for start in range(0, num_requests, _CHUNK_REQUESTS):
            stop = min(start + _CHUNK_REQUESTS, num_requests)
            first, last = int(trace.offsets[start]), int(trace.offsets[stop])
            ids = trace.hash_ids[first:last]
            text = ", ".join(map(str, ids.tolist()))
            widths = np.searchsorted(_POWERS_OF_10, ids, side="right") + 3  # digits + ", "
            ends = np.concatenate([[0], np.cumsum(widths)])  # char offset of each id (", " after each)
            bounds = ends[trace.offsets[start : stop + 1] - first]
            lines = [
                f'{{"timestamp": {t}, "input_length": {i}, "output_length": {o}, "hash_ids": '
                f"[{text[a : max(a, b - 2)]}]}}\n"
                for t, i, o, a, b in zip(
                    trace.timestamps_ms[start:stop].tolist(),
                    trace.input_lengths[start:stop].tolist(),
                    trace.output_lengths[start:stop].tolist(),
                    bounds[:-1].tolist(),
                    bounds[1:].tolist(),
                )
            ]
            chunk = "".join(lines)
            file.write(chunk)
            written += len(chunk)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.perf_counter()
    trace = generate(BigTraceConfig(num_requests=args.requests, seed=args.seed))
    num_bytes = write_jsonl(trace, args.out)
    print(
        f"{args.out}: {args.requests:,} requests, {trace.hash_ids.size:,} block accesses, "
        f"{trace.num_distinct_first_blocks:,} distinct first blocks, {num_bytes / 1e6:,.0f} MB "
        f"in {time.perf_counter() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
