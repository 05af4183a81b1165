"""Small HTTP servers on free loopback ports that misbehave on purpose (or follow a script)."""

import json
import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET_KEY = "sk-test-7f3a9c1e5b2d4680aa11bb22cc33dd44"
# A final usage chunk's counts: 999 prompt tokens, 16 of them cached, 3 output tokens.
USAGE = {
    "prompt_tokens": 999,
    "completion_tokens": 3,
    "total_tokens": 1002,
    "prompt_tokens_details": {"cached_tokens": 16},
}


def chunk(text=None, finish_reason=None, usage=None, chat=True):
    """One chat (or completions) stream chunk as a JSON-ready dict."""
    if chat:
        choices = (
            []
            if usage is not None
            else [{"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish_reason}]
        )
        body = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": choices}
    else:
        choices = (
            [] if usage is not None else [{"index": 0, "text": text or "", "finish_reason": finish_reason}]
        )
        body = {"id": "x", "object": "text_completion", "created": 0, "model": "m", "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return body


def with_ids(body, token_ids=None, prompt_ids=None, on_choice=False):
    """A chunk with vLLM's ``return_token_ids`` fields (prompt ids on the chunk, or on its choice)."""
    if token_ids is not None:
        body["choices"][0]["token_ids"] = token_ids
    if prompt_ids is not None:
        (body["choices"][0] if on_choice else body)["prompt_token_ids"] = prompt_ids
    return body


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        if self.path.endswith("/models"):
            model = "unknown" if self.server.behaviour == "unknown_model" else "m"  # as sglang-router lists
            self._json(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        self.server.bodies.append(json.loads(self.rfile.read(length) or b"{}"))
        self.num_posts = getattr(self, "num_posts", 0) + 1  # one handler per connection
        getattr(self, f"_{self.server.behaviour}")()

    def _close_reused(self):  # answers a connection's first request, closes it unanswered on the next
        if self.num_posts > 1:  # (a keep-alive connection the server dropped while the client reused it)
            self.close_connection = True
            return
        self._events(
            [
                chunk("ok"),
                chunk(" go", "length"),
                chunk(usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}),
            ]
        )

    def _json(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _fail(self):  # a 500 whose body repeats the Authorization header, as a careless proxy might
        self._json(500, {"error": {"message": f"boom; you sent {self.headers.get('Authorization')}"}})

    def _start_stream(self, chunked=True):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
        self.end_headers()

    def _send_chunked(self, data: bytes):
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _cut(self):  # two content chunks, then the connection drops inside the chunked body
        self._start_stream()
        for text in ("Hel", "lo"):
            self._send_chunked(f"data: {json.dumps(chunk(text))}\n\n".encode())
        self.wfile.write(b'ff\r\ndata: {"trunc')
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True

    def _eof(self):  # a clean end of body, but before any finish_reason or [DONE]
        self._start_stream(chunked=False)
        self.wfile.write(f"data: {json.dumps(chunk('Hel'))}\n\n".encode())
        self.wfile.flush()
        self.close_connection = True

    def _json_reply(self):  # a whole chat.completion JSON body although the request asked to stream
        self._json(
            200,
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
                ],
            },
        )

    def _reset(self):  # the connection is reset before any response (SO_LINGER 0, as a crashed proxy)
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    def _not_json(self):  # an event whose data is not JSON (a truncated chunk), then a clean end
        self._start_stream()
        self._send_chunked(b'data: {"choices": [\n\n')
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _hang(self):
        self.server.release.wait(30)

    def _script(self):
        self._events(self.server.script)

    def _events(self, events):
        self._start_stream()
        for event in events:
            self._send_chunked(f"data: {json.dumps(event)}\n\n".encode())
        self._send_chunked(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _cached_reply(self, details):
        """A 2-token reply whose usage reports a hit for a prompt seen before, whatever its cache_salt."""

        def key(body):
            return json.dumps(body.get("messages") or body.get("prompt"))

        *earlier, body = self.server.bodies
        seen = any(key(b) == key(body) for b in earlier)
        usage = {"prompt_tokens": 168, "completion_tokens": 2, "total_tokens": 170}
        if details:
            usage["prompt_tokens_details"] = {"cached_tokens": 160 if seen else 0}
        chat = "messages" in body
        self._events(
            [chunk("ok", chat=chat), chunk(" go", "length", chat=chat), chunk(usage=usage, chat=chat)]
        )

    def _saltless(self):  # a prefix cache that ignores cache_salt
        self._cached_reply(details=True)

    def _no_details(self):  # a server that does not report cached_tokens (vLLM without the flag)
        self._cached_reply(details=False)


class FakeServer:
    """``behaviour``: fail (500), cut (stream dropped midway), eof (stream ends early), hang, script,
    saltless (caches across cache_salts), no_details (no cached_tokens in usage),
    json_reply (a plain JSON body to a stream request), reset (connection reset, no response),
    not_json (an event whose data is not JSON), close_reused (a reused keep-alive connection closed
    without an answer)."""

    def __init__(self, behaviour, script=()):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.behaviour, self.httpd.script, self.httpd.bodies = behaviour, list(script), []
        self.httpd.release = threading.Event()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    @property
    def bodies(self):
        return self.httpd.bodies

    def stop(self):
        self.httpd.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
