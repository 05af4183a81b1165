"""How much does kvbench's own client add to TTFT and ITL, and how many requests/s does it sustain?

    PYTHONPATH=. python benchmarks/client_bench.py [--requests 200] [--tokens 32] [--itl-ms 2]

A fake OpenAI server (a separate process, asyncio on raw sockets, no framework) answers every
streamed ``/v1/completions`` request at once: the first token immediately, then one token every
``--itl-ms`` ms, then the usage chunk. Against it, at each concurrency, run

* a bare client: asyncio streams, one HTTP/1.1 keep-alive connection per concurrent stream, a
  timestamp per SSE line (the floor: what any client pays for loopback HTTP and the event loop);
* ``kvbench run --backend openai --client lean`` (the default) and ``--client sdk`` on the same
  prompts: the request through the openai SDK over httpx2 either way, the body read as raw
  server-sent events (lean) or as the SDK's pydantic chunks (sdk); the send loop, the live progress
  line, checkpoints, the row per request.

The server's own TTFT is ~0 and its ITL exactly ``--itl-ms``, so a client's TTFT p50 is its
overhead and ``ITL p50 - itl_ms`` its per-chunk overhead. Requests/s counts the send loop's span
(first sent to last ended), startup excluded. Medians in ms; one run, so compare columns, not runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]


async def _serve_connection(reader, writer, tokens: int, itl_s: float) -> None:
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        body = await reader.readexactly(int(headers.get("content-length", 0)))
        if lines[0].startswith("GET"):
            payload = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(payload), payload))
            await writer.drain()
            continue
        prompt = json.loads(body).get("prompt") or []
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for index in range(tokens):
            last = index == tokens - 1
            chunk = {"id": "x", "object": "text_completion", "created": 0, "model": "m",
                     "choices": [{"index": 0, "text": " a", "finish_reason": "length" if last else None}]}
            _write_event(writer, chunk)
            await writer.drain()
            if itl_s and not last:
                await asyncio.sleep(itl_s)
        usage = {"prompt_tokens": len(prompt), "completion_tokens": tokens, "total_tokens": len(prompt) + tokens,
                 "prompt_tokens_details": {"cached_tokens": 0}}
        _write_event(writer, {"id": "x", "object": "text_completion", "created": 0, "model": "m", "choices": [],
                              "usage": usage})
        data = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        await writer.drain()


def _write_event(writer, body: dict) -> None:
    data = b"data: " + json.dumps(body).encode() + b"\n\n"
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))


async def _serve(port: int, tokens: int, itl_s: float) -> None:
    async def handle(reader, writer):
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await _serve_connection(reader, writer, tokens, itl_s)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


async def _bare_one(port: int, body: bytes, connection, times: list) -> None:
    reader, writer = connection
    sent = time.perf_counter()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    await reader.readuntil(b"\r\n\r\n")
    arrivals = []
    while True:
        size = int((await reader.readline()).strip(), 16)
        if size == 0:
            await reader.readline()
            break
        data = await reader.readexactly(size + 2)
        if b'"text"' in data:
            arrivals.append(time.perf_counter())
    times.append((sent, arrivals))


async def _bare(port: int, prompts: list[list[int]], concurrency: int, tokens: int) -> dict:
    queue = list(reversed(prompts))
    times: list = []

    async def worker():
        connection = await asyncio.open_connection("127.0.0.1", port)
        while queue:
            body = json.dumps({"model": "m", "prompt": queue.pop(), "max_tokens": tokens, "stream": True}).encode()
            await _bare_one(port, body, connection, times)
        connection[1].close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    span = time.perf_counter() - started
    ttft = [(arrivals[0] - sent) * 1e3 for sent, arrivals in times]
    itl = [(b - a) * 1e3 for _, arrivals in times for a, b in zip(arrivals, arrivals[1:])]
    return {"ttft": statistics.median(ttft), "itl": statistics.median(itl), "rps": len(times) / span}


def _kvbench(port: int, num_requests: int, concurrency: int, tokens: int, client: str) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "run.parquet"
        subprocess.run([sys.executable, "-m", "kvbench.cli", "run", "scenarios/multi_prefix_zipf.toml", "--backend",
                        "openai", "--base-url", f"http://127.0.0.1:{port}/v1", "--model", "m", "--requests",
                        str(num_requests), "--concurrency", str(concurrency), "--max-tokens", str(tokens),
                        "--hygiene", "off", "--client", client, "--out", str(out)], cwd=REPO, check=True,
                       capture_output=True)
        rows = [r for r in pq.read_table(out).to_pylist() if r["status"] == "ok"]
    span_s = max(r["sent_ms"] + r["e2e_ms"] for r in rows) / 1e3 - min(r["sent_ms"] for r in rows) / 1e3
    return {"ttft": statistics.median(r["ttft_ms"] for r in rows),
            "itl": statistics.median(x for r in rows for x in r["itl_ms"]), "rps": len(rows) / span_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--itl-ms", type=float, default=2.0)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--clients", default="lean,sdk", help="kvbench's --client values to run")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.port, args.tokens, args.itl_ms / 1e3))
        return
    from kvbench.run.scenario import load_scenario

    requests = load_scenario(REPO / "scenarios" / "multi_prefix_zipf.toml").workload_requests().requests
    prompts = [[int(t) for t in r.token_ids] for r in requests[: args.requests]]
    server = subprocess.Popen([sys.executable, __file__, "--serve", "--tokens", str(args.tokens), "--itl-ms",
                               str(args.itl_ms)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        print(f"fake server: {args.tokens} tokens, ITL {args.itl_ms} ms; {args.requests} requests of "
              f"{len(prompts[0]):,} prompt tokens; medians")
        print("| concurrency | client | TTFT p50 ms | ITL p50 ms | ITL overhead ms | requests/s |")
        print("|---:|---|---:|---:|---:|---:|")
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            runs = {"bare asyncio": lambda: asyncio.run(_bare(port, prompts, concurrency, args.tokens))}
            runs.update({f"kvbench --client {client}": lambda client=client: _kvbench(
                port, args.requests, concurrency, args.tokens, client) for client in args.clients.split(",")})
            for name, run in runs.items():
                result = run()
                print(f"| {concurrency} | {name} | {result['ttft']:.2f} | {result['itl']:.2f} | "
                      f"{result['itl'] - args.itl_ms:.2f} | {result['rps']:.1f} |", flush=True)
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
