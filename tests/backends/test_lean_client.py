"""The lean streaming path (raw server-sent events) gives the records and the error lines
of the SDK path, on scripted and misbehaving servers and on a real ``kvbench serve``."""

import dataclasses

import pytest
from cli_and_rows import openai_args
from fake_servers import SECRET_KEY, USAGE, chunk, with_ids
from hypothesis import given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder
from openai_calls import chat_request, ids_request, serve, text_request

from kvbench.backends.openai.admin import list_models
from kvbench.backends.openai.client import OpenAIConfig
from kvbench.backends.openai.client_kind import ClientKind
from kvbench.backends.openai.sse import EventSplitter
from kvbench.request import Status
from kvbench.results.parquet import read_metadata

TIMES = ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms")


def untimed(record):
    """Every field of a record but its times, plus how many ITL gaps it has."""
    fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(record) if f.name not in TIMES}
    return {**fields, "num_itl": len(record.itl_ms), "has_ttft": record.ttft_ms is not None}


def both(url, requests, **config):
    """``(lean records, sdk records)`` of the same requests; the lean path is the default."""
    assert OpenAIConfig(url, "m").client is ClientKind.LEAN
    return serve(url, requests, ClientKind.LEAN, **config), serve(url, requests, ClientKind.SDK, **config)


