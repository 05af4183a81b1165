"""``kvbench explain RUN.parquet`` replays a run by the rules of what ran, on every kind of run: the
copy engine, the paged engine (with and without a host tier), a real ``kvbench serve`` with a
detected pool, and one with prefix caching off. Each run is explained, its top fix applied to the
same kind of run, and the re-run's hit rate must be the one the fix promised (within one block)."""

import json

import pyarrow.parquet as pq
import pytest
from serve_process import ServeProcess

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

BLOCK = 16
RUN = ("--concurrency", "1", "--max-tokens", "4")


@pytest.fixture
def trace(kvbench, tmp_path):
    """A small agent trace (3 runs of 3-4 steps, 3,521 prompt tokens): the shipped agent kind, scaled
    down so that a run takes seconds on a CPU."""
    path = tmp_path / "agent.jsonl"
    code, _, err = kvbench(
        "trace",
        "gen",
        "agent",
        "--num-agents",
        3,
        "--steps",
        "uniform:3,4",
        "--system-tokens",
        128,
        "--task-tokens",
        32,
        "--observation-tokens",
        "lognormal:40,0.3",
        "--final-tokens",
        8,
        "-o",
        path,
    )
    assert code == 0, err
    return path


def run(kvbench, trace, out, *flags):
    code, _, err = kvbench("run", trace, *RUN, "--out", out, *flags)
    assert code == 0, err
    return out


def explained(kvbench, path):
    code, stdout, err = kvbench("explain", path, "--format", "json")
    assert code == 0, err
    doc = json.loads(stdout)
    doc["bars"] = {row["step"]: row["tokens"] for row in doc["waterfall"]}
    return doc


def hit_tokens(path) -> tuple[int, int]:
    """(cached, prompt) tokens of a run's successful rows."""
    rows = [r for r in pq.read_table(path).to_pylist() if r["status"] == "ok"]
    return sum(r["cached_prompt_tokens"] for r in rows), sum(r["prompt_tokens"] for r in rows)


def applied(fix) -> list[str]:
    """The run (or serve) flags that apply ``fix`` to the same kind of run."""
    setting = fix["setting"]
    if fix["kind"] == "capacity":
        return ["--cache-size", str(setting["cache_size"])]
    if fix["kind"] == "block size":
        return ["--block-size", str(setting["block_size"]), "--cache-size", str(setting["cache_size"])]
    if fix["kind"] == "caching off":
        return ["--cache", "on", "--cache-size", str(setting["cache_size"])]
    raise AssertionError(f"no flags for fix {fix['kind']}")


def assert_reproduces(fix, after) -> None:
    cached, prompt = hit_tokens(after)
    assert abs(cached - fix["hit_rate_after"] * prompt) <= BLOCK, (fix, cached, prompt)


def served(kvbench, trace, out, *serve_flags):
    process = ServeProcess(*serve_flags)
    try:
        return run(kvbench, trace, out, "--backend", "openai", "--base-url", process.url)
    finally:
        process.stop()


@pytest.mark.parametrize(
    "engine",
    [
        ("--cache-size", "20"),
        ("--engine", "paged", "--cache-size", "30"),
        ("--engine", "paged", "--cache-size", "28", "--host-tier", "16"),
    ],
    ids=["copy", "paged", "paged-host-tier"],
)
def test_an_in_process_run_is_replayed_by_its_engine_and_its_top_fix_reproduces(
    kvbench, trace, tmp_path, engine
):
    before = run(kvbench, trace, tmp_path / "before.parquet", *engine)
    doc = explained(kvbench, before)
    assert doc["bars"]["lost to the server (reported below the cache)"] == 0
    assert doc["bars"]["lost to capacity evictions"] > 0
    cached, _ = hit_tokens(before)
    assert doc["bars"]["hit"] == cached
    kind = "paged engine: KV pool" if "paged" in engine else "copy engine: hash cache"
    assert kind in doc["title"]
    assert len(doc["notes"]) == ("--host-tier" in engine)  # a host tier has no replay: said once
    top = doc["fixes"][0]
    assert top["kind"] == "capacity" and top["hit_rate_before"] == pytest.approx(doc["bars"]["hit"] / 3521)
    assert all(f["kind"] != "host tier" for f in doc["fixes"])  # no engine here would reproduce it
    keep = [f for pair in zip(engine[::2], engine[1::2]) if pair[0] != "--cache-size" for f in pair]
    assert_reproduces(top, run(kvbench, trace, tmp_path / "after.parquet", *keep, *applied(top)))


def test_a_server_run_is_replayed_with_its_detected_pool_and_its_top_fix_reproduces(kvbench, trace, tmp_path):
    before = served(kvbench, trace, tmp_path / "before.parquet", "--cache-size", "20")
    doc = explained(kvbench, before)
    assert "server: hash cache of 20 blocks of 16 (detected)" in doc["title"]
    assert doc["bars"]["lost to the server (reported below the cache)"] == 0
    assert doc["bars"]["lost to capacity evictions"] > 0
    top = doc["fixes"][0]
    assert top["kind"] == "capacity"
    assert_reproduces(top, served(kvbench, trace, tmp_path / "after.parquet", *applied(top)))


def test_a_server_with_caching_off_is_explained_as_caching_off(kvbench, trace, tmp_path):
    before = served(kvbench, trace, tmp_path / "before.parquet", "--cache", "off")
    doc = explained(kvbench, before)
    assert "server: prefix caching off (detected)" in doc["title"]
    bars = doc["bars"]
    assert bars["lost to the server (reported below the cache)"] == 0 and bars["hit"] == 0
    assert bars["lost to prefix caching being off"] == bars["an ideal cache could hit"] - sum(
        bars[key] for key in ("lost to partial blocks (block floor)", "lost to the last-token rule")
    )
    top = doc["fixes"][0]
    assert top["kind"] == "caching off" and "turn prefix caching on" in top["change"]
    assert all(f["kind"] != "block size" for f in doc["fixes"])
    assert_reproduces(top, served(kvbench, trace, tmp_path / "after.parquet", *applied(top)))
