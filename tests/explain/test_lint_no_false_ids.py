"""``kvbench explain --lint`` flags ids, not words: no finding on any shipped scenario or on any
generated trace kind without a volatile header, and the request-id pattern takes digits, hex and
``id`` keys only."""

from pathlib import Path

import pytest

from kvbench.explain.sources import ExplainConfig, lint_file
from kvbench.explain.volatile import find_volatile

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "scenarios").glob("*.toml"))
KINDS = ("shared-prefix", "multi-prefix", "chat", "agent", "one-off")


@pytest.mark.parametrize(
    "text, found",
    [
        ("run destructive commands", None),
        ("call the tool, then session state", None),
        ("Run servicing125 redemption737", None),
        ("requestId=new_followtranslations", None),
        ("session-42ab", "session-42ab"),
        ("request req_8f3a9c done", "request req_8f3a9c"),
        ('"id": "call_abc123"', 'id": "call_abc123'),
        ("trace_id=7f3a9c21", "trace_id=7f3a9c21"),
    ],
)
def test_the_request_id_pattern_takes_ids_not_words(text, found):
    spans = [s.text for s in find_volatile(text, ("request id",))]
    assert spans == ([] if found is None else [found])


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.stem)
def test_no_shipped_scenario_has_a_lint_finding(scenario):
    report = lint_file(ExplainConfig(scenario))
    assert report.findings == [] and report.num_tokens_after_volatile == 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_no_generated_trace_without_a_volatile_header_has_a_lint_finding(kvbench, tmp_path, kind):
    path = tmp_path / f"{kind}.jsonl"
    code, _, err = kvbench("trace", "gen", kind, "-o", path)
    assert code == 0, err
    report = lint_file(ExplainConfig(path))
    assert report.findings == [] and report.num_tokens_after_volatile == 0
