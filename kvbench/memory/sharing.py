"""Blocks shared inside one request: parallel sampling and beam search on a :class:`BlockManager`.

Both runs count blocks, not bytes (multiply by ``KvLayout.bytes_per_block``), and compare against
the same request without sharing, where every sample or beam holds a full private copy of its
sequence: ``num_sequences x ceil(tokens / block_size)`` blocks.

* Parallel sampling (``n`` samples of one prompt, vLLM's ``SamplingParams(n=...)``): the prompt is
  allocated once and forked ``n - 1`` times, so its blocks sit at ref count ``n``. Every step, each
  sample appends one token in sample order; the first write into the shared partial last block
  copies it (copy-on-write), so a prompt that does not end on a block boundary costs ``n - 1``
  copies and the last writer keeps the original. Every sample generates ``max_tokens`` tokens.
* Beam search (width ``k``): every step each live beam proposes ``k`` continuations with random
  log-probabilities (seeded); the ``k`` best by cumulative score survive. A beam with no survivor is
  freed (its blocks only lose a ref); a beam with ``c`` survivors continues as one and is forked
  ``c - 1`` times; then every beam appends its token. No early stop at an end-of-sequence token.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

from kvbench.memory.block_manager import BlockManager, BlockManagerConfig


@dataclass(frozen=True)
class SharingConfig:
    """One request that shares its blocks.

    Attributes:
        prompt_tokens: prompt length, tokens; positive.
        max_tokens: tokens each sample / beam generates; positive.
        num_sequences: samples (parallel sampling, n) or beams (beam search, the width); positive.
        block_size: tokens per block; positive.
        seed: seeds the beam-search scores (parallel sampling is deterministic).
    """

    prompt_tokens: int
    max_tokens: int
    num_sequences: int = 4
    block_size: int = 16  # vLLM's default block size
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "max_tokens", "num_sequences", "block_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def num_unshared_peak_blocks(self) -> int:
        """Blocks at the end of the run if every sample / beam held a private copy."""
        return self.num_sequences * math.ceil((self.prompt_tokens + self.max_tokens) / self.block_size)


@dataclass(frozen=True)
class SharingResult:
    """Counts from one sharing run (blocks; ``step`` 0 is the prompt before any token).

    Attributes:
        config: the run's settings.
        num_prompt_blocks: ``ceil(prompt_tokens / block_size)``.
        num_shared_prompt_blocks: prompt blocks at ref count > 1 right after the forks.
        num_shared_blocks_after_first_token: blocks at ref count > 1 after every sequence wrote once.
        num_copies_after_first_token: copy-on-write copies made by then.
        num_copies: copy-on-write copies over the whole run.
        num_forks: forks (parallel sampling: ``num_sequences - 1``).
        num_freed_sequences: beams that died before the end (0 for parallel sampling).
        used_blocks_per_step: blocks in use after each step, shape (max_tokens + 1,).
        unshared_blocks_per_step: the same without sharing, shape (max_tokens + 1,).
        num_used_blocks_after_free: blocks still in use once every sequence is freed (0 if sound).
    """

    config: SharingConfig
    num_prompt_blocks: int
    num_shared_prompt_blocks: int
    num_shared_blocks_after_first_token: int
    num_copies_after_first_token: int
    num_copies: int
    num_forks: int
    num_freed_sequences: int
    used_blocks_per_step: tuple[int, ...]
    unshared_blocks_per_step: tuple[int, ...]
    num_used_blocks_after_free: int

    @property
    def peak_used_blocks(self) -> int:
        return max(self.used_blocks_per_step)

    @property
    def peak_unshared_blocks(self) -> int:
        return max(self.unshared_blocks_per_step)

    @property
    def saved_fraction(self) -> float:
        """``1 - peak with sharing / peak without``."""
        return 1.0 - self.peak_used_blocks / self.peak_unshared_blocks


def _unshared_blocks(config: SharingConfig, step: int) -> int:
    return config.num_sequences * math.ceil((config.prompt_tokens + step) / config.block_size)


def _new_manager(config: SharingConfig) -> BlockManager:
    return BlockManager(BlockManagerConfig(config.num_unshared_peak_blocks, config.block_size))


class _Steps:
    """Blocks in use after each step of one run, with sharing and without, and the sharing right
    after the first token; :meth:`result` frees the live sequences and reports."""

    def __init__(self, manager: BlockManager, unshared_at_start: int) -> None:
        self.manager = manager
        self.used, self.unshared = [manager.num_used_blocks], [unshared_at_start]
        self.first_token = (0, 0)  # (shared blocks, copies) after every sequence wrote once

    def record(self, step: int, unshared_blocks: int) -> None:
        self.used.append(self.manager.num_used_blocks)
        self.unshared.append(unshared_blocks)
        if step == 1:
            self.first_token = (self.manager.num_shared_blocks, self.manager.num_copies)

    def result(
        self,
        config: SharingConfig,
        live: Iterable[int],
        num_shared_prompt_blocks: int,
        num_forks: int,
        num_freed_sequences: int,
    ) -> SharingResult:
        for sequence in live:
            self.manager.free(sequence)
        return SharingResult(
            config=config,
            num_prompt_blocks=self.manager.num_blocks_to_allocate(config.prompt_tokens),
            num_shared_prompt_blocks=num_shared_prompt_blocks,
            num_shared_blocks_after_first_token=self.first_token[0],
            num_copies_after_first_token=self.first_token[1],
            num_copies=self.manager.num_copies,
            num_forks=num_forks,
            num_freed_sequences=num_freed_sequences,
            used_blocks_per_step=tuple(self.used),
            unshared_blocks_per_step=tuple(self.unshared),
            num_used_blocks_after_free=self.manager.num_used_blocks,
        )


def simulate_parallel_sampling(config: SharingConfig) -> SharingResult:
    """Run ``config.num_sequences`` samples of one prompt on a pool big enough never to run out."""
    manager = _new_manager(config)
    samples = list(range(config.num_sequences))
    manager.allocate(samples[0], config.prompt_tokens)
    for sample in samples[1:]:
        manager.fork(samples[0], sample)
    num_shared_prompt_blocks = manager.num_shared_blocks
    steps = _Steps(manager, _unshared_blocks(config, 0))
    for step in range(1, config.max_tokens + 1):
        for sample in samples:
            manager.append(sample)
        steps.record(step, _unshared_blocks(config, step))
    return steps.result(config, samples, num_shared_prompt_blocks, config.num_sequences - 1, 0)


def _select_survivors(
    scores: dict[int, float], num_beams: int, rng: random.Random
) -> list[tuple[int, float]]:
    """The ``num_beams`` best (parent beam, new score) pairs among ``num_beams`` proposals per beam."""
    proposals = [
        (score + math.log(1.0 - rng.random()), beam)  # log of a uniform in (0, 1]
        for beam, score in scores.items()
        for _ in range(num_beams)
    ]
    return [(beam, score) for score, beam in heapq.nlargest(num_beams, proposals)]


def simulate_beam_search(config: SharingConfig) -> SharingResult:
    """Run beam search of width ``config.num_sequences`` for ``max_tokens`` steps on one prompt."""
    manager = _new_manager(config)
    rng = random.Random(config.seed)
    manager.allocate(0, config.prompt_tokens)
    scores: dict[int, float] = {0: 0.0}
    next_id, num_forks, num_freed = 1, 0, 0
    steps = _Steps(manager, manager.num_used_blocks)
    for step in range(1, config.max_tokens + 1):
        survivors = _select_survivors(scores, config.num_sequences, rng)
        parents = {beam for beam, _ in survivors}
        for beam in [beam for beam in scores if beam not in parents]:
            manager.free(beam)  # a dying beam only drops ref counts
            num_freed += 1
        new_scores: dict[int, float] = {}
        for beam, score in survivors:
            if beam in new_scores:  # a second survivor of the same parent: fork it
                manager.fork(beam, next_id)
                beam, next_id, num_forks = next_id, next_id + 1, num_forks + 1
            new_scores[beam] = score
        for beam in new_scores:
            manager.append(beam)
        scores = new_scores
        steps.record(step, len(scores) * math.ceil((config.prompt_tokens + step) / config.block_size))
    return steps.result(config, scores, steps.first_token[0], num_forks, num_freed)
