"""Outside a terminal, a long run prints a progress line at a steady interval."""

import io

from rich.console import Console

from kvbench.commands.common import plain_progress
from kvbench.results.rows import ResultRow


def test_a_line_every_interval_and_none_in_between():
    console = Console(file=io.StringIO(), width=120)
    assert not console.is_terminal
    now = [0.0]
    seen = []
    update = plain_progress(
        console, lambda rows, total: seen.append(len(rows)), every_s=30.0, clock=lambda: now[0]
    )
    rows = []
    for second in range(1, 100):
        now[0] = float(second)
        rows.append(ResultRow(status="ok" if second % 10 else "error"))
        update(rows, 200)
    lines = console.file.getvalue().splitlines()
    assert lines == [
        "progress: 30/200 requests, 3 failed, 0m30s",
        "progress: 60/200 requests, 6 failed, 1m00s",
        "progress: 90/200 requests, 9 failed, 1m30s",
    ]
    assert seen == list(range(1, 100))  # the live bar still gets every update
