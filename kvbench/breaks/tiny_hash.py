"""``kvbench break tiny-hash``: truncated block keys collide, and the cache serves the wrong KV.

The hash cache trusts its key, as vLLM does: a key found in the table is a hit, whatever tokens the
stored block holds. With full SHA-256 keys that is safe (P(any collision) <= n**2 / 2**257 for n
stored blocks). Keeping only ``hash_bits`` bits makes a lookup of a key that is not really cached
find some other block with probability about ``stored blocks / 2**hash_bits`` (the birthday bound
of ``kvbench.cache.block_hash``), and the engine then computes over another prompt's KV. Because
every block has the same shape, nothing crashes: the output is just wrong.

Collisions also happen *within* one request's chain (key j equal to key i < j): the lookup then
"hits" block i again at position j, and an insert shares block i instead of storing block j.

Three runs of the same multi-prefix text trace: cache off (the reference outputs), ``hash_bits``-bit
keys (broken), full SHA-256 (correct). False hits are found after the fact for the report only:
:class:`FalseHitTracker` replays every request through a model-free copy of the cache in lockstep
(same config, same operations, so the same decisions) whose payloads record what each stored block
really is (its full SHA-256 chained key) and whether its KV was computed over a wrong past. The
cache under test is never guarded (``verify_tokens`` stays off).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from kvbench.breaks.common import (
    ParquetTable,
    Progress,
    VariantRun,
    VerdictTable,
    break_schema,
    run_variant,
    variant_backend,
)
from kvbench.cache.base import CacheConfig, MatchResult, make_cache
from kvbench.cache.block_hash import BlockHash, BlockHasher, HashConfig
from kvbench.engine.model import LoadedModel
from kvbench.sim.bounds import unbounded_capacity_blocks
from kvbench.sim.step import step
from kvbench.workloads.formats.kvbench_trace_reader import trace_requests
from kvbench.workloads.generators import MultiPrefixTextConfig, check_ints, generate_multi_prefix
from kvbench.workloads.tokenizer import Tokenizer, load_tokenizer

EXPERIMENT = "tiny-hash"
EXTRA_FIELDS = (
    pa.field("hash_bits", pa.int64()),  # null = full width
    pa.field("num_false_hit_blocks", pa.int64()),  # hit blocks whose stored content is another prefix's
    pa.field("first_false_block", pa.int64()),
    pa.field("served_poisoned_blocks", pa.bool_()),  # hit blocks computed over a wrong past
    pa.field("collision_chance", pa.float64()),  # expected collisions of this request's new keys
    pa.field("output_token_ids", pa.list_(pa.int64())),
    pa.field("reference_output_token_ids", pa.list_(pa.int64())),
)


@dataclass(frozen=True)
class TinyHashConfig:
    """Settings of the tiny-hash experiment (a multi-prefix text workload with short prompts).

    Attributes:
        hash_bits: bits kept of every block key (8..256).
        num_requests: requests per run.
        num_prefixes / prefix_tokens: the shared system prompts (Zipf popularity).
        unique_tokens: each request's own text (>= 16); its blocks are the keys that get probed.
        max_tokens: output tokens per request (greedy, compared with the cache-off output).
        block_size: tokens per block.
        seed: the trace's seed.
    """

    hash_bits: int = 16
    num_requests: int = 300  # ~12 collisions expected at 16 bits (see Observation.collision_chance)
    num_prefixes: int = 4
    prefix_tokens: int = 48
    unique_tokens: int = 64  # 4 new blocks per request: the table grows by ~4 keys a request
    max_tokens: int = 2  # a wrong past shows in the first token already
    block_size: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        HashConfig(hash_bits=self.hash_bits)  # 8..256
        check_ints(self, ("num_requests", "num_prefixes", "prefix_tokens", "max_tokens", "block_size"))
        check_ints(self, ("unique_tokens",), minimum=16)
        check_ints(self, ("seed",), minimum=0)


@dataclass(frozen=True)
class _Truth:
    """What a stored block really is (a shadow cache's payload)."""

    true_key: BlockHash  # full SHA-256 chained key: its tokens and everything before them
    poisoned: bool  # its KV was computed over a wrong past (a false or poisoned hit before it)


@dataclass(frozen=True)
class Observation:
    """What the tracker found for one request.

    Attributes:
        num_false_hit_blocks: hit blocks whose stored block is another prefix's.
        first_false_block: index of the first of them, or ``None``.
        served_poisoned_blocks: a hit block's KV was computed over a wrong past.
        collision_chance: expected collisions of this request's new keys (the lookup's first probe
            past the true hit, and every key the insert stored) with the ``stored`` keys already
            there: ``new keys x stored / 2**bits`` (the birthday bound, per request).
    """

    num_false_hit_blocks: int
    first_false_block: int | None
    served_poisoned_blocks: bool
    collision_chance: float


class FalseHitTracker:
    """A model-free replica of the engine's cache, stepped in lockstep, to count false hits.

    Call :meth:`observe` once per request, after the engine served it, in the same order.
    """

    def __init__(self, cache: CacheConfig) -> None:
        self._cache = make_cache(cache)
        self._hasher = BlockHasher(cache.block_size, cache.hash)
        self._true_hasher = BlockHasher(cache.block_size)  # full-width SHA-256
        self._key_space = 2.0**cache.hash.key_bits

    def observe(self, token_ids: Sequence[int] | np.ndarray, salt: str, num_hit_blocks: int) -> Observation:
        """Replay one request (one :func:`kvbench.sim.step.step`: lookup, insert, release) and compare
        what it hit with what it is; the blocks it stores carry their truth as payloads.

        Raises:
            RuntimeError: the replica hit a different number of blocks than the engine did (the two
                caches left lockstep: a bug, not a collision).
        """
        num_stored = self._cache.num_cached_blocks
        prompt = self._hasher.prompt_blocks(token_ids, salt=salt, keep_tokens=False)
        truths = self._true_hasher.block_hashes(token_ids, salt=salt)
        false_blocks: list[int] = []  # read from the hit's payloads, before the step releases it
        poisoned = False

        def truths_after(match: MatchResult) -> list[_Truth]:
            nonlocal poisoned
            if match.num_hit_blocks != num_hit_blocks:
                raise RuntimeError(
                    f"the replica hit {match.num_hit_blocks} blocks, the engine {num_hit_blocks}"
                )
            false_blocks.extend(i for i, stored in enumerate(match.payloads) if stored.true_key != truths[i])
            poisoned = any(stored.poisoned for stored in match.payloads)
            wrong_past = poisoned or bool(false_blocks)
            return [_Truth(truths[i], wrong_past) for i in range(num_hit_blocks, prompt.num_full_blocks)]

        step(self._cache, prompt, payloads_for=truths_after)
        # Keys that were not truly cached yet met the table: the lookup's first probe past the true
        # hit, and every key the insert stored or found "already cached".
        num_new_keys = int(num_hit_blocks < prompt.max_hit_blocks or bool(false_blocks)) + (
            prompt.num_full_blocks - num_hit_blocks
        )
        return Observation(
            len(false_blocks),
            false_blocks[0] if false_blocks else None,
            poisoned,
            num_new_keys * num_stored / self._key_space,
        )


@dataclass(eq=False)
class TinyHashResult:
    """The cache-off reference run, then the truncated-key run and the SHA-256 run."""

    config: TinyHashConfig
    reference: VariantRun
    runs: list[VariantRun]  # truncated first, then sha256
    tokenizer: Tokenizer

    @property
    def broken(self) -> VariantRun:
        return self.runs[0]

    @property
    def correct(self) -> VariantRun:
        return self.runs[1]

    def counts(self, run: VariantRun) -> dict[str, float]:
        """False-hit requests and blocks, requests served poisoned blocks, mismatched outputs, estimate."""
        rows = run.rows
        return {
            "false_hit_requests": sum(1 for r in rows if r.extra["num_false_hit_blocks"]),
            "false_hit_blocks": sum(r.extra["num_false_hit_blocks"] for r in rows),
            "poisoned_requests": sum(1 for r in rows if r.extra["served_poisoned_blocks"]),
            "mismatched_outputs": sum(1 for r in rows if r.result.output_matches_reference is False),
            "expected_false_hits": sum(r.extra["collision_chance"] for r in rows),
        }

    def example(self) -> dict | None:
        """The first broken-run request whose output differs from cache-off (one with a false hit of
        its own preferred), or ``None``."""
        mismatched = [r for r in self.broken.rows if r.result.output_matches_reference is False]
        own = [r for r in mismatched if r.extra["num_false_hit_blocks"]]
        return (own or mismatched or [None])[0]

    @property
    def verdict(self) -> str:
        broken, correct = self.counts(self.broken), self.counts(self.correct)
        return (
            f"{self.config.hash_bits}-bit keys: {broken['false_hit_requests']} requests hit another "
            f"prompt's blocks and {broken['mismatched_outputs']} outputs differ from cache-off; full "
            f"SHA-256: {correct['false_hit_requests']} and {correct['mismatched_outputs']} on the same trace"
        )

    def parquet_tables(self) -> list[ParquetTable]:
        rows = [row for run in (self.reference, *self.runs) for row in run.parquet_rows()]
        return [ParquetTable(rows, break_schema(EXTRA_FIELDS))]

    def metadata(self) -> dict:
        return {
            "config": vars(self.config),
            "verdict": self.verdict,
            "counts": {run.variant: self.counts(run) for run in self.runs},
        }


def run_tiny_hash(
    loaded: LoadedModel,
    config: TinyHashConfig = TinyHashConfig(),
    tokenizer: Tokenizer | None = None,
    progress: Progress | None = None,
) -> TinyHashResult:
    """Serve the trace with the cache off, with ``hash_bits``-bit keys, then with SHA-256 keys."""
    tokenizer = tokenizer or load_tokenizer()
    trace = generate_multi_prefix(
        MultiPrefixTextConfig(
            num_prefixes=config.num_prefixes,
            prefix_tokens=config.prefix_tokens,
            unique_tokens=config.unique_tokens,
            num_requests=config.num_requests,
            max_tokens=config.max_tokens,
            seed=config.seed,
        ),
        tokenizer,
    )
    requests = trace_requests(trace, tokenizer)
    capacity = unbounded_capacity_blocks((r.num_tokens for r in requests), config.block_size)  # never evicts
    reference = run_variant(
        variant_backend(loaded, None), requests, EXPERIMENT, "cache-off", progress=progress
    )
    reference_ids = [list(result.output_token_ids) for result in reference.results]
    reference.rows[:] = [
        row.with_columns(
            dict(output_token_ids=ids, reference_output_token_ids=ids, output_matches_reference=True)
        )
        for row, ids in zip(reference.rows, reference_ids)
    ]
    runs = []
    for hash_bits in (config.hash_bits, None):
        cache = CacheConfig(capacity, config.block_size, hash=HashConfig(hash_bits=hash_bits))
        tracker = FalseHitTracker(cache)

        def hook(request, result, tracker=tracker, hash_bits=hash_bits):
            seen = tracker.observe(
                request.token_ids, request.salt or "", result.cached_prompt_tokens // config.block_size
            )
            expected = reference_ids[request.index]
            return {
                "hash_bits": hash_bits,
                "num_false_hit_blocks": seen.num_false_hit_blocks,
                "first_false_block": seen.first_false_block,
                "collision_chance": seen.collision_chance,
                "served_poisoned_blocks": seen.served_poisoned_blocks,
                "output_token_ids": list(result.output_token_ids),
                "reference_output_token_ids": expected,
                "output_matches_reference": list(result.output_token_ids) == expected,
            }

        variant = "sha256" if hash_bits is None else f"{hash_bits}-bit"
        runs.append(
            run_variant(variant_backend(loaded, cache), requests, EXPERIMENT, variant, hook, progress)
        )
    return TinyHashResult(config, reference, runs, tokenizer)


def tiny_hash_table(result: TinyHashResult) -> VerdictTable:
    """False hits, poisoned requests and mismatched outputs, per key width."""
    rows = []
    for run in result.runs:
        counts = result.counts(run)
        rows.append(
            (
                run.variant,
                f"{run.summary.token_hit_rate:.3f}",
                f"{counts['false_hit_requests']:,}",
                f"{counts['false_hit_blocks']:,}",
                f"{counts['expected_false_hits']:.2g}",
                f"{counts['poisoned_requests']:,}",
                f"{counts['mismatched_outputs']:,} / {len(run.rows):,}",
            )
        )
    config = result.config
    notes = [
        f"{config.num_requests} requests, {config.num_prefixes} system prompts of {config.prefix_tokens} "
        f"tokens (Zipf) + {config.unique_tokens} unique tokens, {config.max_tokens} output tokens, greedy; "
        "outputs compared with a cache-off run",
        "false hit: a key matched a stored block holding another prefix's tokens (found after the fact; "
        "the cache itself trusts its key); expected collisions = sum over requests of new keys x stored "
        "blocks / 2**bits; one collision on a popular prefix block makes every later request with "
        "that prefix a false hit; poisoned: hit blocks computed over a wrong past by an earlier false hit",
        *_example_lines(result),
    ]
    return VerdictTable(
        "kvbench break tiny-hash: truncated block keys",
        (
            "keys",
            "hit rate",
            "false-hit requests",
            "false-hit blocks",
            "expected collisions",
            "poisoned requests",
            "outputs differing",
        ),
        rows,
        result.verdict,
        notes,
    )


def _example_lines(result: TinyHashResult) -> list[str]:
    row = result.example()
    if row is None:
        return []
    decode = result.tokenizer.decode
    first_false, reference, output = (
        row.extra[name] for name in ("first_false_block", "reference_output_token_ids", "output_token_ids")
    )
    where = "" if first_false is None else f", first false hit at block {first_false}"
    return [
        f"example: request {row.result.request_id} ({row.result.prompt_tokens} prompt tokens, "
        f"{row.result.cached_prompt_tokens} cached{where})",
        f"  cache off: {reference} {decode(reference)!r}",
        f"  {result.broken.variant} keys: {output} {decode(output)!r}",
    ]
