"""vLLM's KV cache events against kvbench's prediction of vLLM's cache, block for block.

The ``kv_events`` comparison of ``kvbench peer vllm`` runs on a vLLM started with
``--kv-events-config`` (a ZMQ publisher on an ``ipc://`` socket, its replay socket on a free loopback
port: :func:`event_endpoints`) and the small pool, so blocks are evicted. A :class:`BlockMapCheck`
keeps two block maps (:class:`kvbench.events.blockmap.ReplicaBlocks`):

* vLLM's, built by kvbench's subscriber (:mod:`kvbench.events.subscriber`) from the server's events,
  subscribed before the server sees any request;
* kvbench's, fed by the listener (:class:`kvbench.events.source.EventListener`) of a
  :class:`kvbench.sim.vllm_pool.VllmSimulator` that replays each request with the output ids vLLM
  returned.

After every request (concurrency 1: the send loop's ``on_record``) the check waits until vLLM's event
stream has been quiet for :data:`SETTLE_S` and compares the two maps by content key (the servers hash
with different seeds: :mod:`kvbench.events.blockmap`). The comparison's server gets no warm-up request,
so both maps start empty and count the same stores and removals.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvbench.events.blockmap import ReplicaBlocks
from kvbench.events.source import EventListener
from kvbench.events.subscriber import EventSource, Subscriber
from kvbench.events.wire import Batch
from kvbench.peer.server import free_port
from kvbench.request import Request, RequestRecord
from kvbench.sim.vllm_pool import VllmPoolConfig, VllmSimulator

SETTLE_S = 0.5  # a checkpoint waits until vLLM's event stream has been quiet this long
SOURCE = "vllm"


def event_endpoints() -> tuple[str, str]:
    """A fresh ``(publisher, replay)`` endpoint pair for one vLLM. vLLM 0.32 binds only a wildcard
    or an ``ipc://`` publisher endpoint (it connects to ``tcp://127.0.0.1:PORT``), so the publisher
    gets a short ``ipc://`` path; the replay socket is always bound, so loopback TCP works there."""
    return f"ipc://{tempfile.mkdtemp(prefix='kvb-')}/events", f"tcp://127.0.0.1:{free_port()}"


@dataclass(frozen=True)
class Checkpoint:
    """The two maps after one request: blocks held on each side (every copy counted) and the blocks
    one side holds that the other does not (by content key)."""

    request_index: int
    request_id: str
    vllm_blocks_held: int
    kvbench_blocks_held: int
    vllm_only_blocks: int
    kvbench_only_blocks: int

    @property
    def matches(self) -> bool:
        return self.vllm_only_blocks == 0 and self.kvbench_only_blocks == 0

    def describe(self) -> str:
        return (
            f"block maps differ after request {self.request_index} ({self.request_id}): vLLM holds "
            f"{self.vllm_only_blocks} block(s) kvbench does not, kvbench {self.kvbench_only_blocks} "
            f"vLLM does not ({self.vllm_blocks_held} vs {self.kvbench_blocks_held} held)"
        )


@dataclass(frozen=True)
class MapCounts:
    """One block map's totals: blocks stored, removed and held at the end; for vLLM's also the event
    batches applied, gaps in their sequence, batches lost, clears and orphan blocks (``None`` for the
    simulator's, which has no stream)."""

    blocks_stored: int
    blocks_removed: int
    blocks_held: int
    batches: int | None = None
    gaps: int | None = None
    lost_batches: int | None = None
    clears: int | None = None
    orphan_blocks: int | None = None


@dataclass(frozen=True)
class KvEventsSummary:
    """The KV events check of one comparison: every checkpoint and both maps' totals."""

    name: str
    num_gpu_blocks: int
    block_size: int
    checkpoints: tuple[Checkpoint, ...]
    vllm: MapCounts
    kvbench: MapCounts

    @property
    def num_mismatched(self) -> int:
        return sum(not checkpoint.matches for checkpoint in self.checkpoints)

    @property
    def first_mismatch(self) -> Checkpoint | None:
        return next((checkpoint for checkpoint in self.checkpoints if not checkpoint.matches), None)

    def disagreements(self) -> tuple[str, ...]:
        """One line when any checkpoint mismatched: the first one and how many."""
        first = self.first_mismatch
        if first is None:
            return ()
        return (f"{first.describe()}; {self.num_mismatched} of {len(self.checkpoints)} checkpoints differ",)

    def as_dict(self) -> dict[str, Any]:
        first = self.first_mismatch
        return {
            "name": self.name,
            "num_gpu_blocks": self.num_gpu_blocks,
            "block_size": self.block_size,
            "num_checkpoints": len(self.checkpoints),
            "num_mismatched": self.num_mismatched,
            "first_mismatch": None if first is None else first.describe(),
            "vllm": self.vllm.__dict__,
            "kvbench": self.kvbench.__dict__,
        }


