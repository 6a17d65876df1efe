"""Decision logs shipped: batches of decision events POSTed to an HTTP endpoint, in the
manner of OPA's decision-log plugin (a gzip'd JSON array of events per request).

The decision path only ever appends an encoded event to a bounded buffer (`offer`):
it never waits for the network, a lock held across I/O, or a full buffer. When the
buffer holds `buffer_max_events` events or `buffer_max_bytes` bytes, the new event is
dropped and counted (`toolauthz_decision_log_events_total{outcome="dropped_buffer_full"}`),
so a stalled or slow receiver costs memory up to the bound and never a decision's time.
One thread sends: a batch at a time, retried with exponential backoff and full jitter on
a network error, 408, 429 or 5xx, up to `max_attempts`; then dropped and counted. A
4xx other than those is final (the receiver refused the batch).

Shipping is for observability, not for the record: the audit trail (committed before a
token leaves) is the record, so dropping a shipped event under pressure is safe, and
counted. The events carry the same fields as the stdout decision log, with the same
allow-listing of arguments (toolauthz/telemetry/decision_log.py).
"""

from __future__ import annotations

import atexit
import collections
import gzip
import http.client
import logging
import random
import re
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from toolauthz.errors import ToolAuthzError
from toolauthz.server.config.observing import DecisionLogHttpSettings, DecisionLogSettings
from toolauthz.telemetry import decision_log, metrics

log = logging.getLogger("toolauthz.decision_shipping")

_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
_MAX_ANSWER_BYTES = 64 * 1024
_RETRY_STATUSES = frozenset({408, 429})
USER_AGENT = "toolauthz-decision-log"


@dataclass(frozen=True)
class Endpoint:
    """Where batches go and with which headers; read once at start."""

    url: str
    headers: dict[str, str]
    tls: ssl.SSLContext | None
    timeout: float

    @classmethod
    def from_settings(cls, settings: DecisionLogHttpSettings) -> Endpoint:
        # Here, not at the top: a sidecar that ships no decisions loads no sink modules.
        from toolauthz.notify.sinks import check_url

        try:
            url = check_url(settings.url)
        except ValueError as exc:
            raise ToolAuthzError(f"decision_log.http.url: {exc}") from None
        headers = read_headers(settings.headers_file) if settings.headers_file else {}
        if settings.bearer_token_file is not None:
            token = _read_secret(settings.bearer_token_file, "decision_log.http.bearer_token_file")
            headers["Authorization"] = f"Bearer {token}"
        tls = None
        if url.startswith("https://"):
            try:
                tls = ssl.create_default_context(cafile=str(settings.ca_file) if settings.ca_file else None)
            except (OSError, ssl.SSLError) as exc:
                raise ToolAuthzError(f"decision_log.http.ca_file: cannot load: {exc}") from None
        return cls(url, headers, tls, settings.timeout_seconds)


def read_headers(path) -> dict[str, str]:
    """`Name: value` per line (blank lines and `#` comments skipped), kept in a file
    because a header may hold a credential. A line that could split or inject a header is
    refused, with its line number only (never its text: it may be a secret)."""
    text = _read_secret(path, "decision_log.http.headers_file", strip=False)
    headers: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, value = line.partition(":")
        value = value.strip()
        if not sep or not _HEADER_NAME.match(name.strip()) or not value or not value.isprintable():
            raise ToolAuthzError(f"decision_log.http.headers_file: line {number} is not `Name: value`")
        headers[name.strip()] = value
    return headers


def _read_secret(path, what: str, *, strip: bool = True) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read(64 * 1024)  # a secret is short: a huge file is not read whole
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolAuthzError(f"{what}: cannot read: {getattr(exc, 'strerror', None) or 'not UTF-8'}") from None
    if strip:
        text = text.strip()
        if not text or not text.isprintable():
            raise ToolAuthzError(f"{what}: must hold one line of printable text")
    return text


