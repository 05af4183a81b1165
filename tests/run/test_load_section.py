"""A scenario's ``[load]`` section under the flags, and the OpenAI environment variables as defaults."""

import math

import pytest

from kvbench.backends.openai.hygiene import Hygiene
from kvbench.errors import InputError
from kvbench.run.config import (
    DEFAULT_BASE_URL,
    BackendKind,
    RunConfig,
    RunFlags,
    Schedule,
    ServerFlags,
    TurnMode,
)
from kvbench.run.load_section import load_backend, read_load_section, with_load_section
from kvbench.run.loop import LoadConfig

BASE = """
[workload]
kind = "one-off"
num_requests = 3
prompt_tokens = 20
"""
LOAD = (
    BASE
    + """
[load]
backend = "openai"
base_url = "http://10.0.0.9:8000/v1"
api_key_env = "TEAM_KEY"
model = "llama"
concurrency = 4
duration = 30.0
hygiene = "nonce"
schedule = "trace"
time_scale = 10
turns = "live"
"""
)


def scenario(tmp_path, text, name="s.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_load_section_fills_what_no_flag_gave(tmp_path):
    path = scenario(tmp_path, LOAD)
    assert (
        load_backend(path) is BackendKind.OPENAI
        and load_backend(scenario(tmp_path, BASE, "plain.toml")) is BackendKind.INPROCESS
    )
    config = with_load_section(
        RunConfig(
            path, BackendKind.OPENAI, run=RunFlags(concurrency=2), server=ServerFlags(hygiene=Hygiene.SALT)
        )
    )
    server = config.server
    assert (server.url, server.key_variable, config.model.path) == (
        "http://10.0.0.9:8000/v1",
        "TEAM_KEY",
        "llama",
    )
    assert config.run.concurrency == 2 and server.hygiene is Hygiene.SALT  # the flags win
    assert (server.duration, server.schedule, server.trace_time_scale) == (30.0, Schedule.TRACE, 10.0)
    assert server.turns is TurnMode.LIVE
    flagged = with_load_section(
        RunConfig(path, BackendKind.OPENAI, server=ServerFlags(turns=TurnMode.SCRIPTED))
    )
    assert flagged.server.turns is TurnMode.SCRIPTED  # the flag wins


def test_an_in_process_run_ignores_the_load_section(tmp_path):
    config = RunConfig(scenario(tmp_path, LOAD))
    assert with_load_section(config) is config


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('api_key = "sk-123"', r"s.toml: field 'load.api_key': a key never goes in a file"),
        ("rate = -1", r"s.toml:\d+: field 'load.rate': rate must be a positive number"),
        (
            'hygiene = "maybe"',
            r"s.toml:\d+: field 'load.hygiene': expected 'salt', 'nonce' or 'off', got 'maybe'",
        ),
        ("turbo = true", r"s.toml:\d+: field 'load.turbo': unknown key"),
        (
            'turns = "replayed"',
            r"s.toml:\d+: field 'load.turns': expected 'scripted' or 'live', got 'replayed'",
        ),
    ],
)
def test_bad_load_keys_are_one_line_errors(tmp_path, extra, message):
    with pytest.raises(InputError, match=message):
        read_load_section(scenario(tmp_path, BASE + "\n[load]\n" + extra + "\n"))


def test_a_rate_in_the_file_and_a_trace_schedule_flag_conflict_clearly(tmp_path):
    path = scenario(tmp_path, BASE + "\n[load]\nrate = 2.0\n")
    with pytest.raises(ValueError, match="drop --request-rate"):
        with_load_section(RunConfig(path, BackendKind.OPENAI, server=ServerFlags(schedule=Schedule.TRACE)))


def test_openai_base_url_is_the_default_below_flags_and_files(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert ServerFlags().url == DEFAULT_BASE_URL.rstrip("/")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://gpu-box:9000/v1/")
    assert ServerFlags().url == "http://gpu-box:9000/v1"
    assert ServerFlags(base_url="http://flag:1/v1").url == "http://flag:1/v1"
    assert ServerFlags().key_variable == "OPENAI_API_KEY"


def test_schedule_trace_flags_build_a_trace_replay():
    with pytest.raises(ValueError, match="--time-scale applies to --schedule trace"):
        ServerFlags(time_scale=2.0)
    with pytest.raises(ValueError, match="--time-scale: -1"):
        ServerFlags(schedule=Schedule.TRACE, time_scale=-1)
    assert ServerFlags(schedule=Schedule.TRACE).trace_time_scale == 1.0
    assert math.isinf(ServerFlags(schedule=Schedule.TRACE).rate_per_s)
    assert LoadConfig(
        concurrency=None, time_scale=ServerFlags(schedule=Schedule.TRACE).trace_time_scale
    ).is_open_loop
