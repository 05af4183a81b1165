"""``kvbench memory``, ``memory waste`` and ``memory sharing`` end to end, and the trace reader."""

import json

import pytest

from kvbench.errors import InputError
from kvbench.memory.trace import read_waste_trace
from kvbench.request import Message
from kvbench.workloads.formats.kvbench_trace import TraceRequest, new_trace, write_trace


def write_lines(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def chat_like(num_requests=40):
    """Bare length lines: a request every 100 ms, long answers reserved for, shorter real ones."""
    return [
        {
            "id": f"r{i}",
            "arrival_ms": 100 * i,
            "max_tokens": 512,
            "expected_prompt_tokens": 600 + 97 * (i % 7),
            "output_tokens": 20 + 13 * (i % 11),
        }
        for i in range(num_requests)
    ]


def kvbench_trace(path, num_requests=5):
    """A real kvbench trace file (header, content hash), written by the project's trace writer;
    request 0 records its real output length."""
    requests = [
        TraceRequest(
            f"r{i}",
            f"s{i}",
            0,
            250.0 * i,
            40 + i,
            300 + 10 * i,
            messages=(Message("user", f"question {i}"),),
            output_tokens=7 if i == 0 else None,
        )
        for i in range(num_requests)
    ]
    return write_trace(new_trace("hand-written", {}, None, "cl100k_base", "chatml", requests), path)


def row_cells(out, label):
    """The cells after the label in the table row that contains ``label``."""
    row = next(line for line in out.splitlines() if label in line)
    cells = [cell.strip() for cell in row.split("│")]
    return cells[cells.index(next(cell for cell in cells if label in cell)) + 1 :]


# -- the calculator ------------------------------------------------------------------------------------


def test_calculator_prints_the_check_values(kvbench):
    code, out, _ = kvbench("memory", "--model", "llama-3.1-8b")
    assert code == 0
    for text in ("131,072", "128 KiB", "2 MiB", "250 MiB", "16 GiB", "8,030,261,248", "467,291"):
        assert text in out


def test_calculator_defaults_to_kvbench_model_and_takes_dtypes(kvbench):
    code, out, _ = kvbench("memory")
    assert code == 0 and "kvbench-default" in out and "8 KiB" in out
    code, out, _ = kvbench("memory", "--model", "llama-3.1-8b", "--kv-dtype", "fp8", "--memory", "24GB")
    assert code == 0 and "64 KiB" in out and "fp8" in out


def test_calculator_reads_a_config_folder_and_refuses_mla(kvbench, tmp_path):
    config = {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 1000,
        "max_position_embeddings": 512,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, _ = kvbench("memory", "--model", tmp_path)
    assert code == 0 and f"{2 * 2 * 2 * 16 * 2:,}" in out  # 256 B per token
    (tmp_path / "config.json").write_text(json.dumps({**config, "kv_lora_rank": 512}))
    code, out, err = kvbench("memory", "--model", tmp_path)
    assert code == 2 and "multi-head latent attention" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (("--model", "gpt-9"), "unknown model 'gpt-9'"),
        (("--dtype", "int3"), "unknown dtype"),
        (("--memory", "lots"), "not a byte size"),
    ],
)
def test_calculator_input_errors_are_one_line(kvbench, args, message):
    code, _, err = kvbench("memory", *args)
    assert code == 2 and message in err and "Traceback" not in err


# -- waste ---------------------------------------------------------------------------------------------


def test_waste_prints_both_allocators_and_writes_the_plot(kvbench, tmp_path):
    trace = write_lines(tmp_path / "chat.jsonl", chat_like())
    plot = tmp_path / "waste.png"
    code, out, _ = kvbench("memory", "waste", trace, "--pool", "24MiB", "--plot", plot)
    assert code == 0
    assert "contiguous" in out and "paged" in out and "requests that waited" in out
    assert "external fragmentation" in out and "40 requests read" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_waste_on_mooncake_lines(kvbench, tmp_path, shared_data):
    trace = shared_data / "mooncake" / "conversation_trace.jsonl"
    code, out, _ = kvbench(
        "memory",
        "waste",
        trace,
        "--pool",
        "2GiB",
        "--limit",
        "60",
        "--max-model-len",
        "131072",
        "--max-tokens",
        "2048",
        "--no-plot",
    )
    assert code == 0 and "60 requests read" in out and "plot:" not in out


def test_waste_bad_line_names_file_line_and_field(kvbench, tmp_path):
    requests = chat_like(3)
    requests[1]["max_tokens"] = -4
    trace = write_lines(tmp_path / "bad.jsonl", requests)
    code, _, err = kvbench("memory", "waste", trace, "--pool", "1GiB", "--no-plot")
    assert code == 2
    assert f"{trace}:2: field 'max_tokens'" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "args, message",
    [
        (("--pool", "2XB"), "not a byte size"),
        (("--pool", "1KiB"), "holds no block"),
    ],
)
def test_waste_bad_pool(kvbench, tmp_path, args, message):
    trace = write_lines(tmp_path / "chat.jsonl", chat_like(3))
    code, _, err = kvbench("memory", "waste", trace, *args, "--no-plot")
    assert code == 2 and message in err


def test_waste_missing_trace(kvbench, tmp_path):
    code, _, err = kvbench("memory", "waste", tmp_path / "nope.jsonl", "--pool", "1GiB")
    assert code == 2 and "cannot read trace" in err


# -- sharing ---------------------------------------------------------------------------------------------


