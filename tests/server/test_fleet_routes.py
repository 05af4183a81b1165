"""``kvbench serve`` as one replica of a fleet: the replica header on every response, the metadata
routes sglang-router probes, vLLM's render routes vllm-router calls, and ``/flush_cache``."""

import http.client
import json
import urllib.request

import pytest
from live_server import MODEL, LiveServer, tiny_service

from kvbench.server.fleet import REPLICA_HEADER, check_replica_id
from kvbench.server.guards import GuardConfig

PROMPT_IDS = list(range(3000, 3040))  # 40 tokens: 2 whole blocks may hit
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "name a colour"}]


@pytest.fixture(scope="module")
def replica(tiny_loaded):
    server = LiveServer(tiny_service(tiny_loaded), replica_id="replica-a")
    yield server
    server.stop()


def exchange(server, method, path, body=None, headers=None):
    """``(status, headers, body bytes)`` of one request on a fresh connection."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    payload = None if body is None else json.dumps(body)
    sent_headers = {"Content-Type": "application/json", **(headers or {})} if payload else dict(headers or {})
    connection.request(method, path, payload, sent_headers)
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, response.headers, data


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/health", None),
        ("GET", "/v1/models", None),
        ("GET", "/metrics", None),
        ("GET", "/no-such-route", None),
        ("POST", "/v1/completions", {"model": MODEL, "prompt": PROMPT_IDS, "max_tokens": 2}),
        ("POST", "/v1/completions", {"model": MODEL, "prompt": PROMPT_IDS, "max_tokens": 2, "stream": True}),
        ("POST", "/v1/chat/completions", {"model": "other", "messages": MESSAGES}),
        ("POST", "/v1/completions", {"model": MODEL, "prompt": PROMPT_IDS, "max_tokens": 0}),
    ],
)
def test_every_response_names_the_replica(replica, method, path, body):
    status, headers, _ = exchange(replica, method, path, body)
    assert status in (200, 400, 404)
    assert headers[REPLICA_HEADER] == "replica-a"


def test_a_guard_refusal_names_the_replica_too(tiny_loaded):
    server = LiveServer(
        tiny_service(tiny_loaded), GuardConfig.for_bind("127.0.0.1", api_key="k3y"), replica_id="guarded"
    )
    try:
        status, headers, _ = exchange(server, "GET", "/v1/models")
        assert (status, headers[REPLICA_HEADER]) == (401, "guarded")
    finally:
        server.stop()


def test_no_replica_id_no_header(tiny_loaded):
    server = LiveServer(tiny_service(tiny_loaded))
    try:
        _, headers, _ = exchange(server, "GET", "/health")
        assert REPLICA_HEADER not in headers
    finally:
        server.stop()


@pytest.mark.parametrize("path", ["/server_info", "/get_server_info"])
def test_server_info_gives_sglang_router_the_model_name(replica, path):
    status, _, data = exchange(replica, "GET", path)
    info = json.loads(data)
    assert status == 200
    assert info["served_model_name"] == info["model_path"] == MODEL
    assert (info["tp_size"], info["dp_size"], info["page_size"]) == (1, 1, 16)
    assert info["kvbench_replica_id"] == "replica-a" and info["disable_radix_cache"] is False


@pytest.mark.parametrize("path", ["/model_info", "/get_model_info"])
def test_model_info_has_sglangs_shape(replica, path):
    status, _, data = exchange(replica, "GET", path)
    info = json.loads(data)
    assert status == 200 and info["model_path"] == MODEL and info["is_generation"] is True
    assert info["model_type"] == "llama" and info["architectures"] == ["LlamaForCausalLM"]


def test_render_gives_the_ids_a_generation_prefills(replica):
    _, tokenized = replica.post("/tokenize", {"model": MODEL, "messages": MESSAGES})
    status, rendered = replica.post(
        "/v1/chat/completions/render", {"model": MODEL, "messages": MESSAGES, "max_tokens": 5}
    )
    assert status == 200 and rendered["token_ids"] == tokenized["tokens"]
    assert rendered["model"] == MODEL and rendered["sampling_params"]["max_tokens"] == 5

    status, rendered = replica.post(
        "/v1/completions/render", {"model": MODEL, "prompt": PROMPT_IDS, "cache_salt": "t1"}
    )
    assert status == 200 and len(rendered) == 1
    assert rendered[0]["token_ids"] == PROMPT_IDS and rendered[0]["cache_salt"] == "t1"


def test_render_refuses_another_model(replica):
    status, body = replica.post("/v1/chat/completions/render", {"model": "other", "messages": MESSAGES})
    assert status == 404 and body["error"]["code"] == "model_not_found"


def cached_tokens(server):
    _, body = server.post("/v1/completions", {"model": MODEL, "prompt": PROMPT_IDS, "max_tokens": 1})
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_flush_cache_empties_the_cache_as_sglang_answers(replica, method):
    cached_tokens(replica)
    assert cached_tokens(replica) == 32
    status, _, data = exchange(replica, method, "/flush_cache")
    assert status == 200 and data.decode().startswith("Cache flushed.")
    assert cached_tokens(replica) == 0


def test_replica_names_are_checked():
    assert check_replica_id(" r1 ") == "r1"
    for bad in ("", "  ", "caf\u00e9", "a\nb"):
        with pytest.raises(ValueError, match="--replica-id"):
            check_replica_id(bad)


def test_serve_defaults_the_replica_to_host_and_port(serve_session):
    root = serve_session.url.removesuffix("/v1")
    with urllib.request.urlopen(root + "/health", timeout=30) as response:
        assert response.headers[REPLICA_HEADER] == root.removeprefix("http://")


def test_serve_refuses_an_empty_replica_id_before_loading(kvbench):
    code, _, stderr = kvbench("serve", "--port", "0", "--replica-id", " ")
    assert code == 2 and "--replica-id" in stderr and len(stderr.strip().splitlines()) == 1
