"""workloads/formats and the one source loader: a trace file is opened once, each format has one
reader, and what comes out is ``kvbench.request.Request``."""

import json
import pathlib

import numpy as np
import pytest

from kvbench.errors import InputError
from kvbench.request import Message, Request
from kvbench.run.source import load_source
from kvbench.workloads.formats.jsonl import FORMATS, open_jsonl
from kvbench.workloads.formats.kvbench_trace import TraceRequest, new_trace, write_trace
from kvbench.workloads.kinds import KINDS, generate_trace, workload_requests
from kvbench.workloads.token_ids import MultiPrefixConfig
from kvbench.workloads.tokenizer import render


def kvbench_trace(path, tokenizer):
    system = Message("system", "You are terse.\n")
    lines = [
        TraceRequest("r0", "s0", 0, 0.0, 5, 1, messages=(system, Message("user", "Hi\n"))),
        TraceRequest("r1", "s0", 1, 1500.0, 8, 1, prompt="plain text\n", salt="tenant-1", output_tokens=3),
    ]
    lines = [
        TraceRequest(**{**vars(r), "expected_prompt_tokens": int(render(tokenizer, r).shape[0])})
        for r in lines
    ]
    return write_trace(new_trace("hand-written", {}, None, tokenizer.name, "chatml", lines), path)


def mooncake_trace(path):
    lines = [
        {"timestamp": 0, "input_length": 600, "output_length": 7, "hash_ids": [0, 1]},
        {"timestamp": 250, "input_length": 512, "output_length": 0, "hash_ids": [0]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture
def count_opens(monkeypatch):
    """How many times each path was opened for reading (pathlib's open, counted)."""
    opened = {}
    original = pathlib.Path.open

    def counting(self, *args, **kwargs):
        opened[self.name] = opened.get(self.name, 0) + 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", counting)
    return opened


def test_a_kvbench_trace_is_opened_once_and_gives_requests_with_text(tmp_path, tokenizer, count_opens):
    path = kvbench_trace(tmp_path / "t.jsonl", tokenizer)
    count_opens.clear()
    source = load_source(path)
    assert count_opens == {"t.jsonl": 1}
    first, second = source.requests
    assert all(isinstance(r, Request) for r in source.requests)
    assert (source.format, source.block_size, source.name) == ("kvbench-trace", 16, "t")
    assert (first.index, first.request_id, first.session_id, first.turn, first.salt) == (
        0,
        "r0",
        "s0",
        0,
        None,
    )
    assert first.messages[1] == Message("user", "Hi\n") and first.prompt is None
    assert (
        first.token_ids.dtype == np.uint32
        and first.num_tokens == source.trace.requests[0].expected_prompt_tokens
    )
    assert (second.arrival_s, second.max_tokens, second.output_tokens, second.salt) == (1.5, 8, 3, "tenant-1")
    assert second.prompt == "plain text\n" and first.output_tokens == 5  # none recorded: the budget
    assert source.trace_info["generator"] == "hand-written"


def test_a_mooncake_trace_gives_token_id_requests(tmp_path, count_opens):
    path = mooncake_trace(tmp_path / "m.jsonl")
    count_opens.clear()
    source = load_source(path, limit=1)
    assert count_opens == {"m.jsonl": 1}
    (request,) = source.requests
    assert (source.format, source.block_size, source.trace) == ("mooncake", 512, None)
    assert (request.request_id, request.num_tokens, request.max_tokens, request.output_tokens) == (
        "r000000",
        600,
        7,
        7,
    )
    assert not request.has_text
    second = load_source(path).requests[1]
    # no output: default budget
    assert (second.arrival_s, second.max_tokens, second.output_tokens) == (
        0.25,
        64,
        None,
    )
    assert np.array_equal(second.token_ids, request.token_ids[:512])  # equal hash id, equal tokens


@pytest.mark.parametrize(
    "content, message",
    [
        ("", ": the file is empty"),
        ("{oops\n", ":1: not valid JSON"),
        # a {"prompt": ...} line is a format now (jsonl)
        (
            '{"text": "x"}\n',
            ":1: not a known trace format",
        ),
        ("[1, 2]\n", ":1: not a known trace format"),
    ],
)
def test_unknown_or_broken_first_lines_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "x.jsonl"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        load_source(path)


def test_the_validating_reader_keeps_its_file_line_field_errors(tmp_path, tokenizer):
    path = kvbench_trace(tmp_path / "t.jsonl", tokenizer)
    lines = path.read_text().splitlines()
    record = json.loads(lines[2])
    record["turn"] = -1
    path.write_text("\n".join([lines[0], lines[1], json.dumps(record)]) + "\n")
    with pytest.raises(InputError, match=r"t\.jsonl:3: field 'turn'"):
        load_source(path)


def test_open_jsonl_hands_the_first_line_to_the_reader(tmp_path):
    path = mooncake_trace(tmp_path / "m.jsonl")
    with open_jsonl(path) as file:
        assert file.format == "mooncake" and file.first_number == 1 and file.first["input_length"] == 600
        assert [number for number, _ in file.lines()] == [1, 2]
    # hash-ids and jsonl besides the two trace formats
    assert list(FORMATS) == [
        "kvbench-trace",
        "hash-ids",
        "mooncake",
        "jsonl",
        "lengths",
    ]


def test_the_kind_registry_is_literal_and_covers_scenarios_and_trace_gen():
    assert set(KINDS) == {
        "shared-prefix",
        "multi-prefix-text",
        "one-off",
        "chat",
        "agent",
        "mooncake-text",
        "trace",
        "multi-prefix",
        "mooncake",
    }
    assert [name for name, kind in KINDS.items() if not kind.is_text] == ["multi-prefix", "mooncake"]
    assert KINDS["mooncake"].default_block_size == KINDS["mooncake-text"].default_block_size == 512
    workload = workload_requests(
        "multi-prefix", MultiPrefixConfig(num_prefixes=2, prefix_tokens=32, num_requests=5)
    )
    assert workload.trace is None and [r.request_id for r in workload.requests] == [
        f"r{i:06d}" for i in range(5)
    ]
    assert all(r.num_tokens == 32 + 50 and r.max_tokens == 64 and r.salt is None for r in workload.requests)
    with pytest.raises(KeyError, match="token ids"):
        generate_trace("multi-prefix", MultiPrefixConfig())
