"""docs/results-reference.md names every results column and key the code writes, so the
page stays true: the Parquet schemas, the summary / save-result JSON / CSV keys, and the metadata of
real files (an in-process run, an HTTP run against a real ``kvbench serve``, a sim and a route file)."""

import json

import pyarrow.parquet as pq
import pytest
from cli_and_rows import measured_row, small_chat
from site_paths import code_spans, page_text

from kvbench.breaks.common import EXPERIMENT_FIELDS
from kvbench.commands.sim_sampled import SAMPLED_ROW_SCHEMA
from kvbench.peer.report import ROW_SCHEMA as PEER_SCHEMA
from kvbench.results.export import to_csv
from kvbench.results.load_sweep import LOAD_SWEEP_SCHEMA
from kvbench.results.result_json import result_dict
from kvbench.results.rows import rows_from_dicts
from kvbench.results.schema import RUN_SCHEMA
from kvbench.results.summary import SummaryOptions, summarize
from kvbench.results.sweep import SWEEP_SCHEMA

DOCUMENTED = code_spans(page_text("results-reference.md"))
# metadata values whose keys count
NESTED = (
    "run",
    "reconciliation",
    "live_turns",
    "server_cache",
    "machine_load",
)
RUN_NESTED = ("cache", "load", "trace", "kv_memory", "engine")


def undocumented(names) -> list[str]:
    return sorted(set(names) - DOCUMENTED)


@pytest.mark.parametrize(
    "schema",
    [RUN_SCHEMA, SAMPLED_ROW_SCHEMA, SWEEP_SCHEMA, LOAD_SWEEP_SCHEMA, PEER_SCHEMA],
    ids=["run", "sim", "sweep", "load_sweep", "peer"],
)
def test_every_schema_column_is_documented(schema):
    assert undocumented(schema.names) == []


def test_the_break_columns_are_documented():
    assert undocumented(field.name for field in EXPERIMENT_FIELDS) == []


def rows() -> list[dict]:
    made = []
    for index, ttft in enumerate((120.0, 80.0, 60.0)):
        row = measured_row(
            index,
            f"r{index}",
            prompt_tokens=100,
            cached_prompt_tokens=64 * index,
            expected_cached_tokens=64 * index,
            local_prompt_tokens=100,
            output_tokens=4,
            ttft_ms=ttft,
            tpot_ms=10.0,
            e2e_ms=ttft + 30,
            itl_ms=[10.0] * 3,
            sent_ms=index * 200.0,
            end_ms=index * 200.0 + ttft + 30,
            queue_ms=0.0,
        )
        made.append(row)
    return made


def test_every_summary_json_and_csv_key_is_documented():
    summary = summarize(rows_from_dicts(rows()), SummaryOptions(goodput=(("ttft", 100.0),)))
    result = result_dict(summary, {"run": {"backend": "openai"}}, rows_from_dicts(rows()), detailed=True)
    csv_columns = to_csv([{"path": "run.parquet", **result}]).splitlines()[0].split(",")
    assert undocumented(result) == [] and undocumented(csv_columns) == []


def metadata(path) -> dict:
    raw = pq.read_schema(path).metadata
    return {
        k.decode().removeprefix("kvbench."): json.loads(v)
        for k, v in raw.items()
        if k.startswith(b"kvbench.")
    }


def documented_keys_of(path) -> list[str]:
    """The file's columns, its metadata keys, and the keys inside the values documented key by key."""
    meta = metadata(path)
    names = set(pq.read_schema(path).names) | set(meta)
    for key in NESTED:
        names |= set(meta.get(key) or {})
    for key in RUN_NESTED:
        value = (meta.get("run") or {}).get(key)
        names |= set(value) if isinstance(value, dict) else set()
    return undocumented(names)


def test_sim_and_route_files_are_documented(kvbench, tmp_path):
    sim, route = tmp_path / "sim.parquet", tmp_path / "route.parquet"
    assert kvbench("sim", "chat", "--out", sim)[0] == 0
    assert kvbench("route", "chat", "--replicas", "2", "--out", route)[0] == 0
    assert documented_keys_of(sim) == [] and documented_keys_of(route) == []


@pytest.mark.engine
@pytest.mark.server
@pytest.mark.slow
def test_in_process_and_http_run_files_are_documented(kvbench, server, tmp_path):
    local, http = tmp_path / "local.parquet", tmp_path / "http.parquet"
    assert kvbench("run", "chat", "--requests", "2", "--max-tokens", "2", "--out", local)[0] == 0
    code, _, err = kvbench(*small_chat("run", server.url, 3), "--turns", "live", "--out", http)
    assert code == 0, err
    assert documented_keys_of(local) == [] and documented_keys_of(http) == []
