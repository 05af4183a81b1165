"""Traces of block hash ids, any block size: Mooncake (512 tokens) and the 16-token traces.

Both carry, per line, ``timestamp``, ``input_length``, ``output_length`` and ``hash_ids`` (one id
per block of the prompt, prefix-chained); no text. They differ in block size and time unit
(:data:`HASH_ID_FORMATS`, from ``../shared/REFERENCES.md`` sections 4 and 5):

* ``mooncake``: 512-token blocks, ``timestamp`` in ms; every line is its own session.
* ``hash-ids`` (Qwen-Bailian ``qwen-bailian-usagetraces-anon``, ServeGen): 16-token blocks,
  ``timestamp`` in seconds, and ``chat_id`` / ``parent_chat_id`` (``-1`` or absent: a first turn).
  A line whose parent is an earlier line continues that line's session, one turn later; a parent
  not in the file (a cut trace) names a session of its own.

``block_tokens`` overrides the block size (``kvbench trace import mooncake --block-size N``). As
text (:func:`hash_id_drafts`), id ``h`` is a ``block_tokens``-token text block
(:class:`kvbench.workloads.mooncake_text.BlockTexts`); as token ids (:func:`hash_id_requests`,
what ``kvbench run`` reads directly) it is :func:`kvbench.workloads.formats.mooncake.hash_id_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kvbench.errors import InputError
from kvbench.request import Request
from kvbench.workloads.formats.jsonl import JsonlFile, json_object
from kvbench.workloads.formats.mooncake import checked_record, hash_id_tokens
from kvbench.workloads.formats.rows import BadRows
from kvbench.workloads.generators import Draft
from kvbench.workloads.token_ids import DEFAULT_MAX_TOKENS


@dataclass(frozen=True)
class HashIdFormat:
    """``block_tokens``: tokens per hash id; ``ms_per_timestamp``: ms per unit of ``timestamp``."""

    block_tokens: int
    ms_per_timestamp: float


HASH_ID_FORMATS = MappingProxyType(
    {
        "mooncake": HashIdFormat(512, 1.0),  # FAST'25 README: 512-token blocks, ms
        "hash-ids": HashIdFormat(16, 1000.0),  # Qwen-Bailian / ServeGen: 16-token blocks, seconds
    }
)


@dataclass(frozen=True)
class HashIdRecord:
    """One valid line: its number, fields, session and 0-based turn."""

    line: int
    record: dict[str, Any]
    session_id: str
    turn: int


def _chat_id(path: Path, line: int, record: dict[str, Any], field: str) -> int | None:
    value = record.get(field)
    if value is None or value == -1:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
        raise InputError.at(path, line, field, f"expected an integer or string id, got {value!r}")
    return value


def _session(
    path: Path, line: int, record: dict[str, Any], chats: dict[Any, tuple[str, int]]
) -> tuple[str, int]:
    chat, parent = _chat_id(path, line, record, "chat_id"), _chat_id(path, line, record, "parent_chat_id")
    if parent is not None and parent in chats:
        session, turn = chats[parent][0], chats[parent][1] + 1
    else:
        session, turn = (
            f"chat-{parent if parent is not None else (chat if chat is not None else f'line-{line}')}",
            0,
        )
    if chat is not None:
        chats[chat] = (session, turn)
    return session, turn


def hash_id_records(
    file: JsonlFile, block_tokens: int, bad: BadRows, limit: int | None = None
) -> list[HashIdRecord]:
    """The valid lines of an open hash-id file, in file order (at most ``limit``).

    Raises:
        InputError: (without ``bad.skip``) a malformed line, naming the file, line and field
            (``hash_ids`` when their count is not one per ``block_tokens``-token block).
    """
    records: list[HashIdRecord] = []
    chats: dict[Any, tuple[str, int]] = {}
    for line, text in file.lines():

        def parse() -> HashIdRecord:
            record = checked_record(file.path, line, json_object(file.path, line, text), block_tokens)
            return HashIdRecord(line, record, *_session(file.path, line, record, chats))

        if (parsed := bad.guard(parse)) is not None:
            records.append(parsed)
        if limit is not None and len(records) >= limit:
            break
    return records


def _budget(record: dict[str, Any]) -> int:
    return int(record["output_length"]) or DEFAULT_MAX_TOKENS


def hash_id_drafts(
    path: Path, records: list[HashIdRecord], blocks: Any, time_format: HashIdFormat, bad: BadRows
) -> list[Draft]:
    """Text drafts: each line's prompt is its blocks' texts (``blocks``: a ``BlockTexts``) cut to
    ``input_length`` tokens. An empty prompt cannot be text: a bad row (``InputError``)."""
    drafts = []
    for item in records:
        record = item.record

        def prompt() -> str:
            if record["input_length"] < 1:
                raise InputError.at(path, item.line, "input_length", "an empty prompt cannot be text")
            try:
                return blocks.prompt(record["hash_ids"], int(record["input_length"]))
            except ValueError as exc:
                raise InputError.at(path, item.line, "input_length", str(exc)) from None

        if (text := bad.guard(prompt)) is not None:
            output = int(record["output_length"])
            drafts.append(
                Draft(
                    item.session_id,
                    item.turn,
                    float(record["timestamp"]) * time_format.ms_per_timestamp,
                    _budget(record),
                    prompt=text,
                    output_tokens=output or None,
                )
            )
    return drafts


def hash_id_requests(records: list[HashIdRecord], time_format: HashIdFormat) -> list[Request]:
    """Token-id requests (``r{i:06d}``, file order), arrivals shifted so the first is at 0."""
    if not records:
        return []
    origin_ms = min(float(item.record["timestamp"]) for item in records) * time_format.ms_per_timestamp
    requests = []
    for index, item in enumerate(records):
        record = item.record
        output = int(record["output_length"])
        arrival_ms = float(record["timestamp"]) * time_format.ms_per_timestamp - origin_ms
        requests.append(
            Request(
                index,
                f"r{index:06d}",
                item.session_id,
                item.turn,
                hash_id_tokens(
                    record["hash_ids"], int(record["input_length"]), block_tokens=time_format.block_tokens
                ),
                arrival_s=arrival_ms / 1000.0,
                max_tokens=_budget(record),
                output_tokens=output or None,
            )
        )
    return requests
