"""The sample files kvbench ships (kvbench/data/samples/, package data; samples/ links there): one per
``trace import`` format, each importing whole, and the Mooncake sample the shipped scenario replays,
with its licence beside it (documented commands work in a fresh clone)."""

import fnmatch
import tomllib
from pathlib import Path

import pytest

from kvbench.run.source import load_source
from kvbench.workloads.formats.importing import IMPORTERS, ImportConfig, import_trace

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "kvbench" / "data" / "samples"
SAMPLE_OF_FORMAT = {
    "jsonl": "prompts.jsonl",
    "sharegpt": "sharegpt.json",
    "burstgpt": "burstgpt.csv",
    "hash-ids": "hash_ids.jsonl",
    "mooncake": "mooncake_conversation.jsonl",
}
NUM_MOONCAKE_LINES = 300


def test_every_import_format_has_a_sample():
    assert set(SAMPLE_OF_FORMAT) == set(IMPORTERS)


@pytest.mark.parametrize("fmt", sorted(SAMPLE_OF_FORMAT))
def test_each_sample_imports_whole(fmt, tokenizer):
    limit = 20 if fmt == "mooncake" else None  # 20 of its 300 lines keep the 512-token text small
    imported = import_trace(
        ImportConfig(fmt, str(SAMPLES / SAMPLE_OF_FORMAT[fmt]), num_requests=limit), tokenizer
    )
    sessions = {request.session_id for request in imported.trace.requests}
    assert imported.num_skipped == 0 and len(imported.trace.requests) >= 6
    if fmt != "mooncake":  # every other sample has a multi-turn session
        assert len(sessions) < len(imported.trace.requests)


def test_the_samples_are_package_data_with_their_licence():
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"][
        "package-data"
    ]["kvbench"]
    files = sorted(p.relative_to(REPO / "kvbench").as_posix() for p in SAMPLES.iterdir())
    assert [f for f in files if not any(fnmatch.fnmatch(f, pattern) for pattern in patterns)] == []
    assert "Apache License" in (SAMPLES / "LICENSE-APACHE").read_text(encoding="utf-8")
    assert "kvcache-ai/Mooncake" in (SAMPLES / "NOTICE.md").read_text(encoding="utf-8")
    assert (REPO / "samples").resolve() == SAMPLES


def test_the_mooncake_scenario_replays_the_shipped_sample():
    source = load_source("mooncake_conversation")
    assert len(source.requests) == NUM_MOONCAKE_LINES
    assert source.requests[0].num_tokens == 6758  # the trace's first line: input_length 6758


def test_the_mooncake_sample_is_the_trace_s_first_lines_unmodified(shared_data):
    full = (shared_data / "mooncake" / "conversation_trace.jsonl").read_text(encoding="utf-8").splitlines()
    assert (SAMPLES / "mooncake_conversation.jsonl").read_text(encoding="utf-8").splitlines() == full[
        :NUM_MOONCAKE_LINES
    ]
