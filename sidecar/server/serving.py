"""A process's listeners, started together and stopped together (`toolauthz serve` and
each worker of `--workers N`)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from sidecar.server.build import Sidecar, create_listener_server, start_console, start_http
from sidecar.server.config import ListenerSettings
from sidecar.server.listeners import planned_http_listeners
from sidecar.service.running import AioServer


@dataclass(frozen=True)
class Serving:
    servers: tuple[AioServer, ...]
    addresses: tuple[str, ...]  # as served: port 0 resolved, Unix sockets as unix:///path
    http_addresses: tuple[str, ...] = ()  # the HTTP/JSON API's, likewise
    console_address: str = ""  # the browser console's, likewise; "" when it is off

    def stop(self, grace: float | None) -> None:
        """Stops every server at once (each lets its calls finish for up to `grace` s) and
        returns when all have stopped and their socket files are removed."""
        threads = [threading.Thread(target=lambda s=server: s.stop(grace).wait(), name="stop-listener")
                   for server in self.servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def start_listeners(sidecar: Sidecar, listeners: Iterable[ListenerSettings], *,
                    reuse_port: bool = False) -> Serving:
    """A started server per listener; on any failure the ones started are stopped (their
    socket files removed) and the error raised."""
    started: list[tuple[AioServer, str]] = []
    http: tuple[str, ...] = ()
    console = ""
    try:
        for listener in listeners:
            started.append(create_listener_server(sidecar, listener, reuse_port=reuse_port))
        if started:  # on the first server's loop, stopped with it
            http = start_http(sidecar, started[0][0], planned_http_listeners(sidecar.settings), reuse_port)
            console = start_console(sidecar, started[0][0], reuse_port)
    except BaseException:
        Serving(tuple(s for s, _ in started), ()).stop(None)
        raise
    return Serving(tuple(s for s, _ in started), tuple(a for _, a in started), http, console)
