"""How much does kvbench's own client add to TTFT and ITL, and how many requests/s does it sustain?

    PYTHONPATH=. python benchmarks/client_bench.py [--requests 200] [--tokens 32] [--itl-ms 2]

A fake OpenAI server (a separate process, asyncio on raw sockets, no framework) answers every
streamed ``/v1/completions`` request at once: the first token immediately, then one token every
``--itl-ms`` ms, then the usage chunk. Against it, at each concurrency, run

* a bare client: asyncio streams, one HTTP/1.1 keep-alive connection per concurrent stream, a
  timestamp per SSE line (the floor: what any client pays for loopback HTTP and the event loop);
* the SDK's transport alone (its request, the body's bytes read, nothing parsed): the floor of any
  client that keeps the SDK's request, headers and errors;
* kvbench's ``OpenAIBackend`` alone (``client=lean`` and ``sdk``), in this process: the client's own
  cost, with its CPU time per request (``time.process_time``, so a loaded machine changes it little);
* ``kvbench run --backend openai --client lean`` (the default) and ``--client sdk`` on the same
  prompts: the request through the openai SDK over httpx2 either way, the body read as raw
  server-sent events (lean) or as the SDK's pydantic chunks (sdk); the send loop, the live progress
  line, checkpoints, the row per request.

The server's own TTFT is ~0 and its ITL exactly ``--itl-ms``, so a client's TTFT p50 is its
overhead and ``ITL p50 - itl_ms`` its per-chunk overhead. Requests/s counts the send loop's span
(first sent to last ended), startup excluded. "Streams at pace" is requests/s times the server's own
time per request (``(tokens - 1) * itl``): how many of the concurrent streams the client keeps at the
server's pace (at most the concurrency). With two or more usable cores, every client runs pinned to
one core and the server to another (``--no-pin`` to turn that off). Medians in ms; one run, so
compare columns, not runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
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
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(payload), payload)
            )
            await writer.drain()
            continue
        prompt = json.loads(body).get("prompt") or []
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for index in range(tokens):
            last = index == tokens - 1
            chunk = {
                "id": "x",
                "object": "text_completion",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "text": " a", "finish_reason": "length" if last else None}],
            }
            _write_event(writer, chunk)
            await writer.drain()
            if itl_s and not last:
                await asyncio.sleep(itl_s)
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": tokens,
            "total_tokens": len(prompt) + tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        _write_event(
            writer,
            {
                "id": "x",
                "object": "text_completion",
                "created": 0,
                "model": "m",
                "choices": [],
                "usage": usage,
            },
        )
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
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
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
            body = json.dumps(
                {"model": "m", "prompt": queue.pop(), "max_tokens": tokens, "stream": True}
            ).encode()
            await _bare_one(port, body, connection, times)
        connection[1].close()

    started, cpu_started = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    span, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    ttft = [(arrivals[0] - sent) * 1e3 for sent, arrivals in times]
    itl = [(b - a) * 1e3 for _, arrivals in times for a, b in zip(arrivals, arrivals[1:])]
    return {
        "ttft": statistics.median(ttft),
        "itl": statistics.median(itl),
        "rps": len(times) / span,
        "cpu_ms": cpu_s / len(times) * 1e3,
    }


async def _transport(port: int, requests: list, concurrency: int) -> dict:
    """The floor of any client on the SDK's transport: the openai SDK's request (``with_streaming_response``,
    httpx2 over httpcore2 and anyio) and its body's bytes read, nothing parsed; TTFT and ITL not taken."""
    import openai

    times: list[float] = []
    async with openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", max_retries=0
    ) as client:

        async def one(request):
            async with client.completions.with_streaming_response.create(
                model="m",
                prompt="",
                max_tokens=request.max_tokens,
                stream=True,
                extra_body={"prompt": request.token_ids.tolist()},
            ) as response:
                async for _ in response.iter_bytes():
                    pass

        await one(requests[0])
        queue = list(reversed(requests))

        async def worker():
            while queue:
                await one(queue.pop())
                times.append(time.perf_counter())

        started, cpu_started = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        span, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    return {"ttft": None, "itl": None, "rps": len(times) / span, "cpu_ms": cpu_s / len(times) * 1e3}


async def _backend(port: int, requests: list, concurrency: int, client: str) -> dict:
    """kvbench's ``OpenAIBackend`` alone (no send loop, no CLI), ``concurrency`` workers over ``requests``."""
    from kvbench.backends.openai.client import OpenAIBackend, OpenAIConfig
    from kvbench.workloads.tokenizer import load_tokenizer

    config = OpenAIConfig(f"http://127.0.0.1:{port}/v1", "m", ignore_eos=False, client=client)
    async with OpenAIBackend(config, load_tokenizer()) as backend:
        await backend.serve(requests[0])  # a connection and the SDK's first-call costs, outside the timing
        queue, records = list(reversed(requests)), []

        async def worker():
            while queue:
                records.append(await backend.serve(queue.pop()))

        started, cpu_started = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        span, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    assert all(r.status == "ok" for r in records), records[0].error
    return {
        "ttft": statistics.median(r.ttft_ms for r in records),
        "itl": statistics.median(x for r in records for x in r.itl_ms),
        "rps": len(records) / span,
        "cpu_ms": cpu_s / len(records) * 1e3,
    }


