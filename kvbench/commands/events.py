"""``kvbench events watch``: what each replica's KV cache holds, read from the servers' event streams."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.live import Live
from rich.table import Table

from kvbench.commands.common import make_console

events_app = typer.Typer(
    help="Read KV cache events (vLLM's ZMQ stream) from any server.", no_args_is_help=True
)


def _table(summary) -> Table:
    """One row per replica, then the fleet's duplicated blocks."""
    table = Table(title="KV cache events", title_justify="left")
    for column in ("replica", "blocks held", "stored", "removed", "stores/s", "removals/s", "last seq"):
        table.add_column(column, justify="left" if column == "replica" else "right")
    for replica in summary.replicas:
        held = ", ".join(f"{n:,} {medium}" for medium, n in replica.blocks_by_medium.items()) or "0"
        table.add_row(
            replica.name,
            held,
            f"{replica.num_stored_blocks:,}",
            f"{replica.num_removed_blocks:,}",
            f"{replica.stores_per_s:.1f}",
            f"{replica.removals_per_s:.1f}",
            "-" if replica.last_seq is None else str(replica.last_seq),
        )
    redundant = f"{summary.num_redundant_copies:,} redundant copies"
    if summary.redundant_bytes is not None:
        redundant += f" ({summary.redundant_bytes / 2**20:,.1f} MiB)"
    table.caption = (
        f"{summary.num_distinct_blocks:,} distinct blocks by content; {summary.num_duplicated_blocks:,} held "
        f"by two or more replicas: {redundant}"
    )
    table.caption_justify = "left"
    return table


@events_app.command("watch")
def watch(
    targets: Annotated[
        list[str],
        typer.Argument(
            help="Servers (http://HOST:PORT, asked for /kv_event_sources) or publishers (tcp://HOST:PORT, "
            "optionally ',replay=tcp://HOST:PORT'); NAME=URL names a replica."
        ),
    ],
    duration: Annotated[
        float | None, typer.Option(min=0, help="Stop after this many seconds (default: at Ctrl-C).")
    ] = None,
    once: Annotated[
        bool, typer.Option("--once", help="Replay what the publishers keep, print one table, exit.")
    ] = False,
    bytes_per_block: Annotated[
        int | None, typer.Option(min=1, help="KV bytes of one block, to size the duplicated KV.")
    ] = None,
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between refreshes.")] = 1.0,
) -> None:
    """Subscribe to servers' KV cache events (kvbench serve --kv-events, vLLM --kv-events-config,
    SGLang): per replica the blocks held, stores and removals per second, and across replicas the
    blocks held twice, by content. Gaps in a stream are replayed and said in one line."""
    from kvbench.events.discover import parse_sources
    from kvbench.events.watch import watch as watch_events

    console, err = make_console(), make_console(stderr=True)
    sources = parse_sources(targets)
    note = lambda line: err.print(f"events: {line}", soft_wrap=True)  # noqa: E731
    if once or not console.is_terminal:
        summary = watch_events(
            sources, 0 if once else duration, lambda s: None, note, bytes_per_block, interval
        )
        console.print(_table(summary))
        return
    with Live(console=console, auto_refresh=False) as live:
        try:
            watch_events(
                sources,
                duration,
                lambda s: live.update(_table(s), refresh=True),
                note,
                bytes_per_block,
                interval,
            )
        except KeyboardInterrupt:
            pass


def register(app: typer.Typer) -> None:
    app.add_typer(events_app, name="events")
