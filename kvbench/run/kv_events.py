"""``kvbench run --kv-events SRC``: read the replicas' KV cache events during a run.

A :class:`EventRecorder` subscribes to every source (:func:`kvbench.events.discover.parse_sources`:
a server's ``http://`` root, asked for ``/kv_event_sources``, or a ``tcp://`` / ``ipc://`` endpoint)
from its own thread before the first request, builds one block map per replica
(:class:`~kvbench.events.blockmap.FleetBlocks`, starting from the publisher's replay buffer, so
blocks stored before the run count) and logs every batch with the time it arrived. After the send
loop it waits until each kvbench serve source has delivered every batch its ``/kv_blocks`` counts
(other servers: until the stream is quiet for :data:`QUIET_S`), then reports:

* per replica the blocks held at the end (per medium), stored and removed during the send loop
  (``num_clears`` counts every clear the stream held, a reset before the run included), the gaps in
  the sequence and what the replay socket recovered or lost;
* across the replicas the blocks two or more of them hold (by content, so replicas hashing with
  different seeds still match), the copies beyond the first and their bytes (``bytes_per_block``
  from kvbench serve's ``/kv_blocks``; unknown for other servers);
* per request, from the log replayed up to the moment the request was sent: the prefix (tokens) the
  replica that served it held (``held_tokens``: the hits the events attribute to that replica, capped
  at the last-token rule as a server's ``cached_tokens`` is), and the replica that held the most
  of it (``best_replica`` / ``best_tokens``). ``best_tokens - held_tokens`` is what the routing
  left on another replica.

A run under its own fresh ``cache_salt`` (the default hygiene) can hit none of the blocks held before
its send loop (stored under other salts; the events carry no salt), so its attribution replays only
the batches of the loop; under ``--hygiene nonce`` the nonce keeps earlier prompts' blocks apart by
content. The request's content keys come from its token ids as sent (:func:`prompt_content_keys`), so they
match the server's own blocks when kvbench's tokenizer and template are the server's (kvbench serve,
or a server whose tokenizer the run detected). Batches are placed in time by when kvbench received
them, on the send loop's clock: exact at concurrency 1, where a request's blocks are stored long
before the next one is sent; under concurrency a request in flight may not have published yet.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kvbench.cache.block_hash import encode_token_ids, max_hit_blocks
from kvbench.errors import InputError
from kvbench.events.blockmap import FleetBlocks, prompt_content_keys
from kvbench.events.discover import parse_sources
from kvbench.events.subscriber import EventSource, Subscriber
from kvbench.events.wire import Batch, BlockStored
from kvbench.run.clock import WALL_CLOCK

POLL_S = 0.05  # the recorder thread's poll
QUIET_S = 0.5  # a source without a batch count is drained until silent this long
DRAIN_TIMEOUT_S = 10.0  # the longest wait for the last batches after the run
START_TIMEOUT_S = 15.0  # the longest wait for the subscriber's first replay
SETTLE_S = 0.3  # the subscriber's first poll before the run starts: its connections established


def check_kv_event_targets(targets: Sequence[str]) -> None:
    """Raise ``ValueError`` naming ``--kv-events`` for a target that is neither ``NAME=``-optional
    ``http(s)://``, ``tcp://`` nor ``ipc://``, or a name given twice (without contacting anything)."""
    names = []
    for target in targets:
        name, _, url = target.partition("=") if "=" in target.split("://")[0] else ("", "", target)
        if urlsplit(url.partition(",replay=")[0]).scheme not in ("http", "https", "tcp", "ipc"):
            raise ValueError(
                f"--kv-events {target!r}: give a server's http:// root (it says where it publishes), "
                "or tcp://HOST:PORT / ipc://PATH"
            )
        names.append(name or url)
    if len(set(names)) != len(names):
        raise ValueError("--kv-events: a source is given twice")


@dataclass(frozen=True)
class _Logged:
    arrival_s: float  # WALL_CLOCK seconds
    name: str
    seq: int
    batch: Batch