def _kvbench(port: int, num_requests: int, concurrency: int, tokens: int, client: str) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "run.parquet"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "kvbench.cli",
                "run",
                "scenarios/multi_prefix_zipf.toml",
                "--backend",
                "openai",
                "--base-url",
                f"http://127.0.0.1:{port}/v1",
                "--model",
                "m",
                "--requests",
                str(num_requests),
                "--concurrency",
                str(concurrency),
                "--max-tokens",
                str(tokens),
                "--hygiene",
                "off",
                "--client",
                client,
                "--out",
                str(out),
            ],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        rows = [r for r in pq.read_table(out).to_pylist() if r["status"] == "ok"]
    span_s = max(r["sent_ms"] + r["e2e_ms"] for r in rows) / 1e3 - min(r["sent_ms"] for r in rows) / 1e3
    return {
        "ttft": statistics.median(r["ttft_ms"] for r in rows),
        "itl": statistics.median(x for r in rows for x in r["itl_ms"]),
        "rps": len(rows) / span_s,
        "cpu_ms": None,
    }


def main() -> None:
    args = _parse_args()
    if args.serve:
        asyncio.run(_serve(args.port, args.tokens, args.itl_ms / 1e3))
        return
    requests = _load_requests(args.requests, args.tokens)
    prompts = [[int(t) for t in r.token_ids] for r in requests]
    cores = sorted(os.sched_getaffinity(0))
    pin = not args.no_pin and len(cores) >= 2
    server = _start_server(args.tokens, args.itl_ms, cores[-1] if pin else None)
    if pin:
        os.sched_setaffinity(0, {cores[0]})  # this process and the kvbench runs it starts
    server_s = (args.tokens - 1) * args.itl_ms / 1e3
    try:
        port = int(server.stdout.readline())
        _print_header(
            args, len(prompts[0]), f"core {cores[0]}, server on core {cores[-1]}" if pin else "any core"
        )
        clients = args.clients.split(",")
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            runs = _runs(port, args, prompts, requests, concurrency, clients)
            for name, run in runs.items():
                _print_row(concurrency, name, run(), args.itl_ms, server_s)
    finally:
        server.terminate()


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--itl-ms", type=float, default=2.0)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--clients", default="lean,sdk", help="kvbench's --client values to run")
    parser.add_argument(
        "--no-pin", action="store_true", help="do not pin the clients and the server to cores"
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args()


def _load_requests(num_requests: int, tokens: int) -> list:
    """The first ``num_requests`` of the multi-prefix Zipf scenario, each for ``tokens`` output tokens."""
    from kvbench.run.scenario import load_scenario

    return [
        replace(r, max_tokens=tokens)
        for r in load_scenario(REPO / "scenarios" / "multi_prefix_zipf.toml")
        .workload_requests()
        .requests[:num_requests]
    ]


def _start_server(tokens: int, itl_ms: float, core: int | None) -> subprocess.Popen:
    """The fake server in a process of its own (this script with ``--serve``), pinned to ``core`` if
    given; it prints its port as its first line."""
    return subprocess.Popen(
        [sys.executable, __file__, "--serve", "--tokens", str(tokens), "--itl-ms", str(itl_ms)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, {core})) if core is not None else None,
    )


def _print_header(args: argparse.Namespace, num_prompt_tokens: int, where: str) -> None:
    print(
        f"fake server: {args.tokens} tokens, ITL {args.itl_ms} ms; {args.requests} requests of "
        f"{num_prompt_tokens:,} prompt tokens; clients on " + where + "; medians"
    )
    print(
        "| concurrency | client | TTFT p50 ms | ITL p50 ms | ITL - server ms | requests/s | streams at "
        "pace "
        "| client CPU ms/request |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|")


def _runs(
    port: int, args: argparse.Namespace, prompts: list, requests: list, concurrency: int, clients: list[str]
) -> dict:
    """Every client to measure at ``concurrency``, by its name in the table, in the table's order."""
    runs = {"bare asyncio": lambda: asyncio.run(_bare(port, prompts, concurrency, args.tokens))}
    runs["SDK transport, bytes only"] = lambda: asyncio.run(_transport(port, requests, concurrency))
    runs.update(
        {
            f"OpenAIBackend {client}": lambda client=client: asyncio.run(
                _backend(port, requests, concurrency, client)
            )
            for client in clients
        }
    )
    runs.update(
        {
            f"kvbench run --client {client}": lambda client=client: _kvbench(
                port, args.requests, concurrency, args.tokens, client
            )
            for client in clients
        }
    )
    return runs


def _print_row(concurrency: int, name: str, result: dict, itl_ms: float, server_s: float) -> None:
    """One table row: medians in ms, ``-`` where a client does not measure it."""
    cpu, ttft, itl, over = (
        ("-" if value is None else f"{value:.2f}")
        for value in (
            result["cpu_ms"],
            result["ttft"],
            result["itl"],
            None if result["itl"] is None else result["itl"] - itl_ms,
        )
    )
    print(
        f"| {concurrency} | {name} | {ttft} | {itl} | {over} | {result['rps']:.1f} | "
        f"{result['rps'] * server_s:.1f} | {cpu} |",
        flush=True,
    )


if __name__ == "__main__":
    main()
