"""Every reader of a user file reads a line at a time with a bound on one line, and
JSON nested too deeply is one line naming the file and line, never a ``RecursionError``."""

import json
import subprocess
import sys
import time

import pytest

from kvbench.errors import InputError
from kvbench.run.scenario import load_scenario
from kvbench.run.source import load_source
from kvbench.workloads.formats import json_array
from kvbench.workloads.formats.burstgpt import read_burstgpt_drafts
from kvbench.workloads.formats.importing import ImportConfig, import_trace
from kvbench.workloads.formats.json_array import json_array_items
from kvbench.workloads.formats.lines import DEFAULT_MAX_LINE_BYTES, line_bound, max_line_bytes
from kvbench.workloads.formats.mooncake import read_mooncake
from kvbench.workloads.formats.rows import BadRows

PROMPT_LINE = '{"prompt": "hello there"}\n'


def over_long(path, num_bytes, before=PROMPT_LINE):
    """A file whose second line is a prompt line of about ``num_bytes`` bytes."""
    path.write_text(before + json.dumps({"prompt": "x" * num_bytes}) + "\n" + PROMPT_LINE)
    return path


def test_a_line_over_the_bound_names_file_line_and_size_in_every_jsonl_reader(tmp_path, tokenizer):
    path = over_long(tmp_path / "p.jsonl", 5000)
    size = len(path.read_text().splitlines()[1])
    with line_bound(1000):
        for read in (
            lambda: load_source(path),
            lambda: import_trace(ImportConfig("jsonl", str(path)), tokenizer),
        ):
            with pytest.raises(
                InputError, match=rf"p\.jsonl:2: {size:,} bytes is longer than the bound of 1,000"
            ):
                read()
        mooncake = tmp_path / "m.jsonl"
        mooncake.write_text(
            json.dumps(
                {
                    "timestamp": 0,
                    "input_length": 512 * 400,
                    "output_length": 1,
                    "hash_ids": list(range(1000, 1400)),
                }
            )
            + "\n"
        )
        with pytest.raises(InputError, match=r"m\.jsonl:1: 2,[0-9]{3} bytes is longer"):
            read_mooncake(mooncake)
    assert max_line_bytes() == DEFAULT_MAX_LINE_BYTES  # the bound held for the block only
    assert len(load_source(path).requests) == 3


def test_a_line_exactly_at_the_bound_is_read(tmp_path):
    path = tmp_path / "p.jsonl"
    line = json.dumps({"prompt": "y" * 100})
    path.write_text(PROMPT_LINE + line + "\r\n")
    with line_bound(len(line)):
        assert len(load_source(path).requests) == 2
    with line_bound(len(line) - 1), pytest.raises(InputError, match=rf":2: {len(line):,} bytes"):
        load_source(path)


def test_csv_rows_and_scenarios_are_bounded_too(tmp_path, tokenizer):
    from kvbench.workloads.text_fit import PieceCounter

    csv_path = tmp_path / "b.csv"
    csv_path.write_text("Timestamp,Request tokens,Response tokens\n0,10,5\n1,10," + "9" * 3000 + "\n")
    with line_bound(1000), pytest.raises(InputError, match=r"b\.csv:3: 3,00[0-9] bytes is longer"):
        read_burstgpt_drafts(csv_path, PieceCounter(tokenizer), BadRows(), 0)
    quoted = tmp_path / "q.csv"  # one quoted field over many lines: csv's own field limit, one line
    quoted.write_text('Timestamp,Request tokens,Response tokens\n0,10,"' + "a\n" * 70000 + '"\n')
    with pytest.raises(
        InputError, match=r"q\.csv:[0-9]+: not a valid CSV row \(field larger than field limit"
    ):
        read_burstgpt_drafts(quoted, PieceCounter(tokenizer), BadRows(), 0)
    scenario = tmp_path / "s.toml"
    scenario.write_text("# " + "z" * 3000 + "\n[workload]\nkind = 'shared-prefix'\n")
    with (
        line_bound(1000),
        pytest.raises(InputError, match=r"s\.toml: 3,0[0-9]{2} bytes is larger than the bound"),
    ):
        load_scenario(scenario)


