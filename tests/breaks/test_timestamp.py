"""``kvbench break timestamp``: the header on top kills every hit, at the end the hits come back."""

import pytest

from kvbench.breaks.timestamp import TimestampConfig, first_difference, run_timestamp, timestamp_table
from kvbench.commands.break_tables import verdict_table
from kvbench.workloads.generators import HeaderPlacement


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 4]) == 2
    assert first_difference([1, 2, 3], [9, 2, 3]) == 0
    assert first_difference([1, 2], [1, 2, 3]) == 2  # a prefix: they differ where the shorter ends
    assert first_difference([1, 2, 3], [1, 2, 3]) is None


def test_config_is_validated():
    with pytest.raises(ValueError, match="num_requests"):
        TimestampConfig(num_requests=1)
    with pytest.raises(ValueError, match="question_tokens"):
        TimestampConfig(question_tokens=8)


def test_header_on_top_destroys_the_hits_and_at_the_end_they_come_back(small_model, tokenizer):
    config = TimestampConfig(num_requests=3, system_tokens=64, question_tokens=16, max_tokens=2)
    result = run_timestamp(small_model, config, tokenizer)
    none, start, end = (result.variant(p) for p in HeaderPlacement)
    assert start.run.summary.token_hit_rate == 0
    assert start.first_difference_block == 0  # the header lies in block 0
    # 3 + 64 + 2 + 3 + 16 + 2 + 3 = 93 tokens; the first 72 (4 full blocks) are shared without header.
    assert none.run.summary.token_hit_rate == pytest.approx(2 * 64 / (3 * 93))
    assert end.run.summary.token_hit_rate > 0.3
    assert end.first_difference_block >= 4  # after the 64-token system prompt
    rows = [row for table in result.parquet_tables() for row in table.rows]
    assert {row["variant"] for row in rows} == {"none", "start", "end"} and len(rows) == 9
    assert "verdict" in str(verdict_table(timestamp_table(result)).caption)