SCRIPTS = {
    "chat with usage": (
        [chunk("Hel"), chunk("lo there"), chunk("!"), chunk(finish_reason="length"), chunk(usage=USAGE)],
        chat_request(),
    ),
    "no usage": ([chunk("one two three"), chunk(finish_reason="stop")], chat_request()),
    "token ids": (
        [
            with_ids(chunk("Hel"), [7, 8], prompt_ids=[1, 2, 3]),
            with_ids(chunk(), [9]),
            with_ids(chunk(finish_reason="length"), []),
            chunk(usage=USAGE),
        ],
        chat_request(),
    ),
    "completions": (
        [
            with_ids(chunk("a", chat=False), [5], prompt_ids=[4, 4], on_choice=True),
            chunk(" b", chat=False),
            chunk(finish_reason="length", chat=False),
            chunk(usage={**USAGE, "prompt_tokens_details": None}, chat=False),
        ],
        text_request(),
    ),
    "usage without details": (
        [
            chunk("x"),
            chunk(finish_reason="length"),
            chunk(usage={"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}),
        ],
        chat_request(),
    ),
    "error event": (
        [chunk("x"), {"error": {"message": "overloaded", "type": "server_error"}}],
        chat_request(),
    ),
    "error without message": ([chunk("x"), {"error": {"code": 3}}], chat_request()),
    "no finish_reason": ([chunk("x"), chunk(usage=USAGE)], chat_request()),
    "chunk not an object": ([chunk("x"), [1, 2], chunk(finish_reason="stop")], chat_request()),
    "chunk without choices": (
        [{"id": "x", "object": "chat.completion.chunk"}, chunk("x"), chunk(finish_reason="stop")],
        chat_request(),
    ),
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_scripted_streams_give_the_same_records_on_both_paths(fake_server, name):
    events, request = SCRIPTS[name]
    lean, sdk = both(fake_server("script", events).url, [request], extra_body={"return_token_ids": True})
    assert [untimed(r) for r in lean] == [untimed(r) for r in sdk]
    [record] = lean
    if record.status is Status.OK:
        assert (
            0 < record.ttft_ms <= record.e2e_ms
            and len(record.itl_ms)
            == sum(
                1
                for e in events
                for c in e.get("choices", ())
                if (c.get("delta") or {}).get("content") or c.get("text") or c.get("token_ids")
            )
            - 1
        )
    expected = {
        "chat with usage": (999, 16, 3, "usage"),
        "completions": (999, None, 3, "usage"),
        "usage without details": (5, None, 1, "usage"),
    }
    if name in expected:
        assert (
            record.prompt_tokens,
            record.cached_prompt_tokens,
            record.output_tokens,
            record.output_tokens_source,
        ) == expected[name]
    if name == "token ids":
        assert record.output_token_ids == (7, 8, 9) and record.prompt_token_ids == (1, 2, 3)
    if name == "chunk not an object":
        assert record.error == "a stream chunk is not a JSON object: [1, 2]" and record.output_text == "x"
    if name == "chunk without choices":
        assert record.status is Status.OK and record.output_text == "x"
    if name.startswith("error"):
        assert record.status is Status.ERROR and record.error.startswith("error event in the stream: ")
        assert record.error.endswith(
            "overloaded" if name == "error event" else "An error occurred during streaming"
        )


@pytest.mark.parametrize(
    "behaviour,status,needle",
    [
        ("fail", 500, "Error code: 500 - "),
        ("cut", 200, "connection error: peer closed connection without sending complete message body"),
        ("eof", 200, "the stream ended before its final chunk (no finish_reason)"),
        ("hang", None, "timeout: no complete response within 1 s"),
        ("json_reply", 200, "not an SSE stream"),
        ("reset", None, "connection error"),
    ],
)
def test_misbehaving_servers_give_the_same_one_line_errors_on_both_paths(
    fake_server, behaviour, status, needle
):
    lean, sdk = both(fake_server(behaviour).url, [chat_request(0), text_request(1)], timeout_s=1.0)
    assert [untimed(r) for r in lean] == [untimed(r) for r in sdk]
    for record in lean:
        assert record.status is Status.ERROR and record.http_status == status and needle in record.error
        assert "\n" not in record.error and SECRET_KEY not in record.error


def test_data_that_is_not_json_is_the_same_error_on_both_paths(fake_server):
    lean, sdk = both(fake_server("not_json").url, [chat_request()])
    assert lean[0].error == sdk[0].error and lean[0].error.startswith("JSONDecodeError: ")


def test_a_real_kvbench_serve_gives_the_same_records_on_both_paths(server):
    """Chat, text and token-id prompts, each sent twice (the second one a prefix-cache hit), with
    vLLM's return_token_ids; each path under its own cache_salt so both start from a cold cache."""
    chat, text = "Tell me a story about a cache. " * 6, "The prefix cache keeps the blocks of a prompt. " * 4
    requests = [
        chat_request(0, chat),
        chat_request(1, chat),
        text_request(2, text),
        text_request(3, text),
        ids_request(4, tuple(range(100, 140))),
        ids_request(5, tuple(range(100, 140))),
    ]
    [model], _ = list_models(server.url, "unused")
    records = {
        kind: serve(
            server.url,
            requests,
            kind,
            run_salt=f"lean-test-{kind.value}",
            model=model,
            extra_body={"return_token_ids": True},
            timeout_s=120.0,
        )
        for kind in ClientKind
    }
    lean, sdk = records[ClientKind.LEAN], records[ClientKind.SDK]
    assert [untimed(r) for r in lean] == [untimed(r) for r in sdk]
    assert all(r.status is Status.OK and r.output_tokens == 4 and len(r.output_token_ids) == 4 for r in lean)
    assert all(len(r.itl_ms) == 3 and 0 < r.ttft_ms <= r.e2e_ms for r in lean + sdk)
    cached = [r.cached_prompt_tokens for r in lean]
    assert cached[0::2] == [0, 0, 0] and all(c > 0 for c in cached[1::2]), cached


LINE_ENDS = st.sampled_from(["\n", "\r\n", "\r"])
FIELD = st.one_of(
    st.builds(lambda v: f"data: {v}", st.text('ab{}"é: ', max_size=8)),
    st.builds(lambda v: f"data:{v}", st.text("ab ", max_size=4)),
    st.sampled_from(
        [
            "data",
            ": a comment",
            "event: message",
            "event:",
            "id: 7",
            "id:",
            "id: a\0b",
            "retry: 10",
            "retry: soon",
            "other: x",
        ]
    ),
)
EVENT = st.lists(FIELD, min_size=0, max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(st.tuples(EVENT, LINE_ENDS), max_size=6),
    cuts=st.lists(st.integers(0, 200), max_size=6),
    tail=st.sampled_from(["", "data: unfinished", "data: x\n"]),
)
def test_the_event_splitter_agrees_with_the_sdks_decoder(events, cuts, tail):
    """Any event stream, cut into pieces anywhere: the data of the events the SDK dispatches."""
    body = "".join("".join(f + end for f in fields) + end for fields, end in events) + tail
    raw = body.encode()
    bounds = sorted({0, len(raw), *(c for c in cuts if c < len(raw))})
    pieces = [raw[a:b] for a, b in zip(bounds, bounds[1:])]
    expected = [sse.data.encode() for sse in SSEDecoder().iter_bytes(iter(pieces))]
    splitter = EventSplitter()
    assert [data for piece in pieces for data in splitter.feed(piece)] == expected


def test_the_splitters_common_case_is_one_whole_event_per_piece():
    splitter = EventSplitter()
    assert splitter.feed(b'data: {"a": 1}\n\n') == [b'{"a": 1}']
    assert splitter.feed(b"data: [DONE]\n\ndata: x\n\n") == [b"[DONE]", b"x"]
    assert splitter.feed(b"data: a\r") == [] and splitter.feed(b"\n\r\n") == [b"a"]


def test_kvbench_run_reads_streams_lean_by_default_and_with_the_sdk_on_request(
    kvbench_rows, server, tiny_scenario, tmp_path
):
    """The same scenario against a real kvbench serve, each run under its own random cache_salt."""
    keys = (
        "request_id",
        "status",
        "prompt_tokens",
        "cached_prompt_tokens",
        "output_tokens",
        "output_tokens_source",
    )
    rows = {}
    for name, flags in (("lean", ()), ("sdk", ("--client", "sdk"))):
        out = tmp_path / f"{name}.parquet"
        written = kvbench_rows(*openai_args("run", tiny_scenario, server.url), *flags, out=out)
        assert read_metadata(out)["run"]["client"] == name
        rows[name] = [{k: row[k] for k in keys} for row in written]
    assert rows["lean"] == rows["sdk"]
    assert [r["cached_prompt_tokens"] for r in rows["lean"]] == [0, 64, 64]


def test_client_is_refused_off_the_openai_backend(kvbench, tiny_scenario):
    scenario = tiny_scenario
    code, out, err = kvbench("run", scenario, "--client", "sdk")
    assert (
        code == 2
        and "--client does not apply to --backend inprocess" in out + err
        and "Traceback" not in out + err
    )
    code, out, err = kvbench("run", scenario, "--backend", "anthropic", "--client", "lean")
    assert code == 2 and "--client does not apply to --backend anthropic" in out + err
    code, out, err = kvbench("run", scenario, "--backend", "openai", "--client", "fast")
    assert code == 2 and "error: --client must be 'lean' or 'sdk', got 'fast'" in err
