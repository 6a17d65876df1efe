"""Bundles from a bundle server (`bundle_server:`): poll, verify, activate atomically.

The poller fetches the archive (bundle/remote.py) every `poll_seconds`, spread by
`jitter` so that a fleet does not poll in step, and backs off exponentially (up to
`max_backoff_seconds`) while the server fails. A 200 is compared with the last archive
by its SHA-256, not by its ETag, so a server whose ETag never changes while the content
does is still noticed. A 304 is trusted only until the next full fetch: every
`revalidate_every`-th poll omits If-None-Match, so a server that answers 304 for new
content is caught within that many polls.

A new archive is read within bounds into a snapshot (bundle/archive.py), its signature
checked over exactly those bytes and the same bytes parsed (bundle/verified.py, as for a
directory), its revision held to the store's floor as a directory reload holds it
(activation.py: a fleet sharing a PostgreSQL store never serves below the highest
revision any replica activated), then swapped in whole (BundleHolder). Anything else
leaves the last good bundle serving, and says so: `last_error` (GetStatus), the metrics
`toolauthz_bundle_fetches`, `toolauthz_bundle_fetch_failures`, `toolauthz_reload_errors`,
and a `bundle` audit record (tenant `_system`) for each refused archive and for the
start of an outage.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pathlib
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from toolauthz.audit.sink import AuditSink
from toolauthz.bundle import Bundle, BundleHolder
from toolauthz.bundle.archive import DEFAULT_LIMITS, ArchiveError, ArchiveLimits, archive_snapshot
from toolauthz.bundle.remote import BundleFetcher, BundleFetchError, Fetched
from toolauthz.bundle.signature import SIGNATURE_FILE
from toolauthz.bundle.verified import load_verified
from toolauthz.clock import Clock
from toolauthz.errors import BundleError, Problem
from toolauthz.server.activation import Activations, record_bundle
from toolauthz.store.faces import BundleFloor
from toolauthz.telemetry import metrics

log = logging.getLogger("toolauthz.reload")

BUNDLE_UNREACHABLE = "unreachable"  # a `bundle` audit record's result: an outage began


@dataclass(frozen=True)
class PollSchedule:
    poll_seconds: float
    jitter: float = 0.1  # each wait is poll_seconds x (1 +- jitter)
    max_backoff_seconds: float = 300.0
    revalidate_every: int = 10

    def delay(self, failures: int, draw: Callable[[float, float], float]) -> float:
        """Seconds to the next poll after `failures` failed polls in a row."""
        base = self.poll_seconds if failures == 0 else \
            min(self.max_backoff_seconds, self.poll_seconds * 2 ** min(failures, 30))
        return max(0.0, base * draw(1 - self.jitter, 1 + self.jitter))


def load_from_archive(data: bytes, keys: Mapping[str, Ed25519PublicKey], min_revision: int | None,
                      limits: ArchiveLimits, source: str) -> Bundle:
    """The verified bundle an archive holds, or BundleError (an archive refused is a
    problem on `.signatures.json`: nothing in it can be trusted before the signature).
    `source`: where the archive came from (the server's URL, the kept archive)."""
    try:
        snapshot = archive_snapshot(data, source, limits)
    except ArchiveError as exc:
        raise BundleError([Problem(SIGNATURE_FILE, f"refused: {exc}")]) from None
    return load_verified(snapshot, keys, min_revision)


def successor(body: bytes, serving: Bundle | None, keys: Mapping[str, Ed25519PublicKey],
              limits: ArchiveLimits, source: str) -> Bundle:
    """The bundle an archive holds if it may follow `serving` (at start: the kept archive's,
    before the store's floor is known; build.py holds the result to it): not older, and
    other content under the same revision is refused (a revision names one signed bundle)."""
    bundle = load_from_archive(body, keys, serving.revision if serving is not None else None, limits, source)
    if serving is not None and bundle.revision == serving.revision and bundle.version != serving.version:
        raise BundleError([Problem(SIGNATURE_FILE, f"refused: revision {bundle.revision} is the serving one's, "
                                                   "but the content differs; sign a new revision")])
    return bundle


def save_archive(cache: pathlib.Path, data: bytes) -> None:
    """Keep `data` as the last good archive; a failure is logged, never fatal."""
    temporary = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, cache)
    except OSError as exc:
        log.warning("cannot keep the bundle archive (sha256 %s) in `%s`: %s", hashlib.sha256(data).hexdigest()[:16],
                    cache, exc.strerror)