class BlockMapCheck:
    """vLLM's block map against kvbench's, after every request (module docstring). Create it before
    the server gets any request; :meth:`close` (or ``with``) when done."""

    def __init__(
        self,
        endpoints: tuple[str, str],
        num_gpu_blocks: int,
        block_size: int,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.num_gpu_blocks, self.block_size = num_gpu_blocks, block_size
        self.served, self.predicted = ReplicaBlocks(SOURCE), ReplicaBlocks("kvbench")
        self.checkpoints: list[Checkpoint] = []
        self.simulator = VllmSimulator(VllmPoolConfig(num_gpu_blocks, block_size))
        self.simulator.index.listener = EventListener(
            lambda event: self.predicted.apply(0, Batch(0.0, (event,)), 0.0), block_size
        )
        self.subscriber = Subscriber(
            [EventSource(SOURCE, *endpoints)],
            lambda name, seq, batch: self.served.apply(seq, batch, time.monotonic()),
            on_note=log,
        )

    def settle(self) -> None:
        """Apply vLLM's batches until its stream has been quiet for :data:`SETTLE_S`."""
        while self.subscriber.poll(SETTLE_S):
            pass

    def checkpoint(self, request: Request, record: RequestRecord) -> None:
        """Replay ``request`` on the simulator with vLLM's output ids, then compare the maps. A failed
        request (no output ids) is not replayed: its checkpoint shows what that leaves apart."""
        if record.ok and record.output_token_ids is not None:
            self.simulator.run(request, record.output_token_ids)
        self.settle()
        got, want = self.served.content_counts(), self.predicted.content_counts()
        self.checkpoints.append(
            Checkpoint(
                request.index,
                request.request_id,
                sum(got.values()),
                sum(want.values()),
                sum((got - want).values()),
                sum((want - got).values()),
            )
        )

    def row_columns(self) -> dict[int, dict[str, Any]]:
        """Per request index, the Parquet columns of its checkpoint (``kvbench.peer.report.ROW_SCHEMA``)."""
        return {
            c.request_index: {
                "blocks_held_vllm": c.vllm_blocks_held,
                "blocks_held_kvbench": c.kvbench_blocks_held,
                "block_maps_match": c.matches,
            }
            for c in self.checkpoints
        }

    def summary(self, name: str) -> KvEventsSummary:
        state = self.subscriber.states[0]
        served, predicted = self.served, self.predicted
        return KvEventsSummary(
            name,
            self.num_gpu_blocks,
            self.block_size,
            tuple(self.checkpoints),
            MapCounts(
                served.num_stored_blocks,
                served.num_removed_blocks,
                sum(served.content_counts().values()),
                None if state.last_seq is None else state.last_seq + 1,
                state.num_gaps,
                state.num_lost_batches,
                served.num_clears,
                served.num_orphan_blocks,
            ),
            MapCounts(
                predicted.num_stored_blocks,
                predicted.num_removed_blocks,
                sum(predicted.content_counts().values()),
            ),
        )

    def close(self) -> None:
        self.subscriber.close()

    def __enter__(self) -> BlockMapCheck:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def events_markdown(summaries: list[KvEventsSummary] | tuple[KvEventsSummary, ...]) -> list[str]:
    """The report's KV events section (no lines without a summary)."""
    lines: list[str] = []
    for s in summaries:
        first = s.first_mismatch
        lines += [
            "",
            f"## KV events: vLLM's block map vs kvbench's ({s.name})",
            "",
            f"{len(s.checkpoints)} checkpoints (after every request, compared by content key), "
            f"{s.num_mismatched} mismatched"
            + (f"; first: {first.describe()}" if first else "")
            + f". Pool: {s.num_gpu_blocks:,} blocks of {s.block_size} (null block included).",
            "",
            "| block map | blocks stored | blocks removed | blocks held at the end | batches | gaps | "
            "lost batches | orphan blocks |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for label, c in (("vLLM (its events)", s.vllm), ("kvbench (vllm_pool simulator)", s.kvbench)):
            extra = " | ".join(_count(v) for v in (c.batches, c.gaps, c.lost_batches, c.orphan_blocks))
            lines.append(
                f"| {label} | {c.blocks_stored:,} | {c.blocks_removed:,} | {c.blocks_held:,} | {extra} |"
            )
    return lines


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"
