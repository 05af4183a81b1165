"""Which install extra provides a missing third-party module, and the command that installs it, for
the one-line error the CLI prints.

The core (``pip install -c constraints-cpu.txt -e .`` from a checkout) is the cache simulator,
traces, the HTTP backends, reports without plots. Heavier parts are extras (pyproject.toml):
``[engine]`` (torch, transformers, jinja2 for chat templates, psutil), ``[serve]`` (fastapi,
uvicorn, pydantic; the engine too), ``[plots]`` (matplotlib), ``[play]`` (textual), ``[all]``. A
command that reaches a module of a missing extra fails with ``needs the [engine] extra; from a
checkout: pip install -c constraints-cpu.txt -e '.[engine]' (No module named 'torch')`` and exit
code 2. The hint passes constraints-cpu.txt because an unconstrained ``pip install`` of an extra
that brings torch resolves the newest torch with its multi-GB CUDA wheels, not the tested CPU build;
kvbench is installed from a checkout, not from a package index.
"""

from __future__ import annotations

EXTRA_OF_MODULE = {
    "torch": "engine",
    "transformers": "engine",
    "tokenizers": "engine",
    "safetensors": "engine",
    "jinja2": "engine",
    "psutil": "engine",
    "fastapi": "serve",
    "uvicorn": "serve",
    "starlette": "serve",
    "matplotlib": "plots",
    "textual": "play",
}


def install_command(extra: str | None) -> str:
    """The pip command, run at the root of a kvbench checkout, that installs ``extra`` (``None``: the
    core) with torch held to the CPU build of constraints-cpu.txt."""
    target = f"'.[{extra}]'" if extra else "."
    return f"pip install -c constraints-cpu.txt -e {target}"


def needs_extra(extra: str, reason: object = None) -> str:
    """``needs the [X] extra; from a checkout: <install_command(X)>``, then `` (reason)`` if given."""
    hint = f"needs the [{extra}] extra; from a checkout: {install_command(extra)}"
    return hint if reason is None else f"{hint} ({reason})"


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The one-line message for a module of an extra that is not installed; ``None`` for any other."""
    extra = EXTRA_OF_MODULE.get((exc.name or "").split(".")[0])
    return None if extra is None else needs_extra(extra, exc)
