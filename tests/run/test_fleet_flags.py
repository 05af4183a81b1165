"""The fleet flags of ``kvbench run --backend openai``: parsed once, refused with one line naming the
flag, and what a real HTTP request then carries (headers and body, as a loopback server saw them)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from kvbench.backends.openai.client import OpenAIBackend, OpenAIConfig
from kvbench.request import Request
from kvbench.run.config import ServerFlags
from kvbench.run.fleet_flags import parse_extra_body, parse_headers, session_header, shaped
from kvbench.workloads.tokenizer import load_tokenizer


def test_flags_parse():
    assert session_header(None) == "X-Session-ID" and session_header("none") is None
    assert session_header("x-user-id") == "x-user-id"
    assert parse_headers(("x-smg-routing-key: a:b", "X-T:1")) == {"x-smg-routing-key": "a:b", "X-T": "1"}
    assert parse_extra_body('{"priority": 2}') == {"priority": 2}


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        ({"header": ("no-colon",)}, "--header"),
        ({"header": ("bad name:1",)}, "--header"),
        ({"header": ("X-A:\x01",)}, "--header"),
        ({"session_header": "a b"}, "--session-header"),
        ({"extra_body": "[1]"}, "--extra-body"),
        ({"extra_body": "{"}, "--extra-body"),
        ({"extra_body": '{"stream": false}'}, "--extra-body: stream"),
        ({"replica_metrics": ("127.0.0.1:8001",)}, "--replica-metrics"),
        ({"replica_metrics": ("http://a:1", "http://a:1/")}, "--replica-metrics"),
    ],
)
def test_bad_flags_name_the_flag(flags, needle):
    with pytest.raises(ValueError, match=needle):
        ServerFlags(**flags)


def test_a_bad_header_is_one_line_and_exit_2(kvbench, tmp_path):
    code, _, stderr = kvbench("run", "scenarios/chat.toml", "--backend", "openai", "--header", "nope")
    assert code == 2 and "--header 'nope'" in stderr and len(stderr.strip().splitlines()) == 1


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append((self.headers, body))  # case-insensitive names
        events = [
            {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "length"}]},
            {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}},
        ]
        data = "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("X-Kvbench-Replica", "r-9")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def recorder():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def serve_one(url, flags: ServerFlags):
    import asyncio

    config = shaped(OpenAIConfig(url, "m"), flags)
    request = Request(0, "r0", "chat-7", 0, np.arange(3, dtype=np.uint32), 0.0, 1, prompt="hello")

    async def go():
        async with OpenAIBackend(config, load_tokenizer()) as backend:
            return await backend.serve(request)

    return asyncio.run(go())


def test_the_session_header_user_and_extra_fields_reach_the_server(recorder):
    url = f"http://127.0.0.1:{recorder.server_address[1]}/v1"
    record = serve_one(url, ServerFlags(header=("X-Tenant: t1",), extra_body='{"priority": 2}'))
    headers, body = recorder.seen[-1]
    assert record.ok and record.replica_id == "r-9"
    assert headers["X-Session-ID"] == "chat-7" and headers["X-Tenant"] == "t1"
    assert body["user"] == "chat-7" and body["priority"] == 2

    serve_one(url, ServerFlags(session_header="none", extra_body='{"user": "me"}'))
    headers, body = recorder.seen[-1]
    assert headers.get("X-Session-ID") is None and body["user"] == "me"
