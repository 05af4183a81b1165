"""A subscriber to the KV cache events of one or many servers (kvbench serve, vLLM, SGLang).

Per source it connects a SUB socket to the publisher and, when the source has one, a DEALER socket to
its replay ROUTER (vLLM's protocol, :mod:`kvbench.events.publisher`). It applies batches in sequence
order, per source:

* at the start, with a replay socket, it asks for everything from sequence 0 (the publisher's buffer:
  the last ``buffer_steps`` batches), so a late subscriber still builds the whole map;
* a batch whose sequence number is at most the last applied is a duplicate (a replayed batch that
  also arrived live) and is dropped;
* a batch past the next expected one is a **gap** (the PUB socket dropped messages: a slow
  subscriber past the high-water mark, or a reconnect). It is said in one line through ``on_note``,
  and the missing batches are replayed from the replay socket before the batch is applied; what the
  buffer no longer holds (or every missing batch, without a replay socket) is said lost.

Batches go to ``on_batch(source name, seq, batch)``; :class:`~kvbench.events.blockmap.FleetBlocks`
is the usual receiver. All sockets live in the thread that calls :meth:`Subscriber.poll`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import zmq

from kvbench.errors import InputError
from kvbench.events.wire import Batch, decode_batch

REPLAY_TIMEOUT_S = 2.0  # a replay socket silent this long is given up on (the gap is said lost)


@dataclass(frozen=True)
class EventSource:
    """One publisher: a name for it (the replica), its PUB endpoint, its replay endpoint (or
    ``None``) and the topic to subscribe to (``""``: every topic)."""

    name: str
    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""


@dataclass
class SourceState:
    """What the subscriber knows of one source: the last sequence number applied, gaps seen,
    batches recovered by replay and batches lost."""

    source: EventSource
    last_seq: int | None = None
    num_gaps: int = 0
    num_replayed_batches: int = 0
    num_lost_batches: int = 0
    num_bad_payloads: int = 0


class Subscriber:
    """Reads every source's batches in order (module docstring); :meth:`close` when done."""

    def __init__(
        self,
        sources: Sequence[EventSource],
        on_batch: Callable[[str, int, Batch], None],
        on_note: Callable[[str], None] = lambda line: None,
        replay_from_start: bool = True,
    ) -> None:
        if len({source.name for source in sources}) != len(sources):
            raise InputError("two event sources share one name")
        self._context = zmq.Context()
        self._on_batch, self._on_note = on_batch, on_note
        self.states = [SourceState(source) for source in sources]
        self._subs: list[zmq.Socket] = []
        self._poller = zmq.Poller()
        for source in sources:
            sub = self._context.socket(zmq.SUB)
            sub.setsockopt(zmq.RCVHWM, 0)
            sub.setsockopt_string(zmq.SUBSCRIBE, source.topic)
            sub.connect(source.endpoint)
            self._subs.append(sub)
            self._poller.register(sub, zmq.POLLIN)
        if replay_from_start:
            for state in self.states:
                if state.source.replay_endpoint is not None:
                    self._replay(state, 0, quiet=True)

    def poll(self, timeout_s: float) -> int:
        """Apply what arrives within ``timeout_s`` (every message already waiting, then whatever comes
        until the timeout); returns the batches applied."""
        deadline = time.monotonic() + timeout_s
        applied = 0
        while True:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            ready = dict(self._poller.poll(left_ms))
            if not ready:
                return applied
            for state, sub in zip(self.states, self._subs):
                if sub in ready:
                    applied += self._receive(state, sub)

    def _receive(self, state: SourceState, sub: zmq.Socket) -> int:
        frames = sub.recv_multipart()
        if len(frames) != 3:
            state.num_bad_payloads += 1
            return 0
        seq = int.from_bytes(frames[1], "big", signed=True)
        expected = 0 if state.last_seq is None else state.last_seq + 1
        applied = 0
        knows_start = state.last_seq is not None or state.source.replay_endpoint is not None
        if knows_start and seq > expected:
            state.num_gaps += 1
            if state.source.replay_endpoint is None:
                state.num_lost_batches += seq - expected
                self._on_note(
                    f"{state.source.name}: batches {expected}..{seq - 1} missed and no replay socket: "
                    f"{seq - expected} lost"
                )
            else:
                self._on_note(f"{state.source.name}: batches {expected}..{seq - 1} missed; replaying")
                applied += self._replay(state, expected, live_seq=seq)
        return applied + self._apply(state, seq, frames[2])

    def _apply(self, state: SourceState, seq: int, payload: bytes) -> int:
        if state.last_seq is not None and seq <= state.last_seq:
            return 0  # a duplicate (replayed and live)
        try:
            batch = decode_batch(payload)
        except InputError:
            state.num_bad_payloads += 1
            return 0
        if state.last_seq is None and seq > 0 and state.source.replay_endpoint is None:
            self._on_note(f"{state.source.name}: joined at batch {seq}; blocks stored before it are unknown")
        state.last_seq = seq
        self._on_batch(state.source.name, seq, batch)
        return 1

    def _replay(
        self, state: SourceState, start_seq: int, live_seq: int | None = None, quiet: bool = False
    ) -> int:
        """Ask the source's replay socket for every batch from ``start_seq``; apply them in order.
        ``live_seq``: the batch that showed the gap (what a silent replay socket leaves lost)."""
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(state.source.replay_endpoint)
        dealer.send_multipart((b"", start_seq.to_bytes(8, "big")))
        applied = recovered = 0
        first_seq = None
        try:
            while dealer.poll(int(REPLAY_TIMEOUT_S * 1000)):
                frames = dealer.recv_multipart()
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq < 0:
                    break
                first_seq = seq if first_seq is None else first_seq
                one = self._apply(state, seq, frames[-1])
                applied += one
                recovered += one if live_seq is None or seq < live_seq else 0
            else:
                self._on_note(f"{state.source.name}: the replay socket did not answer")
        finally:
            dealer.close()
        end_seq = first_seq if first_seq is not None else live_seq
        if not quiet and end_seq is not None and end_seq > start_seq:
            lost = end_seq - start_seq
            state.num_lost_batches += lost
            self._on_note(f"{state.source.name}: {lost} batches no longer in the replay buffer: lost")
        state.num_replayed_batches += recovered
        if not quiet and recovered:
            self._on_note(f"{state.source.name}: recovered {recovered} batches by replay")
        return applied

    def close(self) -> None:
        self._context.destroy(linger=0)
