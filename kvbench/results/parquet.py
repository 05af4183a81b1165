"""Parquet writing and reading shared by every command: rows + run metadata in the key-value footer.

Metadata values are JSON strings under ``kvbench.*`` keys (``kvbench.versions``, ``kvbench.machine``,
``kvbench.command``, ``kvbench.run``, ``kvbench.summary``, ``kvbench.complete``, ...), so any Parquet
reader shows them and :func:`read_metadata` restores them.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kvbench import __version__
from kvbench.errors import InputError
from kvbench.results.secrets import environment_secrets, scrub, scrub_arguments
from kvbench.workloads.formats.atomic import partial_path

_PREFIX = "kvbench."


def versions() -> dict[str, str]:
    """Versions of kvbench, Python and the libraries whose behaviour shapes the numbers."""
    found = {"kvbench": __version__, "python": platform.python_version()}
    for package in ("numpy", "pyarrow", "torch", "transformers", "tiktoken"):
        try:  # package metadata, not an import: recording versions must not load torch
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def machine() -> dict[str, Any]:
    """A short description of this machine (CPU model, cores, OS)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "os": platform.platform()}


def check_output_path(path: str | Path, option: str = "--out") -> Path:
    """Fail early, before anything is measured, if results could not be written to ``path``.

    Raises:
        InputError: ``path`` is a folder, its parent is a file, or the parent cannot be created or
            written to.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{option} {path}: is a folder; give a file name")
    parent = path.parent
    existing = next((p for p in (parent, *parent.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise InputError(f"{option} {path}: {existing} is a file, not a folder")
    try:  # a real probe: permissions alone do not tell (root, read-only mounts, /proc)
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".kvbench-probe-"):
            pass
    except OSError as exc:
        raise InputError(f"{option} {path}: cannot write in {existing} ({exc.strerror})") from None
    return path


def check_output_folder(path: str | Path, option: str = "--out") -> Path:
    """:func:`check_output_path` for a folder of outputs (``kvbench report --out``): ``path`` must be
    a folder or not exist yet, and its nearest existing ancestor must take a file.

    Raises:
        InputError: ``path`` or an ancestor is a file, or nothing can be written there.
    """
    path = Path(path)
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise InputError(f"{option} {path}: {existing} is a file, not a folder")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".kvbench-probe-"):
            pass
    except OSError as exc:
        raise InputError(f"{option} {path}: cannot write in {existing} ({exc.strerror})") from None
    return path


def write_rows(
    path: str | Path,
    rows: Sequence[Mapping[str, Any]],
    metadata: Mapping[str, Any],
    schema: pa.Schema | None = None,
) -> Path:
    """Write ``rows`` (one dict per row) to ``path`` atomically, with ``metadata`` in the footer.

    ``metadata`` values are stored as JSON; ``versions`` and ``machine`` are added. Returns the path.
    """
    return write_table(path, pa.Table.from_pylist(list(rows), schema=schema), metadata)


_COMMAND_LINE: list[str] = []  # set once by the CLI's entry point; empty when kvbench is used as a library


def record_command_line(args: Sequence[str]) -> None:
    """Remember the command line (``["kvbench", "run", ...]``) for every file written from now on
    (footer key ``command_line``, shown by ``kvbench report``'s HTML page)."""
    _COMMAND_LINE[:] = list(args)


def encoded_metadata(metadata: Mapping[str, Any]) -> dict[str, str]:
    """``metadata`` plus ``versions``, ``machine`` (and ``command_line`` when the CLI recorded one), as
    the ``kvbench.*`` JSON strings of a footer, every value that looks like an API key redacted
    (:mod:`kvbench.results.secrets`)."""
    known = environment_secrets()
    command_line = {"command_line": scrub_arguments(_COMMAND_LINE, known)} if _COMMAND_LINE else {}
    footer = scrub({"versions": versions(), "machine": machine(), **command_line, **metadata}, known)
    return {f"{_PREFIX}{key}": json.dumps(value, default=str) for key, value in footer.items()}


def write_table(path: str | Path, table: pa.Table, metadata: Mapping[str, Any]) -> Path:
    """:func:`write_rows` for rows already in Arrow form (atomic; ``metadata`` in the footer)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = {
        key.decode() if isinstance(key, bytes) else key: value
        for key, value in (table.schema.metadata or {}).items()
    }
    kept = {key: value for key, value in kept.items() if not key.startswith(_PREFIX)}  # replaced, not merged
    table = table.replace_schema_metadata({**kept, **encoded_metadata(metadata)})
    partial = partial_path(path)
    pq.write_table(table, partial)
    os.replace(partial, path)
    return path


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The ``kvbench.*`` metadata of a Parquet file, JSON-decoded, without the prefix."""
    try:
        raw = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from None
    return {
        key.decode()[len(_PREFIX) :]: json.loads(value)
        for key, value in raw.items()
        if key.decode().startswith(_PREFIX)
    }
