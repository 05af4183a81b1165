"""The ``kvbench run`` options for a fleet behind a router (``--backend openai``): what each request
carries for the router, the replicas' own counters and KV events, the router's policy
(:mod:`kvbench.run.fleet_flags`)."""

from __future__ import annotations

from typing import Annotated

import typer

from kvbench.commands.signature import panel

FLEET = panel(
    "Fleet behind a router (--backend openai)",
    {
        "session_header": (
            Annotated[
                str | None,
                typer.Option(
                    help="Header carrying the trace's session id, for a router's session affinity "
                    "(default X-Session-ID; 'none' sends none; the session also goes as 'user')."
                ),
            ],
            None,
        ),
        "header": (
            Annotated[
                list[str] | None,
                typer.Option(help="Another HTTP header on every request, NAME:VALUE (repeatable)."),
            ],
            None,
        ),
        "extra_body": (
            Annotated[
                str | None,
                typer.Option(help="A JSON object merged into every request body, e.g. '{\"priority\": 1}'."),
            ],
            None,
        ),
        "replica_metrics": (
            Annotated[
                list[str] | None,
                typer.Option(
                    help="A replica's own root URL behind a router (repeatable): its /metrics is read "
                    "before and after, per replica and summed."
                ),
            ],
            None,
        ),
        "router_metrics": (
            Annotated[
                str | None,
                typer.Option(
                    help="The router's own Prometheus endpoint (sglang-router's or vllm-router's "
                    "--prometheus-port /metrics): its counters over the run are kept in the result."
                ),
            ],
            None,
        ),
        "fleet_policy": (
            Annotated[
                str | None,
                typer.Option(
                    help="The router's policy (round_robin, cache_aware, consistent_hash, ...): expected "
                    "cached tokens per replica from kvbench route's model of it."
                ),
            ],
            None,
        ),
        "kv_events": (
            Annotated[
                list[str] | None,
                typer.Option(
                    help="Read a replica's KV cache events: its http:// root or tcp:// (repeatable)."
                ),
            ],
            None,
        ),
        "fleet_replicas": (
            Annotated[
                int | None,
                typer.Option(
                    min=1, help="Replicas behind the router (default: the --replica-metrics count)."
                ),
            ],
            None,
        ),
    },
)
