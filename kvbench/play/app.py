"""``kvbench play``: the interactive cache as a Textual app over :class:`~kvbench.play.state.PlayState`.

Keys: ``a`` / ``b`` send system prompt A / B, ``c`` the next chat turn (A + one block more each
turn), ``o`` a one-off, ``f`` finish every running request (release, tail first), ``t`` advance the
clock past the TTL, ``k`` switch hash <-> radix (a fresh pool), ``q`` quit. The table shows every
slot of the 16-block pool: block (owner prompt and index), ref count, free-list position (0 = the
next victim), hash prefix; the log shows hits, evictions and expiries as they happen.
"""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widgets import DataTable, Footer, Header, RichLog, Static

from kvbench.cache.base import CacheKind
from kvbench.play.state import NUM_BLOCKS, TTL_S, PlayState


class PlayApp(App):
    """The pool, a status line and the event log."""

    TITLE = "kvbench play"
    BINDINGS = [
        ("a", "send('A')", "send A"),
        ("b", "send('B')", "send B"),
        ("c", "send('chat')", "chat turn"),
        ("o", "send('one-off')", "one-off"),
        ("f", "finish", "finish"),
        ("t", "advance", f"+{TTL_S + 1:g} s"),
        ("k", "switch", "hash/radix"),
        ("q", "quit", "quit"),
    ]

    def __init__(self, kind: CacheKind = CacheKind.HASH) -> None:
        super().__init__()
        self.state = PlayState(kind)

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="status")
        yield DataTable(id="pool")
        yield RichLog(id="log", max_lines=200)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#pool", DataTable)
        table.add_columns("slot", "block", "ref count", "free-list position", "hash")
        self.refresh_view()

    def action_send(self, prompt_kind: str) -> None:
        self._show(self.state.send(prompt_kind).text)

    def action_finish(self) -> None:
        self._show(self.state.finish().text)

    def action_advance(self) -> None:
        self._show(self.state.advance().text)

    def action_switch(self) -> None:
        kind = CacheKind.RADIX if self.state.kind is CacheKind.HASH else CacheKind.HASH
        self.state = PlayState(kind)
        self._show(f"switched to a fresh {kind.value} cache")

    def _show(self, text: str) -> None:
        self.query_one("#log", RichLog).write(text)
        self.refresh_view()

    def refresh_view(self) -> None:
        """Redraw the pool table and the status line from the state."""
        state = self.state
        table = self.query_one("#pool", DataTable)
        table.clear()
        by_slot = {view.slot: view for view in state.blocks()}
        for slot in range(NUM_BLOCKS):
            view = by_slot.get(slot)
            if view is None:
                table.add_row(str(slot), "·", "", "", "")
            else:
                position = "pinned" if view.free_position is None else str(view.free_position)
                table.add_row(str(slot), view.label, str(view.ref_count), position, view.hash_prefix)
        self.query_one("#status", Static).update(
            f"{state.kind.value} cache, {NUM_BLOCKS} blocks of 16 tokens, TTL {TTL_S:g} s | t = "
            f"{state.now_s:g} s | "
            f"{len(by_slot)} cached, {state.num_running} running | hit rate {state.hit_rate:.1%} "
            f"({state.num_hit_tokens:,} of {state.num_prompt_tokens:,} prompt tokens)"
        )
