"""The kv_events comparison of ``kvbench peer vllm`` (``kvbench/peer/vllm_events.py``): vLLM's KV events
against kvbench's pool simulator, block for block.

The live check runs only where vLLM's virtual environment exists (``kvbench peer vllm`` creates it);
the simulator's side of it, its events turned into a block map, and the report's lines run everywhere."""

import pyarrow.parquet as pq
import pytest

from kvbench.commands.peer import DEFAULT_VENV
from kvbench.events.blockmap import ReplicaBlocks
from kvbench.events.publisher import EventPublisher, PublisherConfig
from kvbench.events.source import EventListener
from kvbench.events.wire import Batch, BlockStored, decode_batch, encode_batch
from kvbench.peer.comparisons import EVENTS_POOL, KV_EVENTS, kv_events_comparison, prepare
from kvbench.peer.config import PeerConfig
from kvbench.peer.report import markdown
from kvbench.peer.server import has_vllm
from kvbench.peer.vllm_events import BlockMapCheck, Checkpoint, KvEventsSummary, MapCounts, events_markdown
from kvbench.request import RequestRecord, Status
from kvbench.results.parquet import read_metadata
from kvbench.sim.vllm_pool import VllmPoolConfig, VllmSimulator
from kvbench.workloads.tokenizer import TiktokenTokenizer

BLOCK_SIZE = 32
POOL_BLOCKS = 40  # the small pool's default (--small-pool-blocks)


def test_the_simulators_events_build_the_map_of_its_pool():
    prepared = prepare(kv_events_comparison(30), TiktokenTokenizer(), "salt")
    assert prepared.comparison.pool == EVENTS_POOL
    assert all(len(r.token_ids) == 301 and r.max_tokens == 20 for r in prepared.requests)  # 10 blocks each
    simulator = VllmSimulator(VllmPoolConfig(POOL_BLOCKS, BLOCK_SIZE))
    blocks, events = ReplicaBlocks("kvbench"), []
    simulator.index.listener = EventListener(events.append, BLOCK_SIZE)
    for seq, request in enumerate(prepared.requests):
        outputs = [7 + request.index] * request.output_tokens  # stand-ins for vLLM's output ids
        simulator.run(request, outputs)
        blocks.apply(seq, decode_batch(encode_batch(0.0, events)), 0.0)  # through the wire format
        events.clear()
        assert sum(blocks.content_counts().values()) == simulator.pool.num_cached_blocks
    assert blocks.num_removed_blocks > 0  # the small pool evicts
    assert blocks.num_stored_blocks - blocks.num_removed_blocks == simulator.pool.num_cached_blocks
    assert blocks.num_orphan_blocks == 0


def test_content_keys_ignore_the_servers_hashes():
    a, b = ReplicaBlocks("a"), ReplicaBlocks("b")
    tokens = tuple(range(2 * BLOCK_SIZE))
    a.apply(0, Batch(0.0, (BlockStored((1, 2), None, tokens, BLOCK_SIZE),)), 0.0)
    b.apply(0, Batch(0.0, (BlockStored((98,), None, tokens[:BLOCK_SIZE], BLOCK_SIZE),)), 0.0)
    b.apply(1, Batch(0.0, (BlockStored((99,), 98, tokens[BLOCK_SIZE:], BLOCK_SIZE),)), 0.0)
    assert a.content_counts() == b.content_counts() and sum(a.content_counts().values()) == 2


def check_against_a_publishing_pool(tmp_path, server_blocks: int, num_requests: int = 12):
    """BlockMapCheck (40 blocks) subscribed to a real ZMQ publisher in vLLM's wire format whose events
    come from a second pool simulator of ``server_blocks`` blocks, standing where vLLM stands."""
    prepared = prepare(kv_events_comparison(num_requests), TiktokenTokenizer(), "salt")
    publisher = EventPublisher(PublisherConfig(f"ipc://{tmp_path}/events", "tcp://127.0.0.1:0"))
    server = VllmSimulator(VllmPoolConfig(server_blocks, BLOCK_SIZE))
    server.index.listener = EventListener(publisher.publish, BLOCK_SIZE)
    endpoints = (publisher.endpoint, publisher.replay_endpoint)
    try:
        with BlockMapCheck(endpoints, POOL_BLOCKS, BLOCK_SIZE) as check:
            for request in prepared.requests:
                outputs = tuple([7 + request.index] * request.output_tokens)
                server.run(request, outputs)
                record = RequestRecord(Status.OK, len(request.token_ids), output_token_ids=outputs)
                check.checkpoint(request, record)
            return check.summary("kv_events"), check.row_columns()
    finally:
        publisher.close()


