"""The PostgreSQL backend: one database shared by a fleet of sidecars.

Connections come from a psycopg_pool pool (`pool_size`), each checked before use (without
a round trip: `_check`) so that a connection the server dropped is replaced rather than
failing a request, in autocommit for reads. Statements are prepared on the server from
their first use (`prepare_threshold=0`). There is no lock over the whole database: a write transaction
first takes a transaction-scoped advisory lock on each row key it writes under (a call,
a run: `Transaction.lock`), all in one statement and in one order, so a run's counts
read in it still hold at its commit and no two transactions wait for each other in a
cycle; single use and one row per call id also rest on the unique keys. Its audit
records are chained last, under row locks on their chains' heads (`audit_head`, `SELECT
... FOR UPDATE` in name order, `store/chains.py`). PostgreSQL commits durably
(synchronous_commit) before `transaction()` returns.

Any error of the database, the network or the pool leaves as StoreUnavailable: the
caller denies, and a transaction cut off midway (the server gone, the backend
terminated) committed nothing.
"""

from __future__ import annotations

import logging
import select
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

from toolauthz.audit.records import DEFAULT_CHAINS, GENESIS_HASH
from toolauthz.errors import StoreUnavailable
from toolauthz.store.ledger import CallEntry, Standing
from toolauthz.store.postgres.foreseen import ForeseenTransaction
from toolauthz.store.postgres.foresight import MISPREDICTED, Foresight
from toolauthz.store.postgres.transaction import APPROVAL_CHANNEL, PgTransaction
from toolauthz.store.postgres.watchdog import Watchdog, keepalive_options
from toolauthz.store.unit import Unforeseen
from toolauthz.telemetry import metrics

log = logging.getLogger("toolauthz.store")


