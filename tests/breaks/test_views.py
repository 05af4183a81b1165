"""``kvbench break views``: views keep far more than the configured bytes alive, copies do not."""

import pytest

from kvbench.breaks.views import ViewsConfig, plot_views, run_views, views_table
from kvbench.commands.break_tables import verdict_table

BLOCK_BYTES = 32 * 1024  # the small model: 2 layers x 2 (K, V) x 2 heads x 64 x 4 bytes x 16 tokens


def test_views_hold_more_than_configured_and_copies_stay_within(small_model, tokenizer, tmp_path):
    config = ViewsConfig(
        num_requests=8, system_tokens=64, question_tokens=16, max_tokens=2, cache_bytes=8 * BLOCK_BYTES
    )
    result = run_views(small_model, config, tokenizer)
    assert result.configured_kv_bytes == 8 * BLOCK_BYTES
    copies, views = result.run("copies"), result.run("views")
    for row in copies.rows:
        assert row.extra["held_kv_bytes"] == row.extra["nominal_kv_bytes"] <= result.configured_kv_bytes
    assert max(views.column("nominal_kv_bytes")) <= result.configured_kv_bytes  # what the cache believes
    assert result.peak("views", "held_kv_bytes") > 2 * result.configured_kv_bytes  # what it really keeps
    assert all(row.extra["rss_bytes"] > 0 for row in views.rows)
    assert "verdict" in str(verdict_table(views_table(result)).caption)
    assert plot_views(result, tmp_path / "views.png").stat().st_size > 0


def test_config_is_validated():
    with pytest.raises(ValueError, match="cache_bytes"):
        ViewsConfig(cache_bytes=0)
