"""Scenario files: TOML -> validated frozen dataclasses. CLI flags override fields afterwards.

A scenario has up to four sections::

    [workload]   kind = "multi-prefix" | "mooncake" | ... and that kind's parameters
    [cache]      kind, block_size, ttl_s, release_order, hash_algo, hash_bits, verify_tokens
    [sim]        sizes = [...] (cache capacities in blocks), release = [...] orders to compare
    [run]        engine-run settings (read by ``kvbench run``)
    [load]       how ``kvbench run --backend openai`` sends (read by :mod:`kvbench.run.load_section`)

Every key is checked: an unknown section or key, or a value of the wrong type, is an ``InputError``
naming the file, the line and the field. Types are checked by pydantic against each field's
annotation, strictly as for JSON (``ttl_s = "abc"`` or ``temperature = "hot"`` is "expected a number",
never Python's own wording; no string is coerced to a number), before the section's own range checks.

Workload kinds come from the one registry, :data:`kvbench.workloads.kinds.KINDS`; every kind gives
:class:`kvbench.request.Request` objects, so every kind can run through the simulator.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.resources
import json
import re
import tomllib
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.cache.base import CacheConfig, CacheKind, ReleaseOrder
from kvbench.cache.block_hash import HashAlgo, HashConfig
from kvbench.errors import InputError
from kvbench.workloads.formats.lines import bounded_text
from kvbench.workloads.kinds import KINDS, Workload, workload_requests
from kvbench.workloads.tokenizer import Tokenizer


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

    def cache_config(self, capacity_blocks: int, block_size: int) -> CacheConfig:
        """The :class:`CacheConfig` this section describes, at a capacity (blocks) and block size
        (tokens) chosen elsewhere (``[sim] sizes``, the run's cache size). Raises ``ValueError``."""
        return CacheConfig(
            capacity_blocks=capacity_blocks,
            block_size=block_size,
            kind=self.kind,
            ttl_s=self.ttl_s,
            release_order=self.release_order,
            verify_tokens=self.verify_tokens,
            hash=self.hash,
        )


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
        return self.cache.block_size or KINDS[self.workload_kind].default_block_size

    def workload_requests(self, tokenizer: Tokenizer | None = None) -> Workload:
        """Build the workload (see :func:`kvbench.workloads.kinds.workload_requests`; relative paths
        are relative to the scenario file).

        Raises:
            InputError: a file the workload reads is missing or malformed, or its text cannot be
                rendered to the counts it records (the message names the scenario and the kind).
        """
        try:
            return workload_requests(self.workload_kind, self.workload, tokenizer, self.path.resolve().parent)
        except ValueError as exc:
            raise InputError(f"{self.path}: workload {self.workload_kind}: {exc}") from None


_SECTIONS = ("workload", "cache", "sim", "run", "load")


def shipped_scenarios() -> list[str]:
    """Names (file stems) of the scenarios kvbench ships as package data (``kvbench/scenarios``)."""
    folder = importlib.resources.files("kvbench") / "scenarios"
    return sorted(item.name.removesuffix(".toml") for item in folder.iterdir() if item.name.endswith(".toml"))


def missing_source(path: Path) -> str:
    """The one line for a source that is neither a file nor a shipped scenario: the shipped names
    are listed when ``path`` looks like a scenario name (no folder, ``.toml`` or no suffix), with
    the closest one suggested when a name is close (``shared2k`` -> ``shared_2k``; difflib's ratio
    >= 0.6 on names without ``_`` and ``-``)."""
    if len(path.parts) > 1 or path.suffix not in ("", ".toml"):
        return f"{path}: no such file"
    shipped = shipped_scenarios()
    line = f"{path}: no such file or shipped scenario (shipped: {', '.join(shipped)})"
    suggestion = closest_name(path.stem, shipped)
    return line if suggestion is None else f"{line}; did you mean {suggestion}?"


def closest_name(typed: str, names: Sequence[str]) -> str | None:
    """The one of ``names`` closest to ``typed`` once case, ``_`` and ``-`` are ignored, or ``None``
    when none is close (difflib ratio below 0.6)."""
    import difflib

    def bare(name: str) -> str:
        return name.lower().replace("_", "").replace("-", "")

    by_bare = {bare(name): name for name in names}
    match = difflib.get_close_matches(bare(typed), list(by_bare), n=1, cutoff=0.6)
    return by_bare[match[0]] if match else None


def find_scenario(spec: str | Path) -> Path:
    """``spec`` itself when it exists; else a shipped scenario it names: a bare name (``shared_2k``,
    ``shared_2k.toml``) or ``scenarios/NAME.toml`` typed outside the repository. Otherwise ``spec``
    unchanged (the caller reports the missing file)."""
    path = Path(spec)
    if path.exists() or len(path.parts) > 2 or (len(path.parts) == 2 and path.parts[0] != "scenarios"):
        return path
    if path.suffix not in ("", ".toml"):
        return path
    shipped = importlib.resources.files("kvbench") / "scenarios" / f"{path.stem}.toml"
    return Path(str(shipped)) if shipped.is_file() else path


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


_PLAIN_TYPES = (int, float, str, bool, type(None), Path)


def _plain(hint: Any) -> bool:
    """Whether ``hint`` is built only from plain TOML-like types (numbers, strings, booleans, paths,
    enums, and tuples / lists / unions of them)."""
    args = typing.get_args(hint)
    if args:
        return all(_plain(arg) for arg in args if arg is not Ellipsis)
    return hint in _PLAIN_TYPES or (isinstance(hint, type) and issubclass(hint, enum.Enum))


def _check_types(cls: type, table: dict, path: Path, text: str, section: str) -> None:
    """Raise ``InputError`` (file:line, field) for the first value of ``table`` whose type does not
    match its field's annotation (pydantic, strict JSON mode: enums by value, lists for tuples)."""
    import pydantic

    hints = typing.get_type_hints(cls)
    for key, value in table.items():
        if key not in hints or not _plain(hints[key]):
            continue  # a kvbench type parsed from text (IntDist, ...): the class checks it
        try:
            adapter = pydantic.TypeAdapter(hints[key])
        except (pydantic.PydanticSchemaGenerationError, KeyError, TypeError):
            continue  # a type pydantic cannot describe: the class checks it
        try:
            adapter.validate_json(json.dumps(value, default=str), strict=True)
        except pydantic.ValidationError as exc:
            problem = exc.errors()[0]
            where = "".join(f"[{part}]" for part in problem["loc"] if isinstance(part, int))
            message = problem["msg"].replace("Input should be", "expected").split(" [type=")[0]
            raise InputError.at(
                path, _line_of(text, section, key), f"{section}.{key}{where}", f"{message}, got {value!r}"
            ) from None


def build_section(cls: type, table: dict, path: Path, text: str, section: str) -> Any:
    """Instantiate ``cls`` from ``table``; unknown keys and bad values raise ``InputError``."""
    known = {f.name for f in dataclasses.fields(cls)}
    for key in table:
        if key not in known:
            raise InputError.at(
                path,
                _line_of(text, section, key),
                f"{section}.{key}",
                f"unknown key (known: {', '.join(sorted(known))})",
            )
    _check_types(cls, table, path, text, section)
    try:
        return cls(**table)
    except (ValueError, TypeError) as exc:
        message = str(exc)
        bad = next((k for k in table if message.startswith(k)), None) or next(
            (k for k in table if repr(table[k]) in message or str(table[k]) in message), None
        )
        line = _line_of(text, section, bad) if bad else _line_of(text, section, None)
        field_name = f"{section}.{bad}" if bad else section
        raise InputError.at(path, line, field_name, str(exc)) from None


def parse_toml(path: Path, text: str) -> dict[str, Any]:
    """``text`` (the file ``path``) as TOML. Raises ``InputError``: invalid, or nested too deeply
    (``tomllib`` is recursive: 100,000 nested arrays raised ``RecursionError``)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: invalid TOML ({exc})") from None
    except RecursionError:
        raise InputError(f"{path}: invalid TOML (nested too deeply)") from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file.

    Raises:
        InputError: missing file, larger than the line bound (:func:`bounded_text`), invalid TOML,
            unknown section/key/kind, or a bad value.
    """
    path = Path(path)
    text = bounded_text(path)
    data = parse_toml(path, text)
    for section in data:
        if section not in _SECTIONS or not isinstance(data[section], dict):
            raise InputError.at(
                path,
                _line_of(text, section, None),
                section,
                f"unknown section (known: {', '.join(_SECTIONS)})",
            )
    workload = dict(data.get("workload", {}))
    kind_name = workload.pop("kind", None)
    if kind_name not in KINDS:
        raise InputError.at(
            path,
            _line_of(text, "workload", "kind"),
            "workload.kind",
            f"expected one of {', '.join(sorted(KINDS))}, got {kind_name!r}",
        )
    kind = KINDS[kind_name]
    return Scenario(
        path=path,
        workload_kind=kind_name,
        workload=build_section(kind.config_class, workload, path, text, "workload"),
        cache=build_section(CacheSection, data.get("cache", {}), path, text, "cache"),
        sim=build_section(SimSection, data.get("sim", {}), path, text, "sim"),
        run=dict(data.get("run", {})),
    )


MAX_BLOCKS = 1 << 31  # a capacity above this (2^31 blocks = 32 Gi tokens at 16 per block) is a typo


def parse_int_list(text: str, option: str) -> list[int]:
    """Parse ``"64,128,256"`` into positive ints <= :data:`MAX_BLOCKS`. Raises ``InputError`` naming
    ``option`` (also for an empty list)."""
    if not text.strip():
        raise InputError(
            f"{option}: empty; give a comma-separated list of positive integers, e.g. 64,128,256"
        )
    values = []
    for part in text.split(","):
        part = part.strip().replace("_", "")
        try:
            value = int(part)
        except ValueError:
            raise InputError(f"{option}: {part!r} is not an integer") from None
        if value <= 0:
            raise InputError(f"{option}: {value} is not a positive number of blocks")
        if value > MAX_BLOCKS:
            raise InputError(
                f"{option}: {value:,} blocks is more than any cache holds (at most {MAX_BLOCKS:,})"
            )
        values.append(value)
    return values


def parse_choices(text: str, option: str, choices: Sequence[str]) -> list[str]:
    """Parse ``"a,b"`` where every item must be one of ``choices``."""
    values = [part.strip() for part in text.split(",") if part.strip()]
    for value in values:
        if value not in choices:
            raise InputError(f"{option}: {value!r} is not one of {', '.join(choices)}")
    if not values:
        raise InputError(f"{option}: empty; give one or more of {', '.join(choices)}")
    return values
