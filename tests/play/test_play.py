"""``kvbench play`` (kvbench/play/): the seed's lessons on the real caches, then the Textual app
driven by its headless pilot (scripted keys; assertions on the cache and on the screen)."""

import asyncio

import pytest

from kvbench.cache.base import CacheKind
from kvbench.play.state import NUM_BLOCKS, PlayState


@pytest.mark.parametrize("kind", list(CacheKind))
def test_the_seed_sequence_teaches_what_it_should(kind):
    state = PlayState(kind)
    assert state.send("A").text == "A: hit 0 of 4 blocks, stored 4"
    state.finish()
    assert state.send("A").text.startswith("A: hit 4 of 4 blocks")  # A then A again: 4 blocks
    state.finish()
    for turn in (1, 2, 3):  # every chat turn hits everything before it
        assert state.send("chat").text.startswith(f"chat{turn}: hit {3 + turn} of {4 + turn} blocks")
        state.finish()
    assert state.send("one-off").text == "X1: hit 0 of 5 blocks, stored 5"
    polluted = state.send("one-off").text  # one-offs pollute: the chat's tail goes first
    assert "evicted chat6" in polluted
    text = state.send("B").text  # still running one-offs pin the pool: tails of A and chat go
    assert "evicted A2, A3, chat4, chat5" in text
    labels = {view.label: view for view in state.blocks()}
    assert "A0" in labels and "A1" in labels and "A3" not in labels  # evictions take tails first
    assert labels["A1"].free_position == 0 and labels["A0"].free_position == 1  # A1 is the next victim
    assert sum(view.ref_count > 0 for view in state.blocks()) == 14
    blocked = state.send("one-off").text
    assert "pool full: 3 blocks refused" in blocked  # 14 pinned + 2 free: 5 blocks do not fit
    state.finish()
    state.send("A")
    state.finish()
    expired = state.advance().text
    assert expired.startswith("+61 s: expired") and state.blocks() == []
    state.cache.check_invariants()


def test_tail_first_eviction_and_ttl_leave_empty_slots():
    state = PlayState()
    state.send("A"), state.finish(), state.send("B"), state.finish()
    slots = {view.label: view.slot for view in state.blocks()}
    assert slots == {"A0": 0, "A1": 1, "A2": 2, "A3": 3, "B0": 4, "B1": 5, "B2": 6, "B3": 7}
    state.now_s = 30.0
    state.send("B"), state.finish()  # B refreshed; A idles on
    state.now_s = 75.0
    state.advance(0)
    assert {view.label: view.slot for view in state.blocks()} == {"B0": 4, "B1": 5, "B2": 6, "B3": 7}
    assert state.hit_rate == pytest.approx(64 / (3 * 65))


def test_the_app_under_the_pilot(tmp_path):
    pytest.importorskip("textual")
    from textual.widgets import DataTable, Static

    from kvbench.play.app import PlayApp

    async def scenario():
        app = PlayApp()
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("a", "f", "a", "f", "c", "f", "o", "o", "b")
            table = app.query_one("#pool", DataTable)
            assert table.row_count == NUM_BLOCKS
            cells = [table.get_row_at(i) for i in range(NUM_BLOCKS)]
            shown = {row[1] for row in cells} - {"·"}
            assert shown == {view.label for view in app.state.blocks()}  # the screen is the cache
            assert [row[1] for row in cells[:2]] == ["A0", "A1"] and not {"A2", "A3", "chat4"} & shown
            assert [row[1] for row in cells[2:4]] == ["B0", "B1"]  # B took the evicted tails' slots
            assert {row[3] for row in cells if row[1].startswith("X")} == {"pinned"}  # running one-offs
            status = str(app.query_one("#status", Static).render())
            assert "3 running" in status and "hit rate" in status
            assert app.state.num_hit_tokens == 64 + 64
            await pilot.press("f", "t")
            assert app.state.blocks() == [] and all(table.get_row_at(i)[1] == "·" for i in range(NUM_BLOCKS))
            await pilot.press("k")
            assert app.state.kind is CacheKind.RADIX
            await pilot.press("a", "f", "a")
            assert app.state.num_hit_tokens == 64
            screenshot = app.save_screenshot("play.svg", path=str(tmp_path))
        return screenshot

    svg = open(asyncio.run(scenario()), encoding="utf-8").read()
    assert "A0" in svg and "hit&#160;rate" in svg.replace(" ", "&#160;")


@pytest.mark.parametrize(
    "stdin_tty,stdout_tty,named",
    [(False, False, "stdin and stdout are"), (True, False, "stdout is"), (False, True, "stdin is")],
)
def test_play_without_a_terminal_refuses_in_one_line(stdin_tty, stdout_tty, named):
    """``kvbench play </dev/null | cat`` once wrote escape codes until killed. A real process;
    a pseudo-terminal stands in for the terminal side that is a TTY."""
    import os
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    try:
        process = subprocess.run(
            [sys.executable, "-m", "kvbench.cli", "play"],
            stdin=follower if stdin_tty else subprocess.DEVNULL,
            stdout=follower if stdout_tty else subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=120,
            text=True,
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert process.returncode == 2
    assert process.stderr.strip() == (
        f"error: kvbench play is an interactive terminal app: {named} not a terminal "
        "(run it in one, without pipes or redirects)"
    )
