"""The metrics listener's routes: `/metrics` (Prometheus text), `/healthz` (liveness)
and `/readyz` (readiness), for probes that speak HTTP rather than gRPC.

`/healthz` answers 200 while the process can answer at all. `/readyz` has the gRPC
health service's meaning: 200 `SERVING` once the listeners serve and while the store can
be read; 503 `NOT_SERVING` before that, while the store cannot be read, and from the
moment a drain begins (SIGTERM), so a load balancer stops sending work first. Any other
path is 404: a probe pointed at a wrong path fails instead of reading metrics as health.

Like every listener, it answers only a `Host` that no DNS name can be rebound to (a
loopback name on a loopback address; a loopback name or an IP address elsewhere), so a
web page cannot read it through DNS rebinding (403 otherwise).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any

_TEXT = [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store")]


def _answer(start_response: Callable[..., Any], status: str, body: bytes,
            extra: tuple[tuple[str, str], ...] = ()) -> list[bytes]:
    start_response(status, [*_TEXT, *extra, ("Content-Length", str(len(body)))])
    return [body]


class BoundedRead:
    """Whether `read` answers True within `limit` seconds. At most one read runs at a
    time, on a thread of its own: a probe never waits past `limit` on a hung store, and a
    hung read is never joined by a second one. `__call__` waits on the calling thread (the
    HTTP probes), `wait` on the event loop (the gRPC health service's store check).

    The reads run one after another on the same thread, started with the first: a thread
    per read (the health service reads every second) would open a store connection per
    read, each thread its own."""

    def __init__(self, read: Callable[[], bool], limit: float):
        self._read, self._limit = read, limit
        self._lock = threading.Lock()
        self._running: concurrent.futures.Future[bool] | None = None
        self._requests: queue.SimpleQueue[concurrent.futures.Future[bool]] | None = None

    def __call__(self) -> bool:
        try:
            return self._current().result(timeout=self._limit)
        except concurrent.futures.TimeoutError:
            return False

    async def wait(self) -> bool:
        # Shielded: a probe that gives up at `limit` leaves the read running, never cancelled,
        # so the next probe joins it instead of starting a second one.
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self._current())), self._limit)
        except TimeoutError:
            return False

    def _current(self) -> concurrent.futures.Future[bool]:
        with self._lock:
            if self._running is None or self._running.done():
                self._running = self._start()
            return self._running

    def _start(self) -> concurrent.futures.Future[bool]:
        """A read handed to the reader thread (called under the lock, when no read runs:
        the thread is waiting for it)."""
        future: concurrent.futures.Future[bool] = concurrent.futures.Future()
        if self._requests is None:
            self._requests = queue.SimpleQueue()
            # A daemon thread, not an executor's: a read hung at exit must not hold the exit.
            threading.Thread(target=self._serve, args=(self._requests,), name="readiness-read", daemon=True).start()
        self._requests.put(future)
        return future

    def _serve(self, requests: queue.SimpleQueue[concurrent.futures.Future[bool]]) -> None:
        while True:
            future = requests.get()
            try:
                future.set_result(self._read())
            except BaseException as exc:  # noqa: BLE001 - handed to the prober, who answers not ready
                future.set_exception(exc)


class Readiness:
    """Whether this sidecar should get traffic: set once it serves, cleared when it
    drains; `healthy` (the store's reachability) is asked on each probe while set."""

    def __init__(self, healthy: Callable[[], bool] | None = None):
        self._serving = threading.Event()
        self._healthy = healthy

    def serving(self, healthy: Callable[[], bool] | None = None) -> None:
        if healthy is not None:
            self._healthy = healthy
        self._serving.set()

    def draining(self) -> None:
        self._serving.clear()

    def ready(self) -> bool:
        if not self._serving.is_set():
            return False
        try:
            return self._healthy() if self._healthy is not None else True
        except Exception:  # noqa: BLE001 - a probe that cannot tell says not ready (fail closed)
            return False


def probe_app(metrics_app: Callable[..., Iterable[bytes]], readiness: Readiness,
              answers_host: Callable[[str], bool]) -> Callable[..., Iterable[bytes]]:
    """A WSGI app: the three routes above, GET (and HEAD) only, for the Hosts `answers_host` takes."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if not answers_host(environ.get("HTTP_HOST", "")):
            return _answer(start_response, "403 Forbidden", b"this listener answers requests for a loopback host "
                                                            b"or an IP address only\n")
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return _answer(start_response, "405 Method Not Allowed", b"method not allowed\n", (("Allow", "GET, HEAD"),))
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path == "/healthz":
            return _answer(start_response, "200 OK", b"ok\n")
        if path == "/readyz":
            if readiness.ready():
                return _answer(start_response, "200 OK", b"SERVING\n")
            return _answer(start_response, "503 Service Unavailable", b"NOT_SERVING\n")
        return _answer(start_response, "404 Not Found", b"not found: the paths are /metrics, /healthz and /readyz\n")

    return app
