"""benchmarks/vllm_kv_events.py: vLLM's KV events against kvbench's pool simulator, block for block.

The live check runs only where vLLM's virtual environment exists (``kvbench peer vllm`` creates it);
the simulator's side of it, its events turned into a block map, runs everywhere."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from vllm_kv_events import BLOCK_SIZE, DEFAULT_VENV, POOL_BLOCKS, comparison, run_check  # noqa: E402

from kvbench.events.blockmap import ReplicaBlocks  # noqa: E402
from kvbench.events.source import EventListener  # noqa: E402
from kvbench.events.wire import Batch, BlockStored, decode_batch, encode_batch  # noqa: E402
from kvbench.peer.comparisons import prepare  # noqa: E402
from kvbench.peer.server import has_vllm  # noqa: E402
from kvbench.sim.vllm_pool import VllmPoolConfig, VllmSimulator  # noqa: E402
from kvbench.workloads.tokenizer import TiktokenTokenizer  # noqa: E402


def test_the_simulators_events_build_the_map_of_its_pool():
    prepared = prepare(comparison(30), TiktokenTokenizer(), "salt")
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


@pytest.mark.skipif(not has_vllm(DEFAULT_VENV), reason=f"no vLLM in {DEFAULT_VENV} (kvbench peer vllm)")
def test_vllms_events_equal_the_prediction_after_every_request(tmp_path):
    numbers = run_check(DEFAULT_VENV, tmp_path, num_requests=20, log=lambda line: None)
    assert numbers["mismatched_checkpoints"] == 0, numbers["first_mismatches"]
    assert numbers["vllm_blocks_removed"] > 0 and numbers["vllm_gaps"] == 0
    assert numbers["vllm_blocks_held"] == numbers["kvbench_blocks_held"] > 0
    assert numbers["vllm_blocks_stored"] == numbers["kvbench_blocks_stored"]
