"""``kvbench trace import FORMAT SRC``: other people's traffic as a kvbench text trace.

One importer per format, in a literal registry (:data:`IMPORTERS`); each reads its file into
drafts (:class:`kvbench.workloads.generators.Draft`), and :func:`import_trace` turns them into a
:class:`kvbench.workloads.formats.kvbench_trace.Trace`: arrivals shifted so the first is at 0,
sorted by arrival, and every prompt's ``expected_prompt_tokens`` counted with the chosen tokenizer
(template included), as for generated traces.

* ``jsonl``: one prompt or messages list per line (:mod:`.prompts`);
* ``sharegpt``: a JSON array of conversations, expanded into growing multi-turn requests (:mod:`.sharegpt`);
* ``burstgpt``: a CSV of timestamps and token counts, text synthesized to those lengths (:mod:`.burstgpt`);
* ``mooncake`` / ``hash-ids``: block hash ids (512 / 16 tokens per block, or ``block_size``) as
  exact text blocks (:mod:`.hash_ids`).

A bad row raises one ``InputError`` naming the file, the row and the field; with ``skip_bad`` it is
left out and counted (:class:`Imported`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from kvbench.errors import InputError
from kvbench.workloads.formats.burstgpt import read_burstgpt_drafts
from kvbench.workloads.formats.hash_ids import HASH_ID_FORMATS, hash_id_drafts, hash_id_records
from kvbench.workloads.formats.jsonl import open_jsonl
from kvbench.workloads.formats.kvbench_trace import Trace
from kvbench.workloads.formats.prompts import read_prompt_drafts
from kvbench.workloads.formats.rows import BadRows
from kvbench.workloads.formats.sharegpt import read_sharegpt_drafts
from kvbench.workloads.generators import Draft, finish_trace
from kvbench.workloads.text_fit import PieceCounter
from kvbench.workloads.tokenizer import Tokenizer


@dataclass(frozen=True)
class ImportConfig:
    """One import. Raises ``ValueError`` (naming the option) when invalid.

    Attributes:
        format: a key of :data:`IMPORTERS`. source: the file read.
        block_size: tokens per hash id (``mooncake`` / ``hash-ids`` only; ``None``: the format's).
        seed: seeds synthesized text (``burstgpt``, hash-id blocks).
        conversation_gap_s / think_time_s: ``sharegpt`` arrivals (it has no timestamps).
        num_requests: import only the first N requests (``None``: all).
        skip_bad: leave malformed rows out (counted) instead of stopping at the first.
    """

    format: str
    source: str
    block_size: int | None = None
    seed: int = 0
    conversation_gap_s: float = 1.0  # one new ShareGPT conversation a second
    think_time_s: float = 2.0  # between a ShareGPT conversation's turns
    num_requests: int | None = None
    skip_bad: bool = False

    def __post_init__(self) -> None:
        if self.format not in IMPORTERS:
            raise ValueError(f"format must be one of {', '.join(IMPORTERS)}, got {self.format!r}")
        if self.block_size is not None and self.format not in HASH_ID_FORMATS:
            raise ValueError(
                f"block_size must not be given for {self.format} (only {' and '.join(HASH_ID_FORMATS)})"
            )
        for name in ("block_size", "num_requests"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not (self.conversation_gap_s >= 0 and self.think_time_s >= 0):
            raise ValueError("conversation_gap_s and think_time_s must be >= 0")


@dataclass(frozen=True)
class Imported:
    """The trace, and the rows left out with ``skip_bad`` (``num_skipped``, the first one's error)."""

    trace: Trace
    num_skipped: int
    first_skipped: str | None


Importer = Callable[[Path, ImportConfig, Tokenizer, BadRows], list[Draft]]


def _hash_ids(path: Path, config: ImportConfig, tokenizer: Tokenizer, bad: BadRows) -> list[Draft]:
    from kvbench.workloads.mooncake_text import BlockTexts  # it reads Mooncake files through formats/

    time_format = HASH_ID_FORMATS[config.format]
    block_tokens = config.block_size or time_format.block_tokens
    try:
        blocks = BlockTexts(PieceCounter(tokenizer), config.seed, block_tokens)
    except ValueError as exc:
        raise InputError(f"--tokenizer: {exc}") from None
    with open_jsonl(path) as file:
        records = hash_id_records(file, block_tokens, bad, config.num_requests)
    return hash_id_drafts(path, records, blocks, time_format, bad)


IMPORTERS: MappingProxyType[str, Importer] = MappingProxyType(
    {
        "jsonl": lambda path, config, tokenizer, bad: read_prompt_drafts(path, bad, config.num_requests),
        "sharegpt": lambda path, config, tokenizer, bad: read_sharegpt_drafts(
            path, tokenizer, bad, config.conversation_gap_s, config.think_time_s, config.num_requests
        ),
        "burstgpt": lambda path, config, tokenizer, bad: read_burstgpt_drafts(
            path, PieceCounter(tokenizer), bad, config.seed, config.num_requests
        ),
        "mooncake": _hash_ids,
        "hash-ids": _hash_ids,
    }
)


def import_trace(config: ImportConfig, tokenizer: Tokenizer) -> Imported:
    """Read ``config.source`` with its format's importer into a trace (module docstring).

    Raises:
        InputError: the file is missing or malformed (one line: file, row, field), or no row is left.
    """
    path = Path(config.source)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    bad = BadRows(config.skip_bad)
    drafts = IMPORTERS[config.format](path, config, tokenizer, bad)
    if not drafts:
        raise InputError(
            f"{path}: no requests to import" + (f" ({bad.count} bad rows skipped)" if bad.count else "")
        )
    origin_ms = min(draft.arrival_ms for draft in drafts)
    if any(d.arrival_ms != round(d.arrival_ms - origin_ms, 3) for d in drafts):  # most files start at 0
        drafts = [dataclasses.replace(d, arrival_ms=round(d.arrival_ms - origin_ms, 3)) for d in drafts]
    trace = finish_trace(f"import-{config.format}", config, tokenizer, drafts)
    return Imported(trace, bad.count, bad.first)
