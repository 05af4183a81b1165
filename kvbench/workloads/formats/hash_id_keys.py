"""Block keys straight from a hash-id trace's ids, read line by line: no token ids, no SHA-256.

A Mooncake or hash-id trace (:mod:`.mooncake`, :mod:`.hash_ids`) names each ``H``-token block of a
prompt by an id, prefix-chained. The token-id path synthesizes ``H`` tokens per id
(:func:`.mooncake.hash_id_tokens`) and then hashes them into chained SHA-256 keys: 3.8 s of the
4.6 s ``kvbench sim`` spent on the 12,031-request Mooncake conversation trace. Only
key *equality* matters to a hash cache, so this module gives the same equalities without either:

* a *node* is an id prefix ``(ids[0], .., ids[i])``, interned to a serial integer through
  ``(parent node, id)`` (so two prompts share node ``i`` iff their first ``i + 1`` ids are equal,
  whatever the trace's ids promise);
* block ``j`` of a ``B``-token block size is node ``(j + 1) * B / H - 1`` when ``B`` is a multiple
  of ``H``, and sub-block ``j mod m`` of node ``j // m`` when ``H = m * B``;
* its key is ``splitmix64(serial)`` as 8 big-endian bytes: distinct serials give distinct keys
  (splitmix64 is a bijection on 64 bits) and the first 8 bytes are uniform, as SHARDS' sampling
  (:mod:`kvbench.sim.shards`) needs.

Two prompts then share key ``j`` iff their first ``(j + 1) * B`` synthesized tokens are equal,
which is the token path's rule, except where two different ids' synthesized tokens agree over a
whole block (probability ``vocab_size ** -B`` per pair; :data:`MIN_BLOCK_TOKENS` keeps it below
1e-80). Block sizes that cut an id's block at other offsets are not covered (:func:`key_refusal`).
Memory: one dict entry per distinct id prefix; the lines themselves are not kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kvbench.cache.block_hash import BlockHash, PromptBlocks
from kvbench.errors import InputError
from kvbench.workloads.formats.hash_ids import HashIdFormat
from kvbench.workloads.formats.jsonl import JsonlFile, json_object
from kvbench.workloads.formats.mooncake import checked_record, splitmix64

MIN_BLOCK_TOKENS = 16  # two different ids' synthesized blocks of >= 16 tokens collide with p <= 100,000**-16
CHUNK_LINES = 4096  # lines whose keys are mixed in one numpy call (the reader holds no more)
_PUBLIC_NAMESPACE = (0).to_bytes(4, "little")  # no salt, no extra keys: what BlockHasher gives salt ""


def key_refusal(block_size: int, block_tokens: int) -> str | None:
    """Why keys from ids would not match the token path at ``block_size`` for ``block_tokens``-token
    ids, or ``None`` when they do."""
    if block_size % block_tokens == 0:
        return None
    if block_tokens % block_size == 0 and block_size >= MIN_BLOCK_TOKENS:
        return None
    return (
        f"block size {block_size} is neither a multiple nor a divisor (>= {MIN_BLOCK_TOKENS}) of the "
        f"trace's {block_tokens}-token blocks"
    )


class ChainKeys:
    """Interned id prefixes -> 8-byte block keys for one block size (see the module docstring).

    ``interned=False`` holds nothing: a node is then ``mix64(parent node, id)``, equal for equal id
    prefixes and distinct for different ones except with probability ``n**2 / 2**65`` over ``n``
    distinct prefixes (3e-6 at ten million): what the sampled curve (:mod:`kvbench.sim.shards`)
    uses to read a trace in bounded memory; the exact paths intern.

    Raises:
        ValueError: :func:`key_refusal` refuses ``block_size``.
    """

    def __init__(self, block_size: int, block_tokens: int, interned: bool = True) -> None:
        refusal = key_refusal(block_size, block_tokens)
        if refusal is not None:
            raise ValueError(refusal)
        self.block_size, self.interned = block_size, interned
        self._ids_per_block = max(block_size // block_tokens, 1)
        self._blocks_per_id = max(block_tokens // block_size, 1)
        self._nodes: dict[tuple[int, int], int] = {}

    @property
    def num_nodes(self) -> int:
        """Distinct id prefixes seen so far (the memory this object holds, in dict entries)."""
        return len(self._nodes)

    def serials(self, hash_ids: list[int], num_tokens: int) -> list[int]:
        """One serial per full ``block_size``-token block of a ``num_tokens``-token prompt (equal
        serials: equal keys); interns the prompt's id prefixes."""
        num_blocks = num_tokens // self.block_size
        per_id, ids_per_block = self._blocks_per_id, self._ids_per_block
        ids = hash_ids[: -(-num_blocks // per_id) * ids_per_block]
        serials = self._interned(ids) if self.interned else _mixed(ids)
        if ids_per_block > 1:
            return serials[ids_per_block - 1 :: ids_per_block]
        if per_id > 1:  # sub-block j % per_id of its id's node (mixed nodes: mixed again, to stay in 64 bits)
            if not self.interned:
                return [_mix64(serials[j // per_id] ^ (j % per_id)) for j in range(num_blocks)]
            return [serials[j // per_id] * per_id + j % per_id for j in range(num_blocks)]
        return serials

    def _interned(self, ids: list[int]) -> list[int]:
        nodes, parent, intern = self._nodes, -1, self._nodes.setdefault
        serials = []
        for hash_id in ids:
            parent = intern((parent, hash_id), len(nodes))
            serials.append(parent)
        return serials

    def prompt_blocks(self, lines: list[tuple[list[int], int]]) -> list[PromptBlocks]:
        """The :class:`PromptBlocks` of ``(hash_ids, num_tokens)`` prompts (no token bytes: the hash
        cache needs none), the keys of all of them mixed in one vectorized call."""
        serial_lists = [self.serials(ids, num_tokens) for ids, num_tokens in lines]
        flat = np.fromiter((s for serials in serial_lists for s in serials), dtype=np.uint64)
        raw = splitmix64(flat).astype(">u8").tobytes()
        keys = [BlockHash(raw[i : i + 8]) for i in range(0, len(raw), 8)]
        prompts, start = [], 0
        for (_, num_tokens), serials in zip(lines, serial_lists):
            prompts.append(
                PromptBlocks(
                    num_tokens,
                    self.block_size,
                    tuple(keys[start : start + len(serials)]),
                    None,
                    _PUBLIC_NAMESPACE,
                )
            )
            start += len(serials)
        return prompts


_MASK = 2**64 - 1


def _mix64(value: int) -> int:
    """splitmix64's finalizer on a Python int, modulo 2**64 (:func:`.mooncake.splitmix64`, one value)."""
    z = (value + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _mixed(ids: list[int]) -> list[int]:
    """Chained 64-bit nodes of an id prefix, holding nothing: ``mix64(parent * odd + id)``."""
    parent, serials = 0, []
    for hash_id in ids:
        parent = _mix64((parent * 0x100000001B3 + hash_id) & _MASK)
        serials.append(parent)
    return serials


@dataclass(frozen=True)
class KeyedLine:
    """One valid line: its number, ``timestamp`` in ms and its prompt's blocks."""

    line: int
    timestamp_ms: float
    prompt: PromptBlocks


def keyed_lines(
    file: JsonlFile, time_format: HashIdFormat, keys: ChainKeys, limit: int | None = None
) -> Iterator[KeyedLine]:
    """Every line of an open Mooncake / hash-id file (at most ``limit``) as keys, in file order,
    :data:`CHUNK_LINES` lines held at a time.

    Raises:
        InputError: a malformed line (file, line and field: :func:`.mooncake.checked_record`), or no
            line at all.
    """
    count, chunk = 0, []
    for line, text in file.lines():
        record = checked_record(file.path, line, json_object(file.path, line, text), time_format.block_tokens)
        chunk.append(
            (
                line,
                float(record["timestamp"]) * time_format.ms_per_timestamp,
                record["hash_ids"],
                int(record["input_length"]),
            )
        )
        count += 1
        if len(chunk) == CHUNK_LINES or count == limit:
            yield from _keyed(chunk, keys)
            chunk = []
        if count == limit:
            break
    if count == 0:
        raise InputError(f"{file.path}: no requests in the file")
    yield from _keyed(chunk, keys)


def _keyed(chunk: list[tuple[int, float, list[int], int]], keys: ChainKeys) -> Iterator[KeyedLine]:
    prompts = keys.prompt_blocks([(ids, num_tokens) for _, _, ids, num_tokens in chunk])
    for (line, timestamp_ms, _, _), prompt in zip(chunk, prompts):
        yield KeyedLine(line, timestamp_ms, prompt)