def test_sharing_parallel_sampling_table(kvbench, tmp_path):
    plot = tmp_path / "sharing.png"
    code, out, _ = kvbench(
        "memory", "sharing", "--n", "4", "--prompt-tokens", "2008", "--max-tokens", "256", "--plot", plot
    )
    assert code == 0
    assert "125 full + 1 partial" in out
    assert row_cells(out, "copies after the first token")[:2] == ["3", "384 KiB"]
    assert row_cells(out, "peak blocks, shared")[0] == "193"
    assert row_cells(out, "peak blocks, private")[0] == "568"
    assert row_cells(out, "after every sequence finished")[0] == "0"
    assert plot.exists()


def test_sharing_beam_search_and_conflicting_modes(kvbench, tmp_path):
    code, out, _ = kvbench(
        "memory", "sharing", "--beam-width", "4", "--max-tokens", "64", "--plot", tmp_path / "beam.png"
    )
    assert code == 0 and "beam search" in out
    code, _, err = kvbench("memory", "sharing", "--n", "2", "--beam-width", "2", "--no-plot")
    assert code == 2 and "not both" in err


# -- the trace reader ---------------------------------------------------------------------------------


def test_waste_on_a_kvbench_trace(kvbench, tmp_path):
    trace = kvbench_trace(tmp_path / "hand.jsonl")
    code, out, _ = kvbench("memory", "waste", trace, "--pool", "8MiB", "--no-plot")
    assert code == 0 and "5 requests read" in out


def test_reader_takes_kvbench_traces_through_the_trace_reader(tmp_path):
    trace = kvbench_trace(tmp_path / "t.jsonl")
    read = read_waste_trace(trace)
    assert [r.request_id for r in read] == ["r0", "r1", "r2", "r3", "r4"]
    assert (read[1].arrival_ms, read[1].prompt_tokens, read[1].max_tokens) == (250.0, 310, 41)
    assert read[1].output_tokens == 41  # no output_tokens: max_tokens
    assert (read[0].output_tokens, read[0].max_tokens) == (7, 40)
    assert len(read_waste_trace(trace, limit=2)) == 2
    lines = trace.read_text().splitlines()
    record = json.loads(lines[2])
    record["max_tokens"] = 0
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join([lines[0], lines[1], json.dumps(record)] + lines[3:]) + "\n")
    with pytest.raises(InputError, match=":3: field 'max_tokens'"):
        read_waste_trace(broken)


def test_reader_takes_bare_length_lines_with_or_without_output_tokens(tmp_path):
    requests = chat_like(3)
    del requests[2]["output_tokens"]
    read = read_waste_trace(write_lines(tmp_path / "t.jsonl", requests))
    assert [r.request_id for r in read] == ["r0", "r1", "r2"]
    assert read[1].arrival_ms == 100 and read[1].prompt_tokens == 697 and read[1].output_tokens == 33
    assert read[2].output_tokens == read[2].max_tokens == 512  # no output_tokens: max_tokens


def test_reader_takes_mooncake_lines(tmp_path):
    lines = [
        {"timestamp": 0, "input_length": 1000, "output_length": 300, "hash_ids": [0, 1]},
        {"timestamp": 27, "input_length": 600, "output_length": 5, "hash_ids": [0, 2]},
    ]
    trace = write_lines(tmp_path / "m.jsonl", lines)
    first, second = read_waste_trace(trace)
    assert (first.prompt_tokens, first.output_tokens, first.max_tokens) == (1000, 300, None)
    assert second.arrival_ms == 27
    clipped, _ = read_waste_trace(trace, default_max_tokens=256)
    assert (clipped.output_tokens, clipped.max_tokens) == (256, 256)
    assert len(read_waste_trace(trace, limit=1)) == 1


@pytest.mark.parametrize(
    "change, field",
    [
        ({"arrival_ms": "soon"}, "arrival_ms"),
        ({"expected_prompt_tokens": 0}, "expected_prompt_tokens"),
        ({"output_tokens": 9999}, "output_tokens"),
        ({"max_tokens": True}, "max_tokens"),
    ],
)
def test_reader_names_the_bad_field(tmp_path, change, field):
    requests = chat_like(3)
    requests[1].update(change)
    with pytest.raises(InputError, match=f":2: field '{field}'"):
        read_waste_trace(write_lines(tmp_path / "t.jsonl", requests))


def test_reader_refuses_missing_fields_bad_json_and_empty_files(tmp_path):
    requests = chat_like(2)
    del requests[1]["expected_prompt_tokens"]
    with pytest.raises(InputError, match=":2: field 'expected_prompt_tokens': missing"):
        read_waste_trace(write_lines(tmp_path / "a.jsonl", requests))
    mixed = [{"timestamp": 0, "input_length": 5, "output_length": 1}, chat_like(1)[0]]
    with pytest.raises(InputError, match=":2: field 'timestamp': missing"):
        read_waste_trace(write_lines(tmp_path / "b.jsonl", mixed))
    bad = tmp_path / "c.jsonl"
    bad.write_text(json.dumps(chat_like(1)[0]) + "\n{oops\n")
    with pytest.raises(InputError, match=":2: not valid JSON"):
        read_waste_trace(bad)
    with pytest.raises(InputError, match="no requests"):
        read_waste_trace(write_lines(tmp_path / "d.jsonl", []))
    with pytest.raises(InputError, match=":1: expected a JSON object"):
        read_waste_trace(write_lines(tmp_path / "e.jsonl", [[1, 2]]))
