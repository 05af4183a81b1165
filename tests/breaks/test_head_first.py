"""``kvbench break head-first``: head-first release loses hits at some size, on the simulator and the
engine."""

import pytest

from kvbench.breaks.head_first import HeadFirstConfig, engine_table, run_head_first, sweep_table
from kvbench.commands.break_tables import verdict_table

SCENARIO = """
[workload]
kind = "multi-prefix"
num_prefixes = 4
prefix_tokens = 96
unique_tokens = 20
num_requests = 120
popularity = "{popularity}"
seed = 0

[cache]
block_size = 16

[sim]
sizes = [8, 16, 20, 24, 32]
"""


@pytest.fixture
def scenarios(tmp_path):
    paths = []
    for popularity in ("zipf", "rr"):
        path = tmp_path / f"tiny_{popularity}.toml"
        path.write_text(SCENARIO.format(popularity=popularity))
        paths.append(path)
    return tuple(paths)


def test_head_first_is_worse_at_some_size_and_on_the_engine(small_model, scenarios):
    config = HeadFirstConfig(scenarios=scenarios, num_engine_requests=8, max_tokens=2)
    result = run_head_first(small_model, config)
    gaps = [tail.token_hit_rate - head.token_hit_rate for s in result.sweeps for tail, head in s.pairs]
    assert max(gaps) > 0.2 and min(gaps) >= 0  # never better, much worse somewhere
    tail, head = (result.engine_run(order) for order in ("tail-first", "head-first"))
    assert head.summary.token_hit_rate < tail.summary.token_hit_rate
    for run in (tail, head):  # concurrency 1, no TTL: the engine does exactly what the simulator predicts
        assert run.column("cached_prompt_tokens") == run.column("expected_cached_tokens")
    assert "orphans" in str(verdict_table(sweep_table(result)).caption)
    assert "verdict" in str(verdict_table(engine_table(result)).caption)
    engine_rows, sim_rows = (table.rows for table in result.parquet_tables())
    assert len(engine_rows) == 16 and len(sim_rows) == 2 * 2 * 5


def test_config_is_validated():
    with pytest.raises(ValueError, match="sizes_blocks"):
        HeadFirstConfig(sizes_blocks=(0,))
    with pytest.raises(ValueError, match="num_engine_requests"):
        HeadFirstConfig(num_engine_requests=1)
