"""A process's listeners, started together and stopped together (`toolauthz serve` and
each worker of `--workers N`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from toolauthz.server.build import create_listener_server, start_web
from toolauthz.server.config import ListenerSettings
from toolauthz.server.sidecar import Sidecar
from toolauthz.service.running import AioServer

log = logging.getLogger("toolauthz.workers")


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
            http, console = start_web(sidecar, started[0][0], reuse_port)
    except BaseException:
        Serving(tuple(s for s, _ in started), ()).stop(None)
        raise
    return Serving(tuple(s for s, _ in started), tuple(a for _, a in started), http, console)


def drain(serving: Serving, sidecar: Sidecar) -> None:
    """SIGTERM's stop: refuse new calls at once, let the calls in flight finish within
    `drain_grace_seconds` (then cancel them), answer what the decision pump still holds,
    and close the stores after a final signed audit checkpoint."""
    grace = sidecar.settings.drain_grace_seconds
    log.info("draining: new calls are refused; calls in flight have %.1f s to finish", grace)
    try:
        serving.stop(grace=grace)
    finally:
        sidecar.close()
    log.info("drained: final audit checkpoint signed")


def reload_of(sidecar: Sidecar) -> Callable[[], None]:
    reloader = sidecar.reloader
    return reloader.trigger if reloader is not None else (lambda: None)
