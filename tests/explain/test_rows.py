"""Readable per-request rows and --lint: a request that lost only its own new tokens is a
count, excerpts are capped and marked, --lint ends with a summary per finding kind and 'N more omitted'."""

import numpy as np
from explain_traces import STABLE
from tiny_workloads import AGENT_WITH_HEADER

from kvbench.explain.content import CUT, EXCERPT_CHARS, excerpt
from kvbench.explain.lint import lint


def test_rows_of_requests_that_lost_only_their_own_new_tokens_collapse_into_a_count(kvbench):
    code, out, err = kvbench("explain", "scenarios/multi_prefix_rr.toml", "--requests", "40")
    assert code == 0, err
    assert "per request: the 0 that lost most" in out
    assert "40 requests lost only their own new tokens (not listed)" in " ".join(out.split())
    assert "this:" not in out  # no excerpt of random-token text for the expected unique questions
    code, out, err = kvbench(
        "explain", "scenarios/multi_prefix_rr.toml", "--requests", "40", "--cache-size", "256", "--show", "3"
    )
    flat = " ".join(out.split())
    assert code == 0 and "per request: the 3 that lost most" in out and "evicted (capacity)" in out
    assert (
        "8 requests lost only their own new tokens (not listed); 29 more omitted (--show N lists more)"
        in flat
    )
    assert "volatile value (counter)" not in out  # a number in random-token text is no volatile value


def test_excerpts_are_capped_and_the_cut_is_marked(tokenizer):
    ids = np.asarray(tokenizer.encode(STABLE), dtype=np.uint32)
    long = excerpt(tokenizer, ids, 40, width=30)
    before, after = long[1:-1].split("‖")
    assert before.startswith(CUT) and len(before) == EXCERPT_CHARS + 1
    assert after.endswith(CUT) and len(after) == EXCERPT_CHARS + 1
    short = excerpt(tokenizer, ids, 2, width=2)
    assert (
        CUT not in short
        and short
        == "…" + tokenizer.decode(ids[:2].tolist()) + "‖" + tokenizer.decode(ids[2:4].tolist()) + "…"
    )


def test_lint_ends_with_a_summary_per_kind_and_says_how_many_more(kvbench, chat, tokenizer, tmp_path):
    top = [
        chat(i, [("system", f"Current time: 2025-01-01 10:00:{i:02d}\n" + STABLE), ("user", "Hi?")])
        for i in range(5)
    ]
    report = lint(top, tokenizer)
    assert report.by_kind() == [("stable first", "date", 5, "r0")]
    trace = tmp_path / "agent.jsonl"
    code, _, err = kvbench(*AGENT_WITH_HEADER, "-o", trace)
    assert code == 0, err
    code, out, err = kvbench("explain", trace, "--lint", "--show", "4")
    flat = " ".join(out.split())
    assert code == 0, err
    num_findings = int(flat.split("│ findings │ ")[1].split()[0].replace(",", ""))
    assert f"{num_findings - 4:,} more omitted (--show N lists more)" in flat
    assert out.rstrip().endswith("┘") and "findings per kind" in out.split("more omitted")[1]
    assert "│ stable first │ timestamp" in out and "│ append-only  │ history rewritten │" in out