class RemoteBundleReloader(Activations):
    """Keeps `holder` on the newest verified bundle the server has, at or above the
    store's floor. The same surface as BundleReloader (both are Activations)."""

    def __init__(self, holder: BundleHolder, fetcher: BundleFetcher, first: Fetched, *,
                 keys: Mapping[str, Ed25519PublicKey], schedule: PollSchedule, limits: ArchiveLimits = DEFAULT_LIMITS,
                 audit: AuditSink | None = None, clock: Clock | None = None, floor: BundleFloor | None = None,
                 retaining: bool = True, settings_changes: Callable[[], tuple[str, ...]] | None = None,
                 draw: Callable[[float, float], float] = random.uniform, cache: pathlib.Path | None = None,
                 start_problem: str = "", start_unreachable: bool = False):
        """`first`: the archive serving now. `cache`: where each activated archive is kept
        (remote_start.py). `start_problem`: why the start fell back to the cached archive
        (`start_unreachable`: because the server could not be reached); the start's own
        `bundle` record says so (build.py), so none is written here."""
        super().__init__(holder, keys=keys, floor=floor, audit=audit, clock=clock, retaining=retaining,
                         settings_changes=settings_changes)
        self._fetcher = fetcher
        self._schedule = schedule
        self._limits = limits
        self._draw = draw
        self._etag = first.etag
        self._digest = hashlib.sha256(first.body or b"").hexdigest()  # the last archive judged
        self._polls = 0
        self.failures = 0
        self._refusal = ""  # why the archive the server serves now was refused, if it was
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._cache = cache
        self.last_error = start_problem
        if start_unreachable:
            self.failures = 1  # the outage began at the start: its record is the start's
            metrics.BUNDLE_FETCH_FAILURES.set(1)
        else:
            self._refusal = start_problem

    @property
    def source(self) -> str:
        return self._fetcher.url

    def reload(self, *, unconditional: bool = False) -> bool:
        """One poll: fetch, and verify and swap in what is new. True when a new version
        is serving. `unconditional` (SIGHUP): fetch in full and judge the archive again
        even when it is the last one judged (after `bundle allow-rollback`, say)."""
        try:
            with self._lock:
                return self._poll(unconditional)
        finally:
            self._attempt_done()

    def _poll(self, unconditional: bool) -> bool:
        self._polls += 1
        full = unconditional or self._polls % self._schedule.revalidate_every == 0
        serving = self._holder.current
        try:
            fetched = self._fetcher.fetch("" if full else self._etag)
        except BundleFetchError as exc:
            if exc.reason != "cancelled":  # cancelled: the sidecar is stopping, the server is not down
                self._unreachable(exc, serving)
            return False
        self._reachable()
        if fetched.body is None:
            metrics.BUNDLE_FETCHES.labels(outcome="not_modified").inc()
            return False
        body = fetched.body
        digest = hashlib.sha256(body).hexdigest()
        self._etag = fetched.etag
        if digest == self._digest and not unconditional:
            metrics.BUNDLE_FETCHES.labels(outcome="unchanged").inc()
            return False
        self._digest = digest  # judged once: the same bad archive is not re-verified every poll
        try:
            bundle = self._admit(lambda floor: load_from_archive(body, self._keys or {}, floor, self._limits,
                                                                 self.source), serving)
        except BundleError as exc:
            self.last_error = self._refusal = f"bundle server archive refused: {exc}"
            metrics.BUNDLE_FETCHES.labels(outcome="refused").inc()
            self._refuse(exc, serving, "bundle from the bundle server", {"source": self.source})
            return False
        self.last_error = self._refusal = ""
        if bundle.version == serving.version:
            metrics.BUNDLE_FETCHES.labels(outcome="unchanged").inc()
            return False
        metrics.BUNDLE_FETCHES.labels(outcome="new").inc()
        self._swap(bundle, serving, {"at": "poll", "source": self.source})
        if self._cache is not None:
            save_archive(self._cache, body)
        log.info("bundle from the bundle server loaded: version %s, revision %s", bundle.version, bundle.revision)
        return True

    def _unreachable(self, exc: BundleFetchError, serving: Bundle) -> None:
        self.failures += 1
        metrics.BUNDLE_FETCHES.labels(outcome=exc.reason).inc()
        metrics.BUNDLE_FETCH_FAILURES.set(self.failures)
        message = f"bundle server: {exc}; version {serving.version} keeps serving"
        self.last_error = message  # before the log line: whoever reads the line sees it in status
        if self.failures == 1:  # one record and one error line per outage, not one per poll
            record_bundle(self._audit, self._clock, BUNDLE_UNREACHABLE, serving, (f"bundle_{exc.reason}",),
                          {"reason": str(exc)[:2000], "source": self.source})
            log.error("%s", message)
        else:
            log.warning("%s (%d failures in a row)", message, self.failures)

    def _reachable(self) -> None:
        if self.failures:
            log.info("the bundle server answers again after %d failed polls", self.failures)
            self.last_error = self._refusal
        self.failures = 0
        metrics.BUNDLE_FETCH_FAILURES.set(0)

    def trigger(self) -> None:
        """Poll now, in full (SIGHUP; safe from a signal handler)."""
        self._wake.set()

    def start(self) -> RemoteBundleReloader:
        self._thread = threading.Thread(target=self._run, name="bundle-poller", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._fetcher.cancel()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            triggered = self._wake.wait(self._schedule.delay(self.failures, self._draw))
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.reload(unconditional=triggered)
            except Exception:  # a poller that dies would leave a sidecar stale for good, silently
                log.exception("bundle poll failed unexpectedly; version %s keeps serving",
                              self._holder.current.version)
                self.failures += 1
