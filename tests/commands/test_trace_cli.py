"""``kvbench trace gen`` / ``kvbench trace stats`` end to end, and text workloads through ``kvbench sim``."""

import json
import re
from pathlib import Path

import pytest
from cli_and_rows import file_fixture

REPO = Path(__file__).resolve().parents[2]

SMALL_ARGS = {
    "shared-prefix": ["--num-requests", "12", "--system-tokens", "300", "--question-tokens", "30"],
    "multi-prefix": [
        "--num-prefixes",
        "3",
        "--prefix-tokens",
        "100",
        "--unique-tokens",
        "20",
        "--num-requests",
        "20",
        "--popularity",
        "rr",
    ],
    "chat": ["--num-conversations", "4", "--turns", "uniform:2,4", "--system-tokens", "80"],
    "agent": ["--num-agents", "3", "--steps", "3", "--system-tokens", "500", "--observation-tokens", "60"],
    "one-off": ["--num-requests", "8", "--prompt-tokens", "50"],
}

# A Mooncake trace of two requests (600 and 1024 prompt tokens) sharing their first hash block.
mooncake = file_fixture(
    '{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}\n'
    '{"timestamp": 7, "input_length": 1024, "output_length": 4, "hash_ids": [1, 3]}\n',
    "mooncake.jsonl",
)


def reuse_row(out, block_size):
    """The cells of the reuse table's row for ``block_size``."""
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│") if c.strip()]
        if cells and cells[0] == str(block_size) and len(cells) == 5:
            return cells
    raise AssertionError(f"no row for block size {block_size} in:\n{out}")


@pytest.mark.parametrize("kind", sorted(SMALL_ARGS))
def test_gen_then_stats(kvbench, tmp_path, kind):
    out = tmp_path / f"{kind}.jsonl"
    code, stdout, stderr = kvbench("trace", "gen", kind, *SMALL_ARGS[kind], "-o", out)
    assert code == 0, stderr
    assert re.search(r"wrote [\d,]+ requests", stdout) and out.exists()
    code, stdout, stderr = kvbench("trace", "stats", out)
    assert code == 0, stderr
    assert "prompt" in stdout and "output budget" in stdout
    for block_size in (16, 64):
        ideal, last, partial, reusable = (float(c) for c in reuse_row(stdout, block_size)[1:])
        assert ideal + last + partial == pytest.approx(reusable, abs=2e-4)


def test_shared_prefix_stats_numbers(kvbench, tmp_path):
    out = tmp_path / "shared.jsonl"
    assert kvbench("trace", "gen", "shared-prefix", *SMALL_ARGS["shared-prefix"], "-o", out)[0] == 0
    code, stdout, _ = kvbench("trace", "stats", out, "--block-sizes", "16")
    assert code == 0
    assert "12 requests, 12 sessions" in " ".join(stdout.split())  # the title may wrap
    per_request = 3 + 300 + 2 + 3 + 30 + 2 + 3
    assert f"{per_request:,}" in stdout and f"{12 * per_request:,}" in stdout
    shared = (3 + 300 + 2 + 3) // 16 * 16
    assert reuse_row(stdout, 16)[1] == f"{11 * shared / (12 * per_request):.4f}"


def test_same_seed_gives_identical_files_from_the_cli(kvbench, tmp_path):
    paths = [tmp_path / f"{name}.jsonl" for name in ("a", "b", "c")]
    for path, seed in zip(paths, (3, 3, 4)):
        assert kvbench("trace", "gen", "chat", *SMALL_ARGS["chat"], "--seed", seed, "-o", path)[0] == 0
    assert paths[0].read_bytes() == paths[1].read_bytes() != paths[2].read_bytes()


@pytest.mark.parametrize("where, first", [("start", True), ("end", False)])
def test_volatile_header_flags(kvbench, tmp_path, where, first):
    out = tmp_path / "v.jsonl"
    code, _, stderr = kvbench(
        "trace",
        "gen",
        "shared-prefix",
        *SMALL_ARGS["shared-prefix"],
        "--volatile-header",
        "--volatile-header-at",
        where,
        "-o",
        out,
    )
    assert code == 0, stderr
    system = json.loads(out.read_text().splitlines()[2])["messages"][0]["content"]
    lines = system.splitlines()
    assert (lines[0] if first else lines[-1]).startswith("Current time: ")


def test_mooncake_conversion(kvbench, mooncake, tmp_path):
    out = tmp_path / "text.jsonl"
    code, stdout, stderr = kvbench("trace", "gen", "mooncake", mooncake, "-o", out)
    assert code == 0, stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records[0]["generator"] == "mooncake-text"
    assert [r["expected_prompt_tokens"] for r in records[1:]] == [600, 1024]
    code, stdout, _ = kvbench("trace", "stats", out, "--block-sizes", "512")
    assert code == 0 and reuse_row(stdout, 512)[1] == f"{512 / 1624:.4f}"


def test_sim_replays_a_generated_trace(kvbench, tmp_path):
    out = tmp_path / "agent.jsonl"
    assert kvbench("trace", "gen", "agent", *SMALL_ARGS["agent"], "-o", out)[0] == 0
    code, stdout, stderr = kvbench(
        "sim", out, "--sizes", "64,4096", "--workers", "1", "--out", tmp_path / "sim.parquet"
    )
    assert code == 0, stderr
    assert "token hit" in stdout and "block size 16" in stdout