class EventRecorder:
    """Subscribes to ``targets`` in its own thread from construction to :meth:`stop` (module
    docstring). Raises ``InputError`` (one line) when a source cannot be found or subscribed to."""

    def __init__(
        self,
        targets: Sequence[str],
        metadata: dict[str, Any] | None = None,
        notes: list[str] | None = None,
        block_size: int = 16,
        salted: bool = False,
    ) -> None:
        self.salted = salted
        self.metadata = metadata if metadata is not None else {}
        self.run_notes = notes if notes is not None else []
        self.block_size = block_size
        self.sources: list[EventSource] = parse_sources(list(targets))
        self._servers = {s.name: t for s, t in _server_roots(self.sources, targets)}
        self.blocks = FleetBlocks(_bytes_per_block(self._servers.values()))
        for source in self.sources:  # every source is reported, one that sent nothing with 0 blocks
            self.blocks.replica(source.name)
        self.log: list[_Logged] = []
        self.notes: list[str] = []
        self.states: list = []
        self._lock = threading.Lock()
        self._stop, self._ready = threading.Event(), threading.Event()
        self._error: BaseException | None = None
        self.start_s: float | None = None
        self._counts_at_start: dict[str, tuple[int, int]] = {}
        self._thread = threading.Thread(target=self._loop, name="kv-events-recorder", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S) or self._error is not None:
            self._stop.set()
            raise InputError(f"--kv-events: cannot subscribe ({self._error or 'no answer'})")

    def _loop(self) -> None:
        try:
            subscriber = Subscriber(self.sources, self._on_batch, self.notes.append)
        except Exception as exc:  # zmq refuses an endpoint: said by the constructor
            self._error = exc
            self._ready.set()
            return
        self.states = subscriber.states
        subscriber.poll(SETTLE_S)  # a SUB socket hears only what is sent once it has connected
        self._ready.set()
        try:
            while not self._stop.is_set():
                subscriber.poll(POLL_S)
        finally:
            subscriber.close()

    def _on_batch(self, name: str, seq: int, batch: Batch) -> None:
        with self._lock:
            self.log.append(_Logged(WALL_CLOCK.now(), name, seq, batch))
            self.blocks.apply(name, seq, batch, time.monotonic())

    def mark_start(self, start_s: float) -> None:
        """The send loop's start on :data:`WALL_CLOCK` (records' ``sent_s`` count from it): the
        replicas' store and removal counts are taken from here."""
        self.start_s = start_s
        with self._lock:
            self._counts_at_start = {
                name: (r.num_stored_blocks, r.num_removed_blocks) for name, r in self.blocks.replicas.items()
            }

    def stop(self) -> None:
        """Wait for the batches still on their way (module docstring), then stop the thread (once)."""
        if self._stop.is_set():
            return
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        time.sleep(POLL_S)  # the publishers' last pass (kvbench serve batches every few ms)
        while time.monotonic() < deadline and not self._drained():
            time.sleep(POLL_S)
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _drained(self) -> bool:
        """Every kvbench serve source caught up with the batches its ``/kv_blocks`` counts, and any
        other source quiet for :data:`QUIET_S`."""
        last = {state.source.name: state.last_seq for state in self.states}
        counted = set()
        for name, root in self._servers.items():
            sent = _kv_blocks(root).get("num_batches")
            if not isinstance(sent, int):
                continue  # not kvbench serve: waited for by the quiet rule
            if sent and (last.get(name) is None or last[name] + 1 < sent):
                return False
            counted.add(name)
        if counted == set(last):
            return True
        with self._lock:
            return not self.log or WALL_CLOCK.now() - self.log[-1].arrival_s >= QUIET_S

    def on_end(self, records: Sequence) -> None:
        """However the send loop ended: stop, put :meth:`report` of the ``(request as sent,
        record)`` pairs into the metadata's ``kv_events`` and its :func:`summary_lines` into the
        run's notes."""
        self.stop()
        requests = [request for request, _ in records]
        report = self.report(requests, [record for _, record in records], self.block_size)
        self.metadata["kv_events"] = report
        self.run_notes.extend(f"KV events: {note}" for note in self.notes)
        summary_lines(report, self.run_notes.append)

    def report(self, requests: Sequence, records: Sequence, block_size: int) -> dict[str, Any]:
        """The result file's ``kv_events`` metadata: the fleet's summary and each request's
        attribution (module docstring). ``requests`` / ``records``: the requests as sent and their
        records, in one order; ``block_size``: the server's, unless its events say otherwise."""
        summary = self.blocks.summary(time.monotonic())
        states = {state.source.name: state for state in self.states}
        replicas = [
            {
                "name": r.name,
                "blocks": r.blocks_by_medium,
                "num_stored_blocks": r.num_stored_blocks - self._counts_at_start.get(r.name, (0, 0))[0],
                "num_removed_blocks": r.num_removed_blocks - self._counts_at_start.get(r.name, (0, 0))[1],
                "num_clears": r.num_clears,
                "num_gaps": states[r.name].num_gaps if r.name in states else 0,
                "num_replayed_batches": states[r.name].num_replayed_batches if r.name in states else 0,
                "num_lost_batches": states[r.name].num_lost_batches if r.name in states else 0,
            }
            for r in summary.replicas
        ]
        return {
            "sources": [source.name for source in self.sources],
            "silent": [s.source.name for s in self.states if s.last_seq is None],
            "replicas": replicas,
            "num_distinct_blocks": summary.num_distinct_blocks,
            "num_duplicated_blocks": summary.num_duplicated_blocks,
            "num_redundant_copies": summary.num_redundant_copies,
            "bytes_per_block": self.blocks.bytes_per_block,
            "redundant_bytes": summary.redundant_bytes,
            "requests": self._attribute(requests, records, self._block_size(block_size)),
        }

    def _block_size(self, default: int) -> int:
        for logged in self.log:
            for event in logged.batch.events:
                if isinstance(event, BlockStored):
                    return event.block_size
        return default

    def _attribute(self, requests: Sequence, records: Sequence, block_size: int) -> dict[str, list]:
        """Per request sent (in the order sent), what each replica held of its prompt then."""
        sent = sorted(
            (
                (self.start_s + record.sent_s, request, record)
                for request, record in zip(requests, records)
                if record is not None
                and record.sent_s is not None
                and request.token_ids is not None
                and self.start_s is not None
            ),
            key=lambda item: item[0],
        )
        replay, log, at = FleetBlocks(), self.log, 0
        if self.salted:  # blocks held before the loop were stored under other salts: never hit here
            while at < len(log) and log[at].arrival_s <= self.start_s:
                at += 1
        out: dict[str, list] = {k: [] for k in ("request_index", "replica_id", "held_tokens")}
        out.update(best_replica=[], best_tokens=[])
        names = [source.name for source in self.sources]
        for sent_s, request, record in sent:
            while at < len(log) and log[at].arrival_s <= sent_s:
                replay.apply(log[at].name, log[at].seq, log[at].batch, 0.0)
                at += 1
            keys = _content_keys(request.token_ids, block_size)
            cap = max_hit_blocks(len(request.token_ids), block_size)
            held = {name: min(replay.replica(name).prefix_length(keys), cap) * block_size for name in names}
            served = record.replica_id if record.replica_id in held or len(names) != 1 else names[0]
            best = max(names, key=lambda name: (held[name], name == served))
            out["request_index"].append(request.index)
            out["replica_id"].append(served)
            out["held_tokens"].append(held.get(served))
            out["best_replica"].append(best)
            out["best_tokens"].append(held[best])
        return out


