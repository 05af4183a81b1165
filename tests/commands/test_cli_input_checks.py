"""Nonsense on the command line refused up front with one line and exit 2: zero or empty values,
outputs that cannot be written, sizes no generator could finish, and messages that name the flag or
scenario key rather than an internal field."""

import json
from pathlib import Path

import pytest

from kvbench.errors import InputError, checked, user_named

REPO = Path(__file__).resolve().parents[2]
SHARED_2K = REPO / "scenarios" / "shared_2k.toml"


def one_line_error(code, err, *expected):
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    for text in expected:
        assert text in lines[0], lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "args, expected",
    [
        (("--sizes", ""), "--sizes: empty"),
        (
            ("--sizes", "100000000000000000000"),
            "--sizes: 100,000,000,000,000,000,000 blocks is more than any cache",
        ),
        (("--release", ""), "--release: empty; give one or more of tail-first, head-first"),
        (("--workers", "0"), "--workers: 0: must be >= 1"),
        (("--hash-bits", "4"), "--hash-bits: must be between 8 and 256"),
    ],
)
def test_sim_refuses_empty_zero_and_huge_values(kvbench, args, expected):
    code, out, err = kvbench("sim", SHARED_2K, "--requests", "5", *args)
    one_line_error(code, err, expected)
    assert "token hit" not in out  # refused before any simulation


@pytest.mark.parametrize("memory", ["0", "0GiB"])
def test_memory_zero_is_refused(kvbench, memory):
    code, _, err = kvbench("memory", "--memory", memory)
    one_line_error(code, err, f"--memory {memory}: must be a positive size")


def test_memory_waste_plot_is_checked_before_the_replay(kvbench, tmp_path, monkeypatch):
    import kvbench.commands.memory as memory_command

    def not_reached(*args, **kwargs):
        raise AssertionError("the trace was read before --plot was checked")

    monkeypatch.setattr(memory_command, "read_waste_trace", not_reached)
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        json.dumps(
            {"id": "r0", "arrival_ms": 0, "max_tokens": 8, "expected_prompt_tokens": 10, "output_tokens": 4}
        )
        + "\n"
    )
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, _, err = kvbench("memory", "waste", trace, "--pool", "24MiB", "--plot", blocker / "waste.png")
    one_line_error(code, err, "--plot", "is a file, not a folder")


def test_report_out_is_checked_before_reading(kvbench, tmp_path, monkeypatch):
    import kvbench.commands.report as report_command

    monkeypatch.setattr(
        report_command, "load_results", lambda paths: pytest.fail("results read before --out")
    )
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, _, err = kvbench("report", tmp_path / "whatever.parquet", "--out", blocker / "report")
    one_line_error(code, err, f"--out {blocker / 'report'}", "is a file, not a folder")


@pytest.mark.parametrize(
    "line, replacement, expected",
    [
        (
            "system_tokens = 2000",
            "system_tokens = 100000000",
            "field 'workload.system_tokens': system_tokens must be at most 1,048,576, got 100,000,000",
        ),
        (
            "num_requests = 2000",
            "num_requests = 1000000000000",
            "field 'workload.num_requests': num_requests must be at most 1,000,000, got 1,000,000,000,000",
        ),
    ],
)
def test_huge_workload_sizes_are_refused_with_the_scenario_line(
    kvbench, tmp_path, line, replacement, expected
):
    text = SHARED_2K.read_text()
    assert line in text
    scenario = tmp_path / "huge.toml"
    scenario.write_text(text.replace(line, replacement, 1))
    code, _, err = kvbench("sim", scenario)
    one_line_error(code, err, str(scenario), expected)


def test_trace_gen_names_the_flag_for_a_huge_size(kvbench, tmp_path):
    code, _, err = kvbench(
        "trace", "gen", "shared-prefix", "--system-tokens", "100000000", "-o", tmp_path / "t.jsonl"
    )
    one_line_error(code, err, "--system-tokens must be at most 1,048,576")
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.parametrize(
    "args, expected",
    [
        (("--top-p", "2"), "--top-p: 2: must be <= 1"),
        (("--temperature", "-1"), "--temperature: -1: must be >= 0"),
        (("--ttl", "-1"), "--ttl: -1: must be > 0"),
    ],
)
def test_run_names_the_sampling_and_cache_flags(kvbench, args, expected):
    code, _, err = kvbench("run", SHARED_2K, "--requests", "2", *args)
    one_line_error(code, err, expected)
    assert "top_p" not in err and "ttl_s" not in err


def test_checked_renames_a_leading_field_only():
    def bad():
        raise ValueError("hash_bits must be between 8 and 256 for sha256, got 4")

    with pytest.raises(InputError, match=r"^--bits: must be between 8 and 256 for sha256, got 4$"):
        checked(bad, {"hash_bits": "--bits"})
    assert user_named("top_p: 2 is out of range", {"top_p": "scenario key run.top_p"}) == (
        "scenario key run.top_p: 2 is out of range"
    )
    assert user_named("the hash_bits are fine", {"hash_bits": "--bits"}) == "the hash_bits are fine"
    assert user_named("hash_bitsy", {"hash_bits": "--bits"}) == "hash_bitsy"


def test_an_error_line_keeps_line_numbers_and_brackets_as_written(kvbench, tmp_path):
    """Rich rendered ``:100:`` as an emoji (``trace.jsonl💯 field``) and would eat ``[...]`` as
    markup; the error console prints the message as written (cli._error_console)."""
    rows = [
        f'{{"timestamp": {i}, "input_length": 10, "output_length": 1, "hash_ids": [1]}}' for i in range(99)
    ]
    rows.append('{"timestamp": 100, "input_length": "x", "output_length": 1, "hash_ids": [1]}')
    trace = tmp_path / "t[1].jsonl"
    trace.write_text("\n".join(rows) + "\n")
    code, _, err = kvbench("sim", str(trace))
    assert code == 2
    assert f"{trace}:100: field 'input_length'" in " ".join(err.split())  # soft-wrapped on a narrow terminal
