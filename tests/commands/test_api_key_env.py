"""A key given where its variable's name belongs is refused, and no key reaches a file."""

import pyarrow.parquet as pq
import pytest
from test_import_replay_http import SCENARIO  # a one-off [load] scenario: backend openai, base_url

from kvbench.results.parquet import read_metadata
from kvbench.results.secrets import REDACTED, looks_like_key, scrub, scrub_arguments

pytestmark = [pytest.mark.server]

KEY = "sk-proj-7Hq2ZfLw9XcVb3NmKp4RtYu8Ae1Sd6Gh"  # the shape of an OpenAI project key (made up)


@pytest.fixture
def scenario(tmp_path, server):
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.format(url=server.url))
    return path


def test_a_key_given_as_the_variable_name_is_refused_without_echoing_it(kvbench, scenario, tmp_path):
    out = tmp_path / "r.parquet"
    code, stdout, err = kvbench("run", scenario, "--api-key-env", KEY, "--out", out)
    assert code == 2
    assert err.count("\n") == 1 and "--api-key-env takes the name of the environment variable" in err
    assert KEY not in err + stdout and not out.exists()


def test_an_unset_variable_is_refused(kvbench, scenario, tmp_path, monkeypatch):
    monkeypatch.delenv("KVBENCH_TEST_NO_SUCH_KEY", raising=False)
    out = tmp_path / "r.parquet"
    code, _, err = kvbench("run", scenario, "--api-key-env", "KVBENCH_TEST_NO_SUCH_KEY", "--out", out)
    assert code == 2 and not out.exists()
    assert (
        err.strip()
        == "error: --api-key-env KVBENCH_TEST_NO_SUCH_KEY: no such environment variable is set (export it "
        "first)"
    )


def test_a_scenario_key_that_is_no_variable_name_is_refused(kvbench, server, tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.format(url=server.url) + f'api_key_env = "{KEY}"\n')
    code, _, err = kvbench("run", path, "--out", tmp_path / "r.parquet")
    assert code == 2 and "load.api_key_env" in err and KEY not in err


def test_a_key_pasted_anywhere_on_the_line_never_reaches_the_footer(kvbench, scenario, tmp_path, monkeypatch):
    monkeypatch.setenv("KVBENCH_TEST_KEY", KEY)
    out = tmp_path / "r.parquet"
    code, _, err = kvbench(
        "run", scenario, "--api-key-env", "KVBENCH_TEST_KEY", "--salt", KEY, "--no-preflight", "--out", out
    )
    assert code == 0, err
    assert len(pq.read_table(out)) == 2
    metadata = read_metadata(out)
    assert metadata["run"]["api_key_env"] == "KVBENCH_TEST_KEY"
    assert REDACTED in metadata["command_line"] and "KVBENCH_TEST_KEY" in metadata["command_line"]
    assert KEY.encode() not in out.read_bytes()


def test_what_looks_like_a_key():
    assert looks_like_key(KEY) and looks_like_key("hf_" + "a" * 30) and looks_like_key("x" * 8 + "Ab3" * 10)
    assert not looks_like_key("OPENAI_API_KEY") and not looks_like_key(
        "results/run-Shared2K-20261201-101010.parquet"
    )
    assert not looks_like_key("0" * 64 + "abcdef")  # a lower-case hex digest is not a key
    assert scrub_arguments(["kvbench", "--salt", "Zq8" * 12, f"--x={KEY}"]) == [
        "kvbench",
        "--salt",
        REDACTED,
        REDACTED,
    ]
    assert scrub({"a": [f"key {KEY}.", 3, -1.5], "b": "mine-12345678"}, ["mine-12345678"]) == {
        "a": [f"key {REDACTED}.", 3, -1.5],
        "b": REDACTED,
    }