def _content_keys(token_ids, block_size: int) -> list[int]:
    """A prompt's content keys (:func:`prompt_content_keys`) from its token ids, full blocks only."""
    full = len(token_ids) // block_size * block_size
    return prompt_content_keys(
        [encode_token_ids(token_ids[start : start + block_size]) for start in range(0, full, block_size)]
    )


def record_kv_events(
    targets: Sequence[str],
    stack,
    say: Callable[[str], None],
    metadata: dict[str, Any],
    notes: list[str],
    block_size: int,
    salted: bool = False,
) -> dict[str, Callable]:
    """With ``--kv-events`` targets: a recorder subscribed to every source before the first request,
    writing into ``metadata`` and ``notes`` and stopped by ``stack`` (an ExitStack) however the run
    ends; returns the run plan's ``on_start`` / ``on_end`` hooks (none without targets). ``salted``:
    the run sends its own ``cache_salt``, so blocks held before it are left out of the attribution.

    Raises:
        InputError: a source cannot be found or subscribed to (one line).
    """
    if not targets:
        return {}
    recorder = EventRecorder(targets, metadata, notes, block_size, salted)
    stack.callback(recorder.stop)
    say(f"reading KV events from {', '.join(source.name for source in recorder.sources)}")
    return {"on_start": recorder.mark_start, "on_end": recorder.on_end}


