"""``kvbench break ... --engine paged``: the engine experiments on the paged engine (real model), and the
one-line refusals of those that do not apply to it."""

import pyarrow.parquet as pq
import pytest
from test_head_first import scenarios  # noqa: F401 - the fixture (two tiny multi-prefix scenarios)

from kvbench.breaks.head_first import HeadFirstConfig, run_head_first
from kvbench.breaks.timestamp import TimestampConfig, run_timestamp
from kvbench.results.parquet import read_metadata
from kvbench.workloads.generators import HeaderPlacement


def test_timestamp_on_the_paged_engine_hits_as_the_copy_engine(small_model, tokenizer):
    config = TimestampConfig(num_requests=3, system_tokens=64, question_tokens=16, max_tokens=2)
    copy = run_timestamp(small_model, config, tokenizer)
    paged = run_timestamp(small_model, TimestampConfig(**{**vars(config), "engine": "paged"}), tokenizer)
    for placement in HeaderPlacement:
        on_copy, on_paged = copy.variant(placement).run, paged.variant(placement).run
        assert on_paged.column("cached_prompt_tokens") == on_copy.column("cached_prompt_tokens")
        assert [r.output_token_ids for r in on_paged.results] == [r.output_token_ids for r in on_copy.results]
        assert all(row.result.kv_load_ms == 0.0 for row in on_paged.rows)  # a hit copies nothing
    assert paged.variant(HeaderPlacement.START).run.summary.token_hit_rate == 0


def test_head_first_on_the_paged_engine_is_predicted_tail_first(small_model, scenarios):  # noqa: F811
    config = HeadFirstConfig(scenarios=scenarios, num_engine_requests=8, max_tokens=2, engine="paged")
    result = run_head_first(small_model, config)
    tail, head = (result.engine_run(order) for order in ("tail-first", "head-first"))
    assert all(row.result.status == "ok" for row in tail.rows + head.rows)
    # tail first: the vLLM-faithful pool predicts the paged engine exactly; head first it does not model
    assert tail.column("cached_prompt_tokens") == tail.column("expected_cached_tokens")
    assert head.column("expected_cached_tokens") == [None] * 8
    assert head.summary.token_hit_rate <= tail.summary.token_hit_rate
    assert result.metadata()["config"]["engine"] == "paged"


def test_shared_salt_cli_on_the_paged_engine(kvbench, tmp_path):
    out = tmp_path / "salt.parquet"
    code, stdout, err = kvbench(
        "break", "shared-salt", "--engine", "paged", "--trials", 2, "--prompt-tokens", 16, "--out", out
    )
    assert code == 0, err
    rows = pq.read_table(out).to_pylist()
    # 2 variants x 2 trials x (A's prompt + 2 guesses of B)
    assert "verdict" in stdout and len(rows) == 2 * 2 * 3
    hit: dict[tuple[str, str], set[bool]] = {}
    for row in (r for r in rows if r["tenant"] == "b"):
        hit.setdefault((row["variant"], row["probe"]), set()).add(row["cached_prompt_tokens"] > 0)
    # the pool shares A's blocks with B's correct guess (every trial) unless their salts differ
    assert hit == {
        ("unsalted", "correct-guess"): {True},
        ("unsalted", "wrong-guess"): {False},
        ("salted", "correct-guess"): {False},
        ("salted", "wrong-guess"): {False},
    }
    assert read_metadata(out)["config"]["engine"] == "paged"


@pytest.mark.parametrize(
    "experiment,needle", [("views", "no view to leak"), ("tiny-hash", "lockstep replica")]
)
def test_experiments_not_on_the_paged_engine_say_why_in_one_line(kvbench, experiment, needle):
    code, _, err = kvbench("break", experiment, "--engine", "paged")
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err