def ensure_heads(url: str, chains: int, *, timeout: float) -> None:
    """Gives each of the `chains` chains a head row (at genesis) if it has none, so that
    appending only ever locks existing rows. A role that may not insert (an auditor
    reading the trail) skips it: it appends nothing."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(timeout))) as conn:
            conn.execute("INSERT INTO audit_head (chain, seq, hash) SELECT n::text, 0, %s "
                         "FROM generate_series(0, %s - 1) AS n ON CONFLICT DO NOTHING", (GENESIS_HASH, chains))
    except psycopg.errors.InsufficientPrivilege:
        return
    except psycopg.Error as exc:
        raise StoreUnavailable(f"database `{shown_url(url)}`: cannot create the audit chains' heads: "
                               f"{_first_line(exc)}") from exc


def shown_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class PgUnit:
    """`url`: a libpq URL (postgresql://user@host:port/dbname?options). `timeout`: how
    long a request waits for a connection before it is refused as unavailable.
    `hang_seconds`: an operation that has not answered by then is cut (watchdog.py),
    and each statement is bounded by it on the server too; None: no bound (the CLI's
    long reads, such as verifying a whole audit trail)."""

    def __init__(self, url: str, *, pool_size: int = 8, timeout: float = 5.0, chains: int = DEFAULT_CHAINS,
                 hang_seconds: float | None = None):
        self.url = url
        self.chains = chains
        self.label = f"database `{shown_url(url)}`"
        self._closed = False
        self._lock = threading.Lock()
        self._listener: _Listener | None = None
        self.foresight = Foresight()
        self._watchdog = Watchdog(hang_seconds, name=self.label) if hang_seconds else None
        kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "connect_timeout": max(1, int(timeout))}
        if hang_seconds:
            kwargs |= keepalive_options(hang_seconds)
        self._statement_ms = int(hang_seconds * 1000) if hang_seconds else 0
        self._pool = ConnectionPool(
            url, min_size=1, max_size=pool_size, open=False, timeout=timeout, name="toolauthz", kwargs=kwargs,
            configure=self._configure, check=self._check)
        self._pool.open(wait=False)

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """A new connection: the server gives up on a statement after `hang_seconds`
        too, so a slow one is not left running after its caller was answered."""
        if self._statement_ms:
            conn.execute(f"SET statement_timeout = {self._statement_ms}")

    @contextmanager
    def _watched(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        if self._watchdog is None:
            yield
        else:
            with self._watchdog.watching(conn):
                yield

    @staticmethod
    def _check(conn: psycopg.Connection[Any]) -> None:
        """Lent without a round trip (an agent's calls come seconds apart: a check that
        asked the server would double a lone decision's wait). An idle connection has
        nothing to read; one the server closed or is closing (a restart, a terminated
        backend, an idle timeout) has said so on its socket, with an error message and
        the end of the stream, and is refused here, so the pool opens another. A peer
        gone without a word (a partition) is for the keepalives and the watchdog."""
        if conn.closed or conn.broken:
            raise psycopg.OperationalError("the connection is closed")
        # poll, not select: a busy process's descriptors run past select's 1023, and a
        # check that raises for every connection would lend none.
        peek = select.poll()
        peek.register(conn.fileno(), select.POLLIN)
        if peek.poll(0):  # data, the end of the stream, or an error (POLLHUP, POLLERR)
            conn.close()  # closed, the pool opens another rather than lending this one again
            raise psycopg.OperationalError("the server closed or is closing this idle connection")

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        if self._closed:
            raise StoreUnavailable(f"{self.label} is closed")
        try:
            yield
        except psycopg.Error as exc:
            raise StoreUnavailable(f"{self.label}: {action} failed: {_first_line(exc)}") from exc

    @contextmanager
    def transaction(self, *, foreseen: bool = False) -> Iterator[PgTransaction]:
        """A write transaction. BEGIN and COMMIT are sent as statements of the pipeline:
        BEGIN goes with the key locks and the reads ahead, COMMIT with the audit records,
        whose chains' heads are so held for one round trip and the commit (psycopg's
        transaction() would wait for each): three round trips for a batch of reservations.
        `foreseen`: its reads predicted and checked in the pipeline (foreseen.py), one
        round trip; Unforeseen if a prediction did not hold (nothing was written)."""
        if foreseen and not self.foresight.worth_trying():
            self.foresight.skipped()  # another writer keeps moving these rows: the long way
            foreseen = False
        with self._errors("write"), self._pool.connection() as conn, self._watched(conn):
            try:
                with conn.pipeline() as pipeline:
                    conn.execute("BEGIN")
                    tx = (ForeseenTransaction(conn, self.chains, pipeline, self.foresight, self._statement_ms)
                          if foreseen else PgTransaction(conn, self.chains, pipeline, self._statement_ms))
                    yield tx
                    tx.flush_audit()
                    conn.execute("COMMIT")
            except psycopg.Error as exc:
                if exc.sqlstate != MISPREDICTED:
                    self._roll_back(conn)
                    raise
                # The counts, meters and heads were read in the pipeline: now known, foreseen
                # again they hold. A call that exists is a replay: the long way.
                moved = tx.missed() if isinstance(tx, ForeseenTransaction) else "unknown"
                self._roll_back(conn)
                self.foresight.tally(hit=False)
                metrics.FORESEEN.labels("miss").inc()
                raise Unforeseen(_first_line(exc), learned=moved in ("counts", "meters", "heads")) from exc
            except BaseException:
                self._roll_back(conn)
                raise
        self.foresight.learn(*tx.learned())
        if foreseen:
            self.foresight.tally(hit=True)
            metrics.FORESEEN.labels("hit").inc()

    def foreseen_standing(self, entries: Sequence[CallEntry]) -> list[Standing] | None:
        """How each entry's run and meters are expected to stand, from what this process
        last read and wrote (foresight.py); None while predictions keep failing (read
        them: the batch's transaction goes the long way too)."""
        return self.foresight.standing(entries) if self.foresight.worth_trying() else None

    @staticmethod
    def _roll_back(conn: psycopg.Connection[Any]) -> None:
        if conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
            with suppress(psycopg.Error):
                conn.execute("ROLLBACK", prepare=False)  # never prepared: in an aborted transaction that fails

    @contextmanager
    def reading(self) -> Iterator[PgTransaction]:
        with self._errors("read"), self._pool.connection() as conn, self._watched(conn):
            yield PgTransaction(conn)

    def listen(self, on_approval: Callable[[str], None]) -> None:
        with self._lock:
            if self._closed or self._listener is not None:
                return
            self._listener = _Listener(self.url, on_approval)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            listener = self._listener
        if listener is not None:
            listener.close()
        if self._watchdog is not None:
            self._watchdog.stop()
        self._pool.close()


class _Listener:
    """LISTEN on the approvals channel on a connection of its own, on a thread that
    calls `on_approval` for each notification (PostgreSQL delivers them at the
    notifying transaction's commit). A lost connection is opened again, and every
    watcher is woken then, since decisions made meanwhile were not heard."""

    def __init__(self, url: str, on_approval: Callable[[str], None]):
        self._url, self._on_approval = url, on_approval
        self._stop = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self._thread = threading.Thread(target=self._run, name="approval-listener", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pause = 0.05
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._url, autocommit=True, connect_timeout=5) as conn:
                    self._conn = conn
                    conn.execute(f"LISTEN {APPROVAL_CHANNEL}")
                    self._on_approval("")  # anything decided while not listening
                    pause = 0.05
                    while not self._stop.is_set():
                        for notify in conn.notifies(timeout=0.5):
                            self._on_approval(notify.payload)
            except psycopg.Error as exc:
                if self._stop.is_set():
                    return
                log.warning("approval notifications: %s; listening again in %.2fs", _first_line(exc), pause)
            self._stop.wait(pause)
            pause = min(pause * 2, 2.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


