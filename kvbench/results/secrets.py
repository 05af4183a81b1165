"""Keep API keys out of results: what looks like a key, and the scrubbing of footer metadata.

A key may reach a results file by mistake (``--api-key-env "$KEY"`` pastes the key where its
variable's name belongs), so every footer is scrubbed on the way out: a string is
redacted when it holds

* a token with a prefix that API keys of the common providers carry (OpenAI ``sk-``, Anthropic
  ``sk-ant-``, Hugging Face ``hf_``, GitHub ``ghp_`` / ``github_pat_``, Slack ``xox?-``, AWS ``AKIA``,
  Google ``AIza``), or
* the value of an environment variable whose name says it holds a secret (``*KEY*``, ``*TOKEN*``,
  ``*SECRET*``, ``*PASSWORD*``), such as the ``OPENAI_API_KEY`` the run sent.

Command-line arguments are held to a stricter rule besides (:func:`scrub_arguments`): an argument holding
a run of 32 or more letters and digits mixing upper case, lower case and digits is redacted too (no
kvbench flag value has that shape; digests are lower-case hex, file names break at ``-`` and ``.``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

REDACTED = "<redacted>"
_PREFIXED_KEY = re.compile(
    r"(?:sk-ant-|sk-|sk_|hf_|ghp_|gho_|github_pat_|xox[abprs]-|AKIA|AIza)[A-Za-z0-9_\-]{12,}"
)
_SECRET_VARIABLE = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
_MIN_SECRET_CHARS = 8  # shorter values ("EMPTY", "1") would redact ordinary words
_BARE_TOKEN = re.compile(r"[A-Za-z0-9]{32,}")
VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # POSIX: letters, digits, _, not a leading digit


def environment_secrets() -> list[str]:
    """The values of the environment's secret-named variables (longest first, so a longer value is
    redacted whole before a shorter one inside it)."""
    values = {
        value
        for name, value in os.environ.items()
        if _SECRET_VARIABLE.search(name) and len(value) >= _MIN_SECRET_CHARS
    }
    return sorted(values, key=len, reverse=True)


def looks_like_key(text: str) -> bool:
    """True when ``text`` holds a provider-prefixed key or a run of 32+ letters and digits mixing
    upper case, lower case and digits (a key without a known prefix)."""
    return bool(_PREFIXED_KEY.search(text)) or any(
        re.search("[a-z]", token) and re.search("[A-Z]", token) and re.search("[0-9]", token)
        for token in _BARE_TOKEN.findall(text)
    )


def scrub_text(text: str, known: Sequence[str] = ()) -> str:
    """``text`` with every prefixed key and every ``known`` secret replaced by ``<redacted>``."""
    for secret in known:
        text = text.replace(secret, REDACTED)
    return _PREFIXED_KEY.sub(REDACTED, text)


def scrub(value: Any, known: Sequence[str] = ()) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, numbers) with keys redacted in every string."""
    if isinstance(value, str):
        return scrub_text(value, known)
    if isinstance(value, Mapping):
        return {key: scrub(item, known) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(item, known) for item in value]
    return value


def scrub_arguments(args: Sequence[str], known: Sequence[str] = ()) -> list[str]:
    """A command line with keys redacted: :func:`scrub_text`, and a whole argument that is a long
    mixed-case token (a key without a known prefix) replaced."""
    return [REDACTED if looks_like_key(arg) else scrub_text(arg, known) for arg in args]