@pytest.mark.parametrize("chunk_chars", [1, 7, 64, 2**16])
def test_a_json_array_streams_element_by_element(tmp_path, monkeypatch, chunk_chars):
    monkeypatch.setattr(json_array, "_CHUNK_CHARS", chunk_chars)
    values = [{"conversations": [{"from": "human", "value": "h\u00e9\u4e16 " * k}]} for k in range(6)]
    values += [12345, 'tail \\" quote', [1.5e3, None, True]]
    path = tmp_path / "a.json"
    for text in (json.dumps(values), json.dumps(values, indent=2), " [ ] ", "[12]"):
        path.write_text(text, encoding="utf-8")
        assert [value for _, value in json_array_items(path)] == json.loads(text)


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"a": 1}', r"expected a JSON array of conversations, got an object"),
        ("", r"expected a JSON array of conversations, got nothing"),
        ("[1,]", r"a\.json:1: not valid JSON"),
        ("[1 2]", r"a\.json:1: not valid JSON \(expected ',' or ']'"),
        ('[\n{"a": 1},\n{"b": tru}\n]', r"a\.json:3: not valid JSON \(Expecting value\)"),
        ("[1] [2]", r"a\.json:1: not valid JSON \(extra data after the array\)"),
        ('[{"a": "never closed', r"a\.json:1: not valid JSON \(Unterminated string"),
    ],
)
def test_a_broken_json_array_is_one_line(tmp_path, monkeypatch, text, message):
    monkeypatch.setattr(json_array, "_CHUNK_CHARS", 4)
    path = tmp_path / "a.json"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        list(json_array_items(path, "conversations"))


def test_a_sharegpt_conversation_over_the_bound_is_refused(tmp_path, tokenizer, monkeypatch):
    path = tmp_path / "s.json"
    turn = {"from": "human", "value": "v" * 5000}
    path.write_text(
        json.dumps([{"conversations": [{"from": "human", "value": "hi"}]}, {"conversations": [turn]}])
    )
    with (
        line_bound(1000),
        pytest.raises(
            InputError,
            match=r"s\.json: element 1 \(from line 1\): 5,0[0-9]{2} bytes is longer than the bound of 1,000",
        ),
    ):
        import_trace(ImportConfig("sharegpt", str(path)), tokenizer)
    assert len(import_trace(ImportConfig("sharegpt", str(path)), tokenizer).trace.requests) == 2
    monkeypatch.setattr(json_array, "_CHUNK_CHARS", 16)  # cut while reading: refused before it is read whole
    with (
        line_bound(1000),
        pytest.raises(InputError, match=r"s\.json: element 1 \(from line 1\): more than 1,000"),
    ):
        import_trace(ImportConfig("sharegpt", str(path)), tokenizer)


def _peak_rss_mb(args, cwd):
    """(exit code, stderr, peak RSS of the kvbench process in MB, seconds)."""
    probe = (
        "import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
        "sys.stderr.write(p.stderr)"
    )
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", probe, sys.executable, "-m", "kvbench.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )
    code, rss_kb = map(int, done.stdout.split())
    return code, done.stderr, rss_kb / 1024, time.perf_counter() - started


@pytest.mark.slow
def test_a_50_mb_line_is_refused_fast_in_memory_of_one_bound(tmp_path):
    """A 50 MB line against a 1 MB bound: the same peak memory as a 2 MB line (within 30 MB), exit 2,
    one line naming the file, the line and the size. Before: read whole (and parsed) into memory."""
    runs = {}
    for name, num_bytes in (("small", 2_000_000), ("huge", 50_000_000)):
        path = over_long(tmp_path / f"{name}.jsonl", num_bytes)
        runs[name] = _peak_rss_mb(
            [
                "--max-line-bytes",
                "1000000",
                "trace",
                "import",
                "jsonl",
                path,
                "-o",
                tmp_path / f"{name}-out.jsonl",
            ],
            tmp_path,
        )
        code, err, _, _ = runs[name]
        size = len(path.read_bytes().split(b"\n")[1])
        assert code == 2, err
        assert (
            err.count("\n") == 1
            and f"{name}.jsonl:2: {size:,} bytes is longer than the bound of 1,000,000" in err
        )
        assert not (tmp_path / f"{name}-out.jsonl").exists()
    assert runs["huge"][2] - runs["small"][2] < 30, runs  # MB: one line's worth, not the file's
    assert runs["huge"][3] < runs["small"][3] + 20, runs  # s: skipping 48 MB takes well under a second
