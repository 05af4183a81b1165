"""How ``kvbench serve`` stops on SIGTERM or SIGINT: within seconds, every stream ended cleanly.

uvicorn's own shutdown stops accepting connections and then waits for every response to finish: a
stream of 4,000 tokens kept the server alive (and streaming) for minutes after SIGTERM. Here the
shutdown first cancels every request in flight, queued or running (:meth:`EngineService.stop_all`,
as a client's disconnect would: the engine releases their blocks at its next token or step), so each
stream ends with one error event naming the stop and ``data: [DONE]``, and a whole response gets a
500 with that message; then uvicorn's shutdown closes the connections, waiting at most
:data:`kvbench.server.connections.STOP_GRACE_S` for them.
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable

import uvicorn

from kvbench.server.service import EngineService


class StoppingServer(uvicorn.Server):
    """``uvicorn.Server`` over ``service`` that cancels every request in flight when it stops.
    ``on_stop(signal_name, num_requests)`` (the command prints its line there) is called once, when
    the shutdown starts; ``signal_name`` is ``SIGTERM``, ``SIGINT`` or ``stop`` (no signal)."""

    def __init__(
        self,
        config: uvicorn.Config,
        service: EngineService,
        on_stop: Callable[[str, int], None] | None = None,
    ) -> None:
        super().__init__(config)
        self.service = service
        self.on_stop = on_stop

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        received = getattr(self, "_captured_signals", [])  # uvicorn records the signals it handled
        name = signal.Signals(received[0]).name if received else "stop"
        num_requests = self.service.stop_all(f"the server is stopping ({name})")
        if self.on_stop is not None:
            self.on_stop(name, num_requests)
        await super().shutdown(sockets)