def _server_roots(sources: Sequence[EventSource], targets: Sequence[str]):
    """``(source, server root)`` for each source advertised by an ``http(s)://`` target."""
    roots = {}
    for target in targets:
        name, _, url = target.partition("=") if "=" in target.split("://")[0] else ("", "", target)
        if urlsplit(url).scheme in ("http", "https"):
            roots[name or urlsplit(url).netloc] = url.rstrip("/").removesuffix("/v1")
    return [(source, roots[source.name]) for source in sources if source.name in roots]


def _kv_blocks(root: str) -> dict[str, Any]:
    """kvbench serve's ``GET /kv_blocks`` (``{}`` from a server without it)."""
    try:
        with urllib.request.urlopen(f"{root}/kv_blocks", timeout=5.0) as response:
            body = json.loads(response.read())
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _bytes_per_block(roots) -> int | None:
    """The KV bytes of one block, from the first kvbench serve that says (``None``: none does)."""
    for root in roots:
        if isinstance(size := _kv_blocks(root).get("bytes_per_block"), int):
            return size
    return None


def summary_lines(report: dict[str, Any], say: Callable[[str], None]) -> None:
    """The run's closing lines about the events: the duplication, the gaps, the routing's loss."""
    held = ", ".join(f"{r['name']} {sum(r['blocks'].values())}" for r in report["replicas"])
    size = report["redundant_bytes"]
    bytes_text = "" if size is None else f", {size / 2**20:.1f} MiB"
    if len(report["replicas"]) < 2:
        say(f"KV events: blocks held {held or 'none'}")
    else:
        say(
            f"KV events: blocks held {held}; {report['num_duplicated_blocks']} held on two or more "
            f"replicas ({report['num_redundant_copies']} copies beyond the first{bytes_text})"
        )
    if report.get("silent"):
        say(
            f"KV events: nothing heard from {', '.join(report['silent'])} "
            "(no batch: is it publishing there? a bare tcp:// source without ,replay= misses what it "
            "sent before kvbench subscribed)"
        )
    for replica in report["replicas"]:
        if replica["num_gaps"]:
            say(
                f"KV events from {replica['name']}: {replica['num_gaps']} gaps, "
                f"{replica['num_replayed_batches']} batches replayed, {replica['num_lost_batches']} lost"
            )
    requests = report["requests"]
    missed = [
        (best - (held or 0))
        for held, best in zip(requests["held_tokens"], requests["best_tokens"])
        if best > (held or 0)
    ]
    if missed:
        say(
            f"KV events: {len(missed)} of {len(requests['best_tokens'])} requests went to a replica "
            f"holding less of their prompt than another did ({sum(missed)} tokens held elsewhere)"
        )
