"""``kvbench trace import``'s readers on small files written here: counts, sessions, bad rows."""

import json

import numpy as np
import pytest

from kvbench.errors import InputError
from kvbench.run.source import load_source
from kvbench.workloads.formats.importing import ImportConfig, import_trace
from kvbench.workloads.formats.kvbench_trace import read_trace, write_trace
from kvbench.workloads.tokenizer import render

BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type,Session ID
5.0,ChatGPT,120,30,150,Conversation log,7
6.5,ChatGPT,40,12,52,API log,
9.0,ChatGPT,300,25,325,Conversation log,7
12.0,GPT-4,8,0,8,API log,
"""
SHAREGPT = [
    {
        "id": "a",
        "conversations": [
            {"from": "human", "value": "What is a KV cache?"},
            {
                "from": "gpt",
                "value": "It stores the keys and values of processed tokens so they are not recomputed.",
            },
            {"from": "human", "value": "And prefix caching?"},
            {"from": "gpt", "value": "Reusing those blocks across requests that share a prefix."},
        ],
    },
    {
        "id": "b",
        "conversations": [
            {"from": "system", "value": "You are terse."},
            {"from": "human", "value": "Hello"},
            {"from": "gpt", "value": "Hi."},
        ],
    },
]


def hash_line(chat, parent, timestamp_s, hash_ids, input_length, output_length=8):
    return json.dumps(
        {
            "chat_id": chat,
            "parent_chat_id": parent,
            "timestamp": timestamp_s,
            "input_length": input_length,
            "output_length": output_length,
            "type": "text",
            "turn": 1,
            "hash_ids": hash_ids,
        }
    )


def imported(tmp_path, fmt, name, content, tokenizer, **options):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return import_trace(ImportConfig(fmt, str(path), **options), tokenizer)


def assert_counts_are_the_tokenizers(trace, tokenizer):
    for request in trace.requests:
        assert render(tokenizer, request).shape[0] == request.expected_prompt_tokens


def test_jsonl_prompts_and_messages_keep_sessions_turns_and_times(tmp_path, tokenizer):
    lines = [
        {"prompt": "Tell me about caching.", "max_tokens": 20, "timestamp": 100.5},
        {"messages": [{"role": "user", "content": "Hi there"}], "session_id": "s1", "timestamp": 101.0},
        {
            "messages": [
                {"role": "user", "content": "Hi there"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "More"},
            ],
            "session_id": "s1",
            "arrival_ms": 102_000,
            "max_tokens": 9,
            "output_tokens": 4,
        },
    ]
    trace = imported(tmp_path, "jsonl", "p.jsonl", "\n".join(map(json.dumps, lines)), tokenizer).trace
    got = [(r.session_id, r.turn, r.arrival_ms, r.max_tokens, r.output_tokens) for r in trace.requests]
    assert got == [("line-1", 0, 0.0, 20, None), ("s1", 0, 500.0, 64, None), ("s1", 1, 1500.0, 9, 4)]
    assert trace.requests[0].expected_prompt_tokens == len(tokenizer.encode("Tell me about caching."))
    assert_counts_are_the_tokenizers(trace, tokenizer)


def test_sharegpt_expands_turns_into_growing_requests(tmp_path, tokenizer):
    trace = imported(
        tmp_path, "sharegpt", "s.json", SHAREGPT, tokenizer, conversation_gap_s=1.0, think_time_s=2.0
    ).trace
    first = [r for r in trace.requests if r.session_id == "sharegpt-000000"]
    assert [r.turn for r in first] == [0, 1] and [r.arrival_ms for r in first] == [0.0, 2000.0]
    assert first[1].messages[:2] == first[0].messages + (first[1].messages[1],)
    reply = SHAREGPT[0]["conversations"][1]["value"]
    assert first[0].max_tokens == len(tokenizer.encode(reply)) and first[1].messages[1].content == reply
    second = [r for r in trace.requests if r.session_id == "sharegpt-000001"]
    assert [m.role for m in second[0].messages] == ["system", "user"] and second[0].arrival_ms == 1000.0
    assert_counts_are_the_tokenizers(trace, tokenizer)


def test_burstgpt_text_has_exactly_the_logged_lengths_and_sessions_extend(tmp_path, tokenizer):
    trace = imported(tmp_path, "burstgpt", "b.csv", BURSTGPT, tokenizer).trace
    got = [
        (r.session_id, r.turn, r.arrival_ms, r.expected_prompt_tokens, r.max_tokens) for r in trace.requests
    ]
    assert got == [
        ("burstgpt-7", 0, 0.0, 120, 30),
        ("row-3", 0, 1500.0, 40, 12),
        ("burstgpt-7", 1, 4000.0, 300, 25),
        ("row-5", 0, 7000.0, 8, 1),
    ]
    session = [r for r in trace.requests if r.session_id == "burstgpt-7"]
    assert session[1].prompt.startswith(session[0].prompt)
    ids = [tokenizer.encode(r.prompt) for r in session]
    assert ids[1][:120] == ids[0]  # the resent history is a token prefix: a cache can reuse it
    assert_counts_are_the_tokenizers(trace, tokenizer)


def test_hash_ids_at_16_tokens_give_sessions_and_exact_shared_blocks(tmp_path, tokenizer):
    lines = [
        hash_line(1, -1, 0.5, [11, 12, 13], 40),
        hash_line(2, 1, 3.0, [11, 12, 13, 14, 15], 70),
        hash_line(3, -1, 3.5, [11, 99], 20),
    ]
    trace = imported(tmp_path, "hash-ids", "h.jsonl", "\n".join(lines), tokenizer).trace
    got = [(r.session_id, r.turn, r.arrival_ms, r.expected_prompt_tokens) for r in trace.requests]
    assert got == [("chat-1", 0, 0.0, 40), ("chat-1", 1, 2500.0, 70), ("chat-3", 0, 3000.0, 20)]
    ids = [tokenizer.encode(r.prompt) for r in trace.requests]
    assert ids[1][:40] == ids[0]  # 3 shared ids; the first prompt is cut to 40 tokens inside the third block
    assert ids[2][:16] == ids[0][:16] and ids[2][16:] != ids[0][16:20]


def test_mooncake_any_block_size(tmp_path, tokenizer):
    lines = [
        json.dumps({"timestamp": 0, "input_length": 64, "output_length": 4, "hash_ids": [1, 2]}),
        json.dumps({"timestamp": 250, "input_length": 80, "output_length": 4, "hash_ids": [1, 2, 3]}),
    ]
    result = imported(tmp_path, "mooncake", "m.jsonl", "\n".join(lines), tokenizer, block_size=32)
    ids = [tokenizer.encode(r.prompt) for r in result.trace.requests]
    assert [len(i) for i in ids] == [64, 80] and ids[1][:64] == ids[0]
    assert result.trace.requests[1].arrival_ms == 250.0
    with pytest.raises(
        InputError, match=r"m.jsonl:1: field 'hash_ids': 2 ids for input_length 64 \(expected 1 at 512"
    ):
        imported(tmp_path, "mooncake", "m.jsonl", "\n".join(lines), tokenizer)


@pytest.mark.parametrize(
    ("fmt", "name", "content", "message"),
    [
        (
            "jsonl",
            "p.jsonl",
            '{"prompt": "ok"}\n{"prompt": 5}\n',
            r"p.jsonl:2: field 'prompt': expected a non-empty string",
        ),
        (
            "jsonl",
            "p.jsonl",
            '{"prompt": "ok"}\n{"prompt": "x", "max_tokens": 0}\n',
            r"p.jsonl:2: field 'max_tokens'",
        ),
        (
            "sharegpt",
            "s.json",
            SHAREGPT + [{"conversations": [{"from": "robot", "value": "x"}]}],
            r"s.json: conversation 2: field 'conversations\[0\].from'",
        ),
        (
            "burstgpt",
            "b.csv",
            BURSTGPT + "13.0,GPT-4,abc,10,10,API log,\n",
            r"b.csv:6: field 'Request tokens'",
        ),
        (
            "hash-ids",
            "h.jsonl",
            hash_line(1, -1, 0, [1], 10) + "\n" + hash_line(2, 1, 1, [1], 40),
            r"h.jsonl:2: field 'hash_ids': 1 ids for input_length 40",
        ),
    ],
)
def test_a_bad_row_names_file_row_and_field_and_skip_bad_counts_it(
    tmp_path, tokenizer, fmt, name, content, message
):
    with pytest.raises(InputError, match=message):
        imported(tmp_path, fmt, name, content, tokenizer)
    result = imported(tmp_path, fmt, name, content, tokenizer, skip_bad=True)
    assert result.num_skipped == 1 and result.trace.requests
    assert result.first_skipped is not None and result.first_skipped.startswith(str(tmp_path / name))


def test_burstgpt_without_its_columns_is_refused(tmp_path, tokenizer):
    with pytest.raises(InputError, match=r"b.csv:1: not a BurstGPT CSV: no column 'Request tokens'"):
        imported(tmp_path, "burstgpt", "b.csv", "Timestamp,Tokens\n1,2\n", tokenizer)


def test_other_formats_are_read_directly_by_load_source(tmp_path, tokenizer):
    (tmp_path / "s.json").write_text(json.dumps(SHAREGPT, indent=1))
    (tmp_path / "b.csv").write_text(BURSTGPT)
    (tmp_path / "h.jsonl").write_text(
        hash_line(1, -1, 0, [5, 6], 20) + "\n" + hash_line(2, 1, 2, [5, 6, 7], 40)
    )
    sharegpt, burstgpt = (
        load_source(tmp_path / "s.json", tokenizer),
        load_source(tmp_path / "b.csv", tokenizer),
    )
    assert (sharegpt.format, len(sharegpt.requests), sharegpt.block_size) == ("sharegpt", 3, 16)
    assert [r.token_ids.shape[0] for r in burstgpt.requests] == [120, 40, 300, 8]
    hashed = load_source(tmp_path / "h.jsonl")
    assert hashed.format == "hash-ids" and hashed.block_size == 16
    assert [(r.session_id, r.turn, r.arrival_s) for r in hashed.requests] == [
        ("chat-1", 0, 0.0),
        ("chat-1", 1, 2.0),
    ]
    np.testing.assert_array_equal(hashed.requests[1].token_ids[:20], hashed.requests[0].token_ids)


def test_an_imported_trace_reads_back_identically(tmp_path, tokenizer):
    trace = imported(tmp_path, "burstgpt", "b.csv", BURSTGPT, tokenizer).trace
    back = read_trace(write_trace(trace, tmp_path / "t.jsonl"))
    assert back == trace and back.header.generator == "import-burstgpt"
