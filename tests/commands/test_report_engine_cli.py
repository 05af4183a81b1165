"""``kvbench report`` shows the engine (``run.engine``), its KV memory (``run.kv_memory``) and
``--verify``'s logit counts (``run.verify_logits``) of real ``kvbench run`` files; a file without
them (written before the keys existed) still reports, ``-`` in those rows."""

import html

import pyarrow.parquet as pq
import pytest
from browser import assert_renders_in_chromium
from tiny_scenarios import SHARED_PREFIX

from kvbench.results.files import load_results
from kvbench.results.parquet import read_metadata, write_table
from kvbench.results.report import summary_tables


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A paged ``--verify`` run, a copy run, and the paged file with the three keys removed (an older
    file)."""
    from kvbench.cli import main

    folder = tmp_path_factory.mktemp("runs")
    scenario = folder / "tiny.toml"
    scenario.write_text(SHARED_PREFIX)
    paged, copy, old = folder / "paged.parquet", folder / "copy.parquet", folder / "old.parquet"
    for out, extra in ((paged, ["--engine", "paged", "--verify"]), (copy, [])):
        try:
            main(["run", str(scenario), "--requests", "3", "--max-tokens", "4", *extra, "--out", str(out)])
        except SystemExit as exit_:
            assert exit_.code in (0, None)
    metadata = read_metadata(paged)
    for key in ("engine", "kv_memory", "verify_logits"):
        del metadata["run"][key]
    write_table(old, pq.read_table(paged), metadata)
    return paged, copy, old


def mib(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:,.1f}"


def test_the_run_table_has_engine_memory_and_verify_rows(runs):
    paged, copy, old = runs
    [table] = summary_tables(load_results([paged, copy, old]))
    cells = {row[0]: row[1:] for row in table.rows}
    engine, memory, logits = (
        read_metadata(paged)["run"][k] for k in ("engine", "kv_memory", "verify_logits")
    )
    assert engine["num_pool_blocks"] == 64  # the scenario's cache_size
    assert cells["engine"] == (
        f"paged: max_num_seqs {engine['max_num_seqs']:,}, max_num_batched_tokens "
        f"{engine['max_num_batched_tokens']:,}, 64-block pool ({mib(engine['pool_bytes'])} MiB)",
        "copy",
        "-",
    )
    assert cells["KV pool held, running + cached: peak / end (MiB)"] == (
        f"{mib(memory['peak_held_kv_bytes'])} / {mib(memory['end_held_kv_bytes'])}",
        "-",
        "-",
    )
    copy_memory = read_metadata(copy)["run"]["kv_memory"]
    assert cells["KV held: cache blocks at end + largest contiguous copy (MiB)"] == (
        "-",
        f"{mib(copy_memory['end_held_kv_bytes'])} + {mib(copy_memory['peak_contiguous_kv_bytes'])}",
        "-",
    )
    # 3 greedy requests x 4 tokens
    assert logits["num_compared_tokens"] == 3 * 4 and logits["num_mismatches"] == 0
    assert cells[f"argmax flips near ties / mismatches (tol {logits['tie_tolerance_nats']:g} nats)"] == (
        f"{logits['num_flips_near_ties']} / 0",
        "-",
        "-",
    )
    assert cells["max |logprob diff| vs cache-off (nats)"] == (
        f"{logits['max_abs_logprob_diff']:.2e}",
        "-",
        "-",
    )


def test_report_command_and_page_show_them_in_a_browser(kvbench, runs, tmp_path):
    paged, copy, old = runs
    code, stdout, stderr = kvbench("report", paged, copy, old, "--out", tmp_path / "report")
    assert code == 0, stderr
    assert "Traceback" not in stderr and "KV pool held" in stdout and "argmax flips near ties" in stdout
    page = (tmp_path / "report" / "report.html").read_text(encoding="utf-8")
    seqs = read_metadata(paged)["run"]["engine"]["max_num_seqs"]
    assert f"<td>engine</td><td>{html.escape(f'paged: max_num_seqs {seqs:,}')}" in page
    assert "<td>copy</td><td>-</td></tr>" in page  # the copy run's engine, and the older file's missing one
    assert "max |logprob diff| vs cache-off (nats)" in page
    # a real browser renders the page
    assert_renders_in_chromium((tmp_path / "report" / "report.html"), tmp_path)