@pytest.mark.parametrize("scenario", ["shared_2k", "chat", "agent"])
def test_sim_runs_the_text_scenarios(kvbench, tmp_path, scenario):
    code, stdout, stderr = kvbench(
        "sim", REPO / "scenarios" / f"{scenario}.toml", "--sizes", "4096", "--out", tmp_path / "sim.parquet"
    )
    assert code == 0, stderr
    assert f"kvbench sim: {scenario}" in stdout


def test_bad_options_and_files_exit_2_with_one_line(kvbench, tmp_path):
    code, _, stderr = kvbench(
        "trace", "gen", "shared-prefix", "--question-tokens", "3", "-o", tmp_path / "x.jsonl"
    )
    assert code == 2 and "--question-tokens must" in stderr
    code, _, stderr = kvbench("trace", "gen", "chat", "--turns", "poisson:3", "-o", tmp_path / "x.jsonl")
    assert code == 2 and "unknown distribution 'poisson'" in stderr
    code, _, stderr = kvbench("trace", "stats", tmp_path / "missing.jsonl")
    assert code == 2 and "no such file" in stderr
    code, _, stderr = kvbench(
        "trace", "gen", "mooncake", tmp_path / "missing.jsonl", "-o", tmp_path / "x.jsonl"
    )
    assert code == 2 and "no such file" in stderr


def one_off_lines(kvbench, out) -> list[str]:
    """The lines of a small one-off trace (8 requests of 50 prompt tokens) written to ``out``."""
    assert kvbench("trace", "gen", "one-off", *SMALL_ARGS["one-off"], "-o", out)[0] == 0
    return out.read_text().splitlines()


def test_stats_names_the_bad_line(kvbench, tmp_path):
    out = tmp_path / "t.jsonl"
    lines = one_off_lines(kvbench, out)
    lines[3] = lines[3].replace('"max_tokens":64', '"max_tokens":"lots"')
    out.write_text("\n".join(lines) + "\n")
    code, _, stderr = kvbench("trace", "stats", out)
    assert code == 2
    assert f"{out}:4: field 'max_tokens'" in stderr and len(stderr.strip().splitlines()) == 1


def test_a_count_mismatch_is_reported(kvbench, tmp_path):
    out = tmp_path / "t.jsonl"
    lines = one_off_lines(kvbench, out)
    header = json.loads(lines[0])
    header["content_hash"] = None
    lines[0] = json.dumps(header)
    record = json.loads(lines[2])
    assert record["expected_prompt_tokens"] == 3 + 50 + 2 + 3  # ChatML around a 50-token user message
    record["expected_prompt_tokens"] += 1
    lines[2] = json.dumps(record)
    out.write_text("\n".join(lines) + "\n")
    code, _, stderr = kvbench("sim", out, "--sizes", "64", "--out", tmp_path / "s.parquet")
    assert code == 2 and "renders to 58 tokens" in stderr and "field 'expected_prompt_tokens'" in stderr


def test_bad_scenario_key_names_file_line_and_field(kvbench, tmp_path):
    scenario = tmp_path / "s.toml"
    scenario.write_text('[workload]\nkind = "agent"\nnum_agents = 2\nsteps = "uniform:5,1"\n')
    code, _, stderr = kvbench("sim", scenario)
    assert code == 2 and f"{scenario}:4: field 'workload.steps'" in stderr


def test_scenarios_can_replay_a_trace_file_or_convert_mooncake(kvbench, mooncake, tmp_path):
    trace = tmp_path / "traces" / "chat.jsonl"
    assert kvbench("trace", "gen", "chat", *SMALL_ARGS["chat"], "-o", trace)[0] == 0
    scenarios = {
        "replay.toml": '[workload]\nkind = "trace"\npath = "traces/chat.jsonl"\n',
        "text.toml": '[workload]\nkind = "mooncake-text"\npath = "mooncake.jsonl"\n',
    }
    for name, text in scenarios.items():
        (tmp_path / name).write_text(text)
        code, stdout, stderr = kvbench(
            "sim", tmp_path / name, "--sizes", "64", "--workers", "1", "--out", tmp_path / "s.parquet"
        )
        assert code == 0, stderr
    assert "block size 512" in stdout and f"{512 / 1624:.4f}" in stdout  # mooncake-text defaults to 512


def test_trace_import_writes_a_trace_that_reads_back_and_names_bad_rows(kvbench, tmp_path):
    source = tmp_path / "b.csv"
    source.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "1.0,ChatGPT,50,5,55,API log\n2.5,ChatGPT,x,5,5,API log\n4.0,ChatGPT,70,7,77,API log\n"
    )
    out = tmp_path / "t.jsonl"
    code, _, err = kvbench("trace", "import", "burstgpt", source, "-o", out)
    assert code == 2 and f"{source}:3: field 'Request tokens'" in err and "Traceback" not in err
    code, stdout, err = kvbench("trace", "import", "burstgpt", source, "-o", out, "--skip-bad")
    assert code == 0 and "imported 2 requests" in stdout and "skipped 1 bad row(s)" in err
    code, stdout, _ = kvbench("trace", "stats", out)
    assert code == 0 and "120" in stdout  # 50 + 70 prompt tokens
    code, _, err = kvbench("trace", "import", "jsonl", source, "-o", out, "--block-size", "16")
    assert code == 2 and "--block-size must not be given for jsonl" in err