def test_the_check_reads_a_publishers_events_and_finds_equal_maps(tmp_path):
    summary, columns = check_against_a_publishing_pool(tmp_path, POOL_BLOCKS)
    assert len(summary.checkpoints) == 12 and summary.num_mismatched == 0 and summary.disagreements() == ()
    assert summary.vllm.blocks_removed > 0 and summary.vllm.gaps == 0 and summary.vllm.orphan_blocks == 0
    assert summary.vllm.blocks_stored == summary.kvbench.blocks_stored
    assert summary.vllm.blocks_held == summary.kvbench.blocks_held == POOL_BLOCKS - 1
    assert all(c["block_maps_match"] for c in columns.values()) and summary.vllm.batches > 0


def test_a_server_with_another_pool_shows_the_first_checkpoint_that_differs(tmp_path):
    summary, columns = check_against_a_publishing_pool(tmp_path, POOL_BLOCKS - 10)
    first = summary.first_mismatch
    assert first is not None and summary.num_mismatched > 0
    assert (
        first.vllm_blocks_held == POOL_BLOCKS - 11 < first.kvbench_blocks_held
    )  # the smaller pool evicted first
    assert all(c["block_maps_match"] for i, c in columns.items() if i < first.request_index)
    assert columns[first.request_index]["block_maps_match"] is False
    [line] = summary.disagreements()
    assert line.startswith(f"block maps differ after request {first.request_index} ({first.request_id})")


def test_kv_events_is_chosen_only_by_name():
    assert KV_EVENTS not in PeerConfig("out", "venv").comparisons
    assert PeerConfig("out", "venv", comparisons=(KV_EVENTS,), kv_events_requests=5).kv_events_requests == 5
    with pytest.raises(ValueError, match="kv-events-requests"):
        PeerConfig("out", "venv", comparisons=(KV_EVENTS,), kv_events_requests=0)


def test_a_mismatched_checkpoint_is_a_disagreement_naming_the_first():
    checkpoints = (
        Checkpoint(0, "r0", 10, 10, 0, 0),
        Checkpoint(1, "r1", 20, 19, 2, 1),
        Checkpoint(2, "r2", 30, 30, 1, 1),
    )
    summary = KvEventsSummary(
        KV_EVENTS, 40, 32, checkpoints, MapCounts(30, 0, 30, 3, 0, 0, 1, 0), MapCounts(30, 0, 30)
    )
    assert summary.num_mismatched == 2 and summary.first_mismatch.request_id == "r1"
    [line] = summary.disagreements()
    assert "after request 1 (r1)" in line and "2 block(s) kvbench does not" in line and "2 of 3" in line
    text = markdown([], [], {}, events_markdown([summary]))
    assert "3 checkpoints" in text and "2 mismatched; first: block maps differ after request 1" in text
    assert "| vLLM (its events) | 30 | 0 | 30 | 3 | 0 | 0 | 0 |" in text
    assert "| kvbench (vllm_pool simulator) | 30 | 0 | 30 | - | - | - | - |" in text


@pytest.mark.skipif(not has_vllm(DEFAULT_VENV), reason=f"no vLLM in {DEFAULT_VENV} (kvbench peer vllm)")
def test_vllms_events_equal_the_prediction_after_every_request(kvbench, tmp_path):
    """``kvbench peer vllm --only kv_events`` on a real vLLM CPU (~2-3 minutes on 2 cores)."""
    out = tmp_path / "peer"
    code, stdout, stderr = kvbench(
        "peer", "vllm", "--only", "kv_events", "--kv-events-requests", 16, "--skip-install", "--out", out
    )
    assert code == 0, stdout + stderr
    metadata = read_metadata(out / "peer_vllm.parquet")
    [events] = metadata["kv_events"]
    assert events["num_checkpoints"] == 16 and events["num_mismatched"] == 0, events["first_mismatch"]
    vllm, predicted = events["vllm"], events["kvbench"]
    assert vllm["blocks_removed"] > 0 and vllm["gaps"] == 0 and vllm["orphan_blocks"] == 0
    assert vllm["blocks_held"] == predicted["blocks_held"] == POOL_BLOCKS - 1  # the pool is full
    assert vllm["blocks_stored"] == predicted["blocks_stored"] > vllm["blocks_held"]
    assert vllm["blocks_removed"] == predicted["blocks_removed"] and vllm["batches"] > 0
    [summary] = metadata["summaries"]
    assert summary["name"] == KV_EVENTS and summary["num_exact"] == 16 and summary["disagreements"] == []
    rows = pq.read_table(out / "peer_vllm.parquet").to_pylist()
    assert len(rows) == 16 and all(row["block_maps_match"] for row in rows)
    assert rows[-1]["blocks_held_vllm"] == rows[-1]["blocks_held_kvbench"] == POOL_BLOCKS - 1
    assert "## KV events: vLLM's block map vs kvbench's (kv_events)" in (out / "peer_vllm.md").read_text()
