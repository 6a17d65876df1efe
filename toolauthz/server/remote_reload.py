"""Bundles from a bundle server (`bundle_server:`): poll, verify, activate atomically.

The poller fetches the archive (bundle/remote.py) every `poll_seconds`, spread by
`jitter` so that a fleet does not poll in step, and backs off exponentially (up to
`max_backoff_seconds`) while the server fails. A 200 is compared with the last archive
by its SHA-256, not by its ETag, so a server whose ETag never changes while the content
does is still noticed. A 304 is trusted only until the next full fetch: every
`revalidate_every`-th poll omits If-None-Match, so a server that answers 304 for new
content is caught within that many polls.

A new archive is read within bounds (bundle/archive.py), its signature checked over
exactly the bytes read, its revision checked against the serving one, then loaded and
swapped in whole (bundle/from_files.py, BundleHolder). Anything else leaves the last
good bundle serving, and says so: `last_error` (GetStatus), the metrics
`toolauthz_bundle_fetches`, `toolauthz_bundle_fetch_failures`, `toolauthz_reload_errors`,
and a `bundle` audit record for each refused archive and for the start of an outage.
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

from toolauthz.audit.records import AuditEvent
from toolauthz.audit.sink import AuditSink
from toolauthz.bundle import Bundle, BundleHolder
from toolauthz.bundle.archive import DEFAULT_LIMITS, ArchiveError, ArchiveLimits, read_archive
from toolauthz.bundle.from_files import load_bundle_files
from toolauthz.bundle.remote import BundleFetcher, BundleFetchError, Fetched
from toolauthz.bundle.signature import SIGNATURE_FILE
from toolauthz.clock import Clock, SystemClock
from toolauthz.errors import BundleError, Problem, StoreUnavailable
from toolauthz.server.reload import BUNDLE_LOADED, BUNDLE_REFUSED
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
                      limits: ArchiveLimits) -> Bundle:
    """The verified bundle an archive holds, or BundleError (an archive refused is a
    problem on `.signatures.json`: nothing in it can be trusted before the signature)."""
    try:
        files = read_archive(data, limits)
    except ArchiveError as exc:
        raise BundleError([Problem(SIGNATURE_FILE, f"refused: {exc}")]) from None
    try:
        return load_bundle_files(files, keys, min_revision)
    except OSError as exc:  # its temporary directory (from_files.py): no bundle, and why
        raise BundleError([Problem(SIGNATURE_FILE, f"cannot load the archive: {exc.strerror}")]) from None


def successor(body: bytes, serving: Bundle | None, keys: Mapping[str, Ed25519PublicKey],
              limits: ArchiveLimits) -> Bundle:
    """The bundle an archive holds if it may follow `serving`: not older, and other
    content under the same revision is refused (a revision names one signed bundle)."""
    bundle = load_from_archive(body, keys, serving.revision if serving is not None else None, limits)
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


class RemoteBundleReloader:
    """Keeps `holder` on the newest verified bundle the server has. The same surface as
    BundleReloader (reloads, last_error, trigger, wait_for_attempt, after_swap, ...)."""

    def __init__(self, holder: BundleHolder, fetcher: BundleFetcher, first: Fetched, *,
                 keys: Mapping[str, Ed25519PublicKey], schedule: PollSchedule, limits: ArchiveLimits = DEFAULT_LIMITS,
                 audit: AuditSink | None = None, clock: Clock | None = None,
                 draw: Callable[[float, float], float] = random.uniform, cache: pathlib.Path | None = None,
                 start_problem: str = "", start_unreachable: bool = False):
        """`first`: the archive serving now. `cache`: where each activated archive is kept
        (remote_start.py). `start_problem`: why the start fell back to the cached archive
        (`start_unreachable`: because the server could not be reached)."""
        self._holder = holder
        self._fetcher = fetcher
        self._keys = keys
        self._schedule = schedule
        self._limits = limits
        self._audit = audit
        self._clock = clock or SystemClock()
        self._draw = draw
        self._etag = first.etag
        self._digest = hashlib.sha256(first.body or b"").hexdigest()  # the last archive judged
        self._polls = 0
        self.failures = 0
        self._refusal = ""  # why the archive the server serves now was refused, if it was
        self.last_error = ""
        self.reloads = 0
        self.attempts = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._attempted = threading.Condition()
        self._thread: threading.Thread | None = None
        self.after_swap: Callable[[], None] | None = None
        self.after_attempt: Callable[[], None] | None = None
        self._cache = cache
        if start_problem:
            self.last_error = start_problem
            serving = holder.current
            if start_unreachable:
                self.failures = 1
                metrics.BUNDLE_FETCH_FAILURES.set(1)
                self._record(BUNDLE_UNREACHABLE, serving, ("bundle_unreachable",),
                             {"reason": start_problem[:2000], "source": self.source})
            else:
                self._refusal = start_problem
                self._record(BUNDLE_REFUSED, serving, ("bundle_signature",),
                             {"reason": start_problem[:2000], "source": self.source})

    @property
    def source(self) -> str:
        return self._fetcher.url

    def wait_for_attempt(self, after: int, timeout: float) -> bool:
        with self._attempted:
            return self._attempted.wait_for(lambda: self.attempts > after, timeout)

    def reload(self, *, unconditional: bool = False) -> bool:
        """One poll: fetch, and verify and swap in what is new. True when a new version
        is serving."""
        try:
            with self._lock:
                return self._poll(unconditional)
        finally:
            if self.after_attempt is not None:
                self.after_attempt()
            with self._attempted:
                self.attempts += 1
                self._attempted.notify_all()

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
        digest = hashlib.sha256(fetched.body).hexdigest()
        self._etag = fetched.etag
        if digest == self._digest:
            metrics.BUNDLE_FETCHES.labels(outcome="unchanged").inc()
            return False
        self._digest = digest  # judged once: the same bad archive is not re-verified every poll
        try:
            bundle = successor(fetched.body, serving, self._keys, self._limits)
        except BundleError as exc:
            self._refused(exc, serving)
            return False
        self.last_error = self._refusal = ""
        if bundle.version == serving.version:
            metrics.BUNDLE_FETCHES.labels(outcome="unchanged").inc()
            return False
        self._holder.swap(bundle)
        if self._cache is not None:
            save_archive(self._cache, fetched.body)
        metrics.BUNDLE_FETCHES.labels(outcome="new").inc()
        self._record(BUNDLE_LOADED, bundle, (), {"previous_version": serving.version, "revision": bundle.revision,
                                                 "source": self.source})
        metrics.RELOADS.inc()
        metrics.serving_version(bundle.version, serving.version)
        if self.after_swap is not None:
            self.after_swap()
        self.reloads += 1
        log.info("bundle from the bundle server loaded: version %s, revision %s", bundle.version, bundle.revision)
        return True

    def _refused(self, exc: BundleError, serving: Bundle) -> None:
        self.last_error = self._refusal = f"bundle server archive refused: {exc}"
        metrics.BUNDLE_FETCHES.labels(outcome="refused").inc()
        metrics.RELOAD_ERRORS.inc()
        signature = any(p.file == SIGNATURE_FILE for p in exc.problems)
        if signature:
            metrics.BUNDLE_SIGNATURE_REFUSALS.inc()
        self._record(BUNDLE_REFUSED, serving, ("bundle_signature" if signature else "bundle_invalid",),
                     {"reason": str(exc)[:2000], "source": self.source})
        log.error("bundle from the bundle server refused; version %s keeps serving", serving.version,
                  extra={"problems": [str(p) for p in exc.problems]})

    def _unreachable(self, exc: BundleFetchError, serving: Bundle) -> None:
        self.failures += 1
        metrics.BUNDLE_FETCHES.labels(outcome=exc.reason).inc()
        metrics.BUNDLE_FETCH_FAILURES.set(self.failures)
        message = f"bundle server: {exc}; version {serving.version} keeps serving"
        if self.failures == 1:  # one record and one error line per outage, not one per poll
            self._record(BUNDLE_UNREACHABLE, serving, (f"bundle_{exc.reason}",), {"reason": str(exc)[:2000],
                                                                                    "source": self.source})
            log.error("%s", message)
        else:
            log.warning("%s (%d failures in a row)", message, self.failures)
        self.last_error = message

    def _reachable(self) -> None:
        if self.failures:
            log.info("the bundle server answers again after %d failed polls", self.failures)
            self.last_error = self._refusal
        self.failures = 0
        metrics.BUNDLE_FETCH_FAILURES.set(0)

    def _record(self, result: str, bundle: Bundle, codes: tuple[str, ...], detail: dict[str, object]) -> None:
        if self._audit is None:
            return
        try:
            self._audit.write(AuditEvent(kind="bundle", time=self._clock.now(), result=result,
                                         policy_version=bundle.version, error_codes=codes, detail=detail))
        except StoreUnavailable as exc:  # the outcome stands; its record is what is lost, and said so
            log.error("the audit record of a bundle poll (%s) could not be written: %s", result, exc)

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
