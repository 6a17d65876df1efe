"""Cutting a database operation that has stopped answering.

A connection whose peer stops forwarding without closing (a hung proxy, a frozen
server, a partition that still acknowledges TCP) never errors by itself: libpq waits on
the socket for as long as it takes, and so would the decision pump and every health
probe behind it. TCP keepalives and a TCP user timeout catch a peer that stops
acknowledging; they cannot catch one whose kernel still does, and a server-side
statement timeout cannot fire for statements the server never received. So each
operation is watched from outside: one that has not finished within `limit` seconds has
its socket shut down, the blocked read returns at once, psycopg raises, and the caller
answers UNAVAILABLE (no token: nothing the operation would have committed left the
process). The pool discards the broken connection.

Cutting after COMMIT was sent cannot make a transaction half-done: the server commits
it whole or not at all. It may commit after the caller was told UNAVAILABLE (when a
stalled link forwards its buffer later): a record without a token, never a token
without a record.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

log = logging.getLogger("toolauthz.store")


class Watchdog:
    """Watches operations on connections; cuts those older than `limit` seconds."""

    def __init__(self, limit: float, *, name: str = "database"):
        self.limit = limit
        self._name = name
        self._cond = threading.Condition()
        self._ops: dict[int, tuple[psycopg.Connection[Any], float]] = {}
        self._ids = itertools.count()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.cuts = 0

    @contextmanager
    def watching(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        key = next(self._ids)
        with self._cond:
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._run, name="store-watchdog", daemon=True)
                self._thread.start()
            self._ops[key] = (conn, time.monotonic() + self.limit)
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._ops.pop(key, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                now = time.monotonic()
                overdue = [key for key, (_conn, due) in self._ops.items() if due <= now]
                cut = [self._ops.pop(key)[0] for key in overdue]
                if not cut:
                    due = min((d for _c, d in self._ops.values()), default=now + self.limit)
                    self._cond.wait(timeout=max(due - now, 0.01))
                    continue
            for conn in cut:
                self.cuts += 1
                log.warning("%s: an operation did not answer within %.1fs: its connection is cut "
                            "(the call is answered UNAVAILABLE)", self._name, self.limit)
                shut_down(conn)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()


def shut_down(conn: psycopg.Connection[Any]) -> None:
    """Shuts the connection's socket down under libpq, from another thread: a read
    blocked on it returns (end of stream) and the connection is then broken."""
    try:
        fd = os.dup(conn.fileno())
    except (OSError, psycopg.Error):
        return  # already closed
    sock = socket.socket(fileno=fd)
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


def keepalive_options(limit: float) -> dict[str, Any]:
    """libpq connection parameters that let the kernel notice a peer that stops
    acknowledging within about `limit` seconds (keepalives for an idle connection, the
    TCP user timeout for data left unacknowledged)."""
    seconds = max(1, int(limit))
    return {"keepalives": 1, "keepalives_idle": seconds, "keepalives_interval": max(1, seconds // 3),
            "keepalives_count": 3, "tcp_user_timeout": seconds * 1000}
