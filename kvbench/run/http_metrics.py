"""The ``/metrics`` side of an HTTP run: each endpoint's text before and after, and what the delta covers.

With several ``--base-url`` endpoints the prefix-cache counters are summed over the endpoints that
answered both before and after the run; when one did not (a replica that died), the delta says which
ones it covers instead of passing a survivor's rate off as the run's. A server that
stopped answering is told apart from one that never exposed prefix-cache counters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvbench.run.config import RunConfig

Fetch = Callable[[str, str], "str | None"]  # (url, key) -> the /metrics text, None when it did not answer


def scrape(fetch: Fetch, urls: Sequence[str], key: str) -> list[str | None]:
    """Every endpoint's ``/metrics`` text (``None`` where it did not answer), in ``urls`` order."""
    return [fetch(url, key) for url in urls]


def joined(texts: Sequence[str | None], keep: Sequence[int] | None = None) -> str | None:
    """The texts of the endpoints ``keep`` (default all) that answered, joined; ``None`` if none did."""
    chosen = [text for i, text in enumerate(texts) if text is not None and (keep is None or i in keep)]
    return "\n".join(chosen) if chosen else None


def metrics_scope(before: Sequence[str | None], after: Sequence[str | None]) -> tuple[list[int], str | None]:
    """``(endpoints answering both times, label)``; the label is ``None`` when all did."""
    both = [i for i, (a, b) in enumerate(zip(before, after)) if a is not None and b is not None]
    if len(both) == len(before):
        return both, None
    if len(before) == 1:
        when = "before the run" if before[0] is None else "after the run (it stopped answering)"
        return both, f"the server did not answer /metrics {when}"
    missing = [str(i) for i in range(len(before)) if i not in both]
    if not both:
        return both, "no replica answered /metrics both before and after the run"
    return both, (
        f"covers replica {', '.join(map(str, both))} only: replica {', '.join(missing)} "
        "did not answer /metrics before and after the run"
    )


def reset_all(urls: Sequence[str], key: str, reset: Callable[[str, str], tuple[str | None, str]]) -> str:
    """``--reset-cache``: reset every server of ``urls`` (behind a router, each replica of
    ``--replica-metrics`` directly: a router's own reset reaches some workers or none); returns the
    line to say. A reset that fails anywhere is a fresh start nowhere.

    Raises:
        InputError: a server did not reset (naming it and what it answered).
    """
    from kvbench.errors import InputError

    done = []
    for url in urls:
        endpoint, note = reset(url, key)
        if endpoint is None:
            where = f"{url}: " if len(urls) > 1 else ""
            raise InputError(
                f"--reset-cache: {where}{note}; {len(done)} of {len(urls)} servers reset, so the run would "
                "not start from empty caches (reset them yourself, or drop --reset-cache)"
            )
        done.append(endpoint)
    if len(urls) == 1:
        return f"POST {done[0]}: cache reset"
    return f"cache reset on all {len(urls)} replicas ({', '.join(sorted(set(done)))})"


def server_state(config: RunConfig, urls: Sequence[str], key: str, say: Callable[[str], None]):
    """Reset the servers' caches (``--reset-cache``), read their prefix-cache counters and what their
    ``/metrics`` says of their cache; each line to ``say`` as it is known. Returns (the scrape of each
    endpoint, server cache)."""
    from kvbench.backends.openai.admin import fetch_metrics, reset_prefix_cache
    from kvbench.backends.openai.metrics import detect_cache_settings
    from kvbench.backends.openai.server_cache import resolve_server_cache

    server = config.server
    if server.reset_cache:
        say(reset_all(server.replica_metrics or urls, key, reset_prefix_cache))
    metrics_before = scrape(fetch_metrics, urls, key)
    server_cache = resolve_server_cache(
        detect_cache_settings(joined(metrics_before)), server.server_block_size, server.expected_cache_size
    )
    for line in server_cache.lines():
        say(line)
    return metrics_before, server_cache
