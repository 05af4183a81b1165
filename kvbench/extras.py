"""Which install extra provides a missing third-party module, for the one-line error the CLI prints.

``pip install kvbench`` is the core: the cache simulator, traces, the HTTP backend, reports without
plots. Heavier parts are extras (pyproject.toml): ``[engine]`` (torch, transformers, jinja2 for chat
templates, psutil), ``[serve]`` (fastapi, uvicorn; the engine too), ``[plots]`` (matplotlib),
``[all]``. A command that reaches a module of a missing extra fails with
``needs the [engine] extra: pip install 'kvbench[engine]' (No module named 'torch')`` and exit code 2.
"""

from __future__ import annotations

EXTRA_OF_MODULE = {
    "torch": "engine", "transformers": "engine", "tokenizers": "engine", "safetensors": "engine",
    "jinja2": "engine", "psutil": "engine",
    "fastapi": "serve", "uvicorn": "serve", "starlette": "serve",
    "matplotlib": "plots",
}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The one-line message for a module of an extra that is not installed; ``None`` for any other."""
    top = (exc.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    if extra is None:
        return None
    return f"needs the [{extra}] extra: pip install 'kvbench[{extra}]' ({exc})"