class DecisionShipper:
    """A bounded buffer of encoded events and the thread that sends them."""

    def __init__(self, settings: DecisionLogHttpSettings, endpoint: Endpoint, *,
                 post: Callable[[Endpoint, bytes], int] | None = None, rng: random.Random | None = None):
        self._settings = settings
        self._endpoint = endpoint
        self._post = post or post_batch
        self._rng = rng or random.Random()
        self._buffer: collections.deque[bytes] = collections.deque()
        self._bytes = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="decision-shipper", daemon=True)

    def start(self) -> DecisionShipper:
        self._thread.start()
        return self

    def offer(self, event: bytes) -> None:
        """Take one encoded event, or drop it when the buffer is full. Never blocks on I/O."""
        settings = self._settings
        with self._lock:
            full = len(self._buffer) >= settings.buffer_max_events or \
                self._bytes + len(event) > settings.buffer_max_bytes
            if not full:
                self._buffer.append(event)
                self._bytes += len(event)
            waiting = len(self._buffer)
        if full:
            metrics.DECISION_LOG_EVENTS.labels(outcome="dropped_buffer_full").inc()
            return
        if waiting >= settings.batch_max_events:
            self._wake.set()

    def buffered(self) -> tuple[int, int]:
        """Events and bytes waiting now."""
        with self._lock:
            return len(self._buffer), self._bytes

    def close(self, grace: float = 2.0) -> None:
        """Stop; what is buffered gets one more try within `grace` seconds."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(grace)

    def _take(self) -> list[bytes]:
        with self._lock:
            batch: list[bytes] = []
            while self._buffer and len(batch) < self._settings.batch_max_events:
                event = self._buffer.popleft()
                self._bytes -= len(event)
                batch.append(event)
            return batch

    def _run(self) -> None:
        while True:
            self._wake.wait(self._settings.flush_interval_seconds)
            self._wake.clear()
            stopping = self._stop.is_set()
            while batch := self._take():
                self._send(batch, stopping)
                if self._stop.is_set() and not stopping:
                    stopping = True
            if stopping:
                return

    def _send(self, batch: list[bytes], stopping: bool) -> None:
        body = gzip.compress(b"[" + b",".join(batch) + b"]")
        settings = self._settings
        attempts = 1 if stopping else settings.max_attempts
        delay = settings.backoff_initial_seconds
        for attempt in range(1, attempts + 1):
            try:
                status = self._post(self._endpoint, body)
            except (OSError, http.client.HTTPException) as exc:
                status, error = 0, type(exc).__name__
            else:
                error = f"status {status}"
            if 200 <= status < 300:
                metrics.DECISION_LOG_EVENTS.labels(outcome="shipped").inc(len(batch))
                return
            if status and status not in _RETRY_STATUSES and status < 500:
                log.warning("the decision log receiver refused a batch of %d events (%s); dropped", len(batch), error)
                metrics.DECISION_LOG_EVENTS.labels(outcome="dropped_refused").inc(len(batch))
                return
            if attempt < attempts:
                # Full jitter: senders that failed together do not retry together.
                if self._stop.wait(self._rng.uniform(0, delay)):
                    attempts = attempt + 1  # stopping: one last try, then give up
                delay = min(delay * 2, settings.backoff_max_seconds)
        log.warning("cannot ship a batch of %d decision events (%s); dropped", len(batch), error)
        metrics.DECISION_LOG_EVENTS.labels(outcome="dropped_failed").inc(len(batch))


def post_batch(endpoint: Endpoint, body: bytes) -> int:
    """One POST; the answer's status. Redirects are not followed (a receiver's URL may
    hold a credential, and the batch holds decisions)."""
    parts = urllib.parse.urlsplit(endpoint.url)
    host, port = parts.hostname or "", parts.port
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(host, port, timeout=endpoint.timeout, context=endpoint.tls)
    else:
        connection = http.client.HTTPConnection(host, port, timeout=endpoint.timeout)
    path = parts.path or "/"
    if parts.query:
        path += f"?{parts.query}"
    try:
        connection.request("POST", path, body=body, headers={
            **endpoint.headers, "Content-Type": "application/json", "Content-Encoding": "gzip",
            "User-Agent": USER_AGENT})
        answer = connection.getresponse()
        answer.read(_MAX_ANSWER_BYTES)
        return answer.status
    finally:
        connection.close()


_current: list[DecisionShipper] = []


def configure_decision_log(settings: DecisionLogSettings) -> DecisionShipper | None:
    """This process's decision log: the allow-list, and the shipper when `http` is set
    (ToolAuthzError when its files are unusable: the sidecar refuses to start). A shipper
    configured before is stopped; the last one gets its grace at exit."""
    for shipper in _current:
        shipper.close(grace=0)
    _current.clear()
    if settings.http is None:
        decision_log.configure(settings.arguments)
        return None
    shipper = DecisionShipper(settings.http, Endpoint.from_settings(settings.http)).start()
    _current.append(shipper)
    decision_log.configure(settings.arguments, ship=shipper.offer)
    return shipper


@atexit.register
def _flush_at_exit() -> None:
    for shipper in _current:
        shipper.close()
