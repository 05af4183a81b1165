"""The ``/metrics`` side of an HTTP run: each endpoint's text before and after, and what the delta covers.

With several ``--base-url`` endpoints the prefix-cache counters are summed over the endpoints that
answered both before and after the run; when one did not (a replica that died), the delta says which
ones it covers instead of passing a survivor's rate off as the run's (issue 32.9). A server that
stopped answering is told apart from one that never exposed prefix-cache counters (issue 30.7).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
