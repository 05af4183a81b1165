"""A scenario's ``[load]`` section: how ``kvbench run --backend openai`` sends, kept with the traffic.

Keys (each the flag of the same name; every one optional)::

    [load]
    backend = "openai"            # --backend (used when the flag is not given)
    base_url = "http://127.0.0.1:8000/v1"
    api_key_env = "MY_KEY"        # the variable's name; a key itself is refused here
    model = "served-name"
    rate = 4.0                    # --request-rate, requests/s
    burstiness = 1.0
    concurrency = 8
    duration = 60.0               # s
    hygiene = "salt"              # salt | nonce | off
    schedule = "trace"            # rate | trace
    time_scale = 10.0
    turns = "live"                # scripted | live

Precedence, highest first: a flag, the ``[load]`` key, the environment (``OPENAI_BASE_URL``,
``OPENAI_API_KEY``: the OpenAI client's conventions), kvbench's default. The API key is read from
the environment only and never written anywhere (results record the variable's name).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from kvbench.backends.openai.hygiene import Hygiene
from kvbench.errors import InputError
from kvbench.results.secrets import VARIABLE_NAME
from kvbench.run.config import BackendKind, RunConfig, Schedule, TurnMode
from kvbench.run.scenario import build_section, find_scenario, parse_toml
from kvbench.workloads.formats.lines import bounded_text


@dataclass(frozen=True)
class LoadSection:
    """The ``[load]`` section (module docstring). Raises ``ValueError`` naming the key when invalid."""

    backend: BackendKind | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    model: str | None = None
    rate: float | None = None
    burstiness: float | None = None
    concurrency: int | None = None
    duration: float | None = None
    hygiene: Hygiene | None = None
    schedule: Schedule | None = None
    time_scale: float | None = None
    turns: TurnMode | None = None

    def __post_init__(self) -> None:
        for name, kind in (
            ("backend", BackendKind),
            ("hygiene", Hygiene),
            ("schedule", Schedule),
            ("turns", TurnMode),
        ):
            value = getattr(self, name)
            if value is not None:
                try:
                    object.__setattr__(self, name, kind(value))
                except ValueError:
                    raise ValueError(
                        f"{name} must be one of {', '.join(k.value for k in kind)}, got {value!r}"
                    ) from None
        for name in ("base_url", "api_key_env", "model"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        if isinstance(self.api_key_env, str) and not VARIABLE_NAME.fullmatch(self.api_key_env):
            raise ValueError(
                "api_key_env must be an environment variable's name (letters, digits and _), "
                "not a key; the value given is not one"
            )
        for name in ("rate", "burstiness", "duration", "time_scale"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not value > 0
                or (name != "rate" and not math.isfinite(value))
            ):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if self.concurrency is not None and (
            isinstance(self.concurrency, bool)
            or not isinstance(self.concurrency, int)
            or self.concurrency < 1
        ):
            raise ValueError(f"concurrency must be a positive integer, got {self.concurrency!r}")


def read_load_section(source: str | Path) -> LoadSection:
    """The ``[load]`` section of a scenario (an empty one for a trace file or a scenario without it).

    Raises:
        InputError: an unknown key (``api_key`` is refused: keys stay in the environment) or a bad
            value, naming the file, line and key.
    """
    path = find_scenario(source)
    if path.suffix != ".toml" or not path.is_file():
        return LoadSection()
    try:
        text = bounded_text(path)
        table = parse_toml(path, text).get("load", {})
    except InputError:
        return LoadSection()  # load_scenario reports a broken file with its own message
    if "api_key" in table:
        raise InputError(
            f"{path}: field 'load.api_key': a key never goes in a file; set OPENAI_API_KEY "
            "(or the variable api_key_env names) in the environment"
        )
    return build_section(LoadSection, table, path, text, "load")


def load_backend(source: str | Path) -> BackendKind:
    """The backend a scenario's ``[load]`` names, else the in-process engine."""
    return read_load_section(source).backend or BackendKind.INPROCESS


def with_load_section(config: RunConfig) -> RunConfig:
    """``config`` with every unset HTTP option taken from its scenario's ``[load]`` section (openai
    runs only; the in-process engine has ``[run]``). Raises ``ValueError`` like :class:`RunConfig`."""
    section = read_load_section(config.source)
    if config.backend is not BackendKind.OPENAI or section == LoadSection():
        return config
    server, run, model = config.server, config.run, config.model

    def pick(flag, key):
        return flag if flag is not None else key

    server = replace(
        server,
        base_url=pick(server.base_url, section.base_url),
        api_key_env=pick(server.api_key_env, section.api_key_env),
        request_rate=pick(server.request_rate, section.rate),
        burstiness=pick(server.burstiness, section.burstiness),
        duration=pick(server.duration, section.duration),
        hygiene=pick(server.hygiene, section.hygiene),
        schedule=pick(server.schedule, section.schedule),
        time_scale=pick(server.time_scale, section.time_scale),
        turns=pick(server.turns, section.turns),
    )
    return replace(
        config,
        server=server,
        run=replace(run, concurrency=pick(run.concurrency, section.concurrency)),
        model=replace(model, path=pick(model.path, section.model)),
    )
