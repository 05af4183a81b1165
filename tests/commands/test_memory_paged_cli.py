"""``kvbench memory sharing|waste --engine paged``: the paged engine measured next to the replay,
through the real CLI on the default model (short runs)."""

import re

import pytest
from cli_and_rows import one_error_line


def row(stdout, label):
    """The cells of the table row starting with ``label`` (rich box characters stripped)."""
    line = next(line for line in stdout.splitlines() if label in line)
    return [cell.strip() for cell in re.split(r"[│┃]", line) if cell.strip()]


def measured_sharing(kvbench, n: int, max_tokens: int) -> str:
    """What ``kvbench memory sharing --engine paged`` prints from "measured on the paged engine" on,
    for ``n`` samples of ``max_tokens`` tokens after a 40-token prompt (asserting that it exited 0)."""
    code, stdout, stderr = kvbench(
        "memory",
        "sharing",
        "--engine",
        "paged",
        "--n",
        n,
        "--prompt-tokens",
        40,
        "--max-tokens",
        max_tokens,
        "--no-plot",
    )
    assert code == 0, stderr
    return stdout[stdout.index("measured on the paged engine") :]


def test_sharing_measured_equals_the_replay(kvbench):
    measured = measured_sharing(kvbench, 4, 20)
    assert row(measured, "peak blocks held")[1:] == ["10", "10", "1.25 MiB", "1.25 MiB"]
    assert row(measured, "copy-on-write copies")[1:3] == ["3", "3"]
    assert row(measured, "prompt blocks shared (ref 4)")[1:3] == ["3", "3"]
    assert row(measured, "blocks in use after every sample finished")[1:3] == ["0", "0"]
    assert row(measured, "measured / replay peak")[-1] == "1.000"


def test_waste_measured_next_to_the_replay(kvbench, tmp_path):
    trace = tmp_path / "lengths.jsonl"
    trace.write_text(
        '{"arrival_ms": 0, "expected_prompt_tokens": 40, "max_tokens": 6}\n'
        '{"arrival_ms": 0, "expected_prompt_tokens": 21, "max_tokens": 4}\n'
    )
    code, stdout, stderr = kvbench(
        "memory", "waste", trace, "--pool", "1MiB", "--engine", "paged", "--no-plot"
    )
    assert code == 0, stderr
    measured = stdout[stdout.index("measured on the paged engine") :]
    assert row(measured, "requests served / refused")[1:] == ["2 / 0", "2 / 0"]
    held, share = row(measured, "blocks held (reserved)"), row(measured, "unfilled share")
    assert held[-1].endswith("/ 640 KiB")  # peak: 3 + 2 blocks of 128 KiB while both run
    assert float(share[-1].rstrip("%")) > 0


def test_replay_is_still_the_default(kvbench):
    code, stdout, _ = kvbench(
        "memory", "sharing", "--n", "2", "--prompt-tokens", "40", "--max-tokens", "4", "--no-plot"
    )
    assert code == 0 and "measured" not in stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (
            ["sharing", "--engine", "paged", "--beam-width", "2"],
            "--beam-width: the paged engine does not run beam search",
        ),
        (
            ["sharing", "--engine", "paged", "--model", "llama-3.1-8b"],
            "--engine paged runs the default model",
        ),
        (
            ["waste", "missing.jsonl", "--pool", "1MiB", "--engine", "paged", "--kv-dtype", "fp8"],
            "--engine paged runs the default model",
        ),
    ],
)
def test_bad_engine_combinations_are_one_line(kvbench, args, needle):
    code, _, stderr = kvbench("memory", *args, "--no-plot")
    assert needle in one_error_line(code, stderr)


def test_an_unknown_engine_is_refused_by_the_parser(kvbench):
    code, _, stderr = kvbench("memory", "sharing", "--engine", "bogus", "--no-plot")
    assert code == 2 and "--engine" in stderr and "Traceback" not in stderr


def test_sharing_beyond_the_context_is_refused_before_the_replay_prints(kvbench, tmp_path):
    plot = tmp_path / "sharing.png"
    code, stdout, stderr = kvbench(
        "memory", "sharing", "--engine", "paged", "--prompt-tokens", "9000", "--plot", plot
    )
    line = one_error_line(code, stderr)
    assert "--prompt-tokens 9000 --max-tokens 256" in line and "context of 8192 tokens" in line
    assert stdout.strip() == "" and not plot.exists()  # no replay table, no PNG


def test_one_sample_shares_no_block_in_the_replay_or_the_engine(kvbench):
    """n = 1: the prompt's 3 blocks sit at ref count 1; shared means ref count > 1 (vLLM copies on
    write only then), so both columns say 0."""
    measured = measured_sharing(kvbench, 1, 4)
    assert row(measured, "prompt blocks shared (ref 1)")[1:3] == ["0", "0"]
    assert row(measured, "peak blocks held")[1:3] == ["3", "3"]
