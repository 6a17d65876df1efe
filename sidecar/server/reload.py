"""Hot reload: watch the bundle directory (and SIGHUP), load and validate a new bundle
off the request path, then swap it in atomically. An invalid bundle never replaces a
good one: the last good bundle keeps serving and the error is kept for GetStatus."""

from __future__ import annotations

import logging
import os
import pathlib
import threading
from collections.abc import Callable

from sidecar.bundle import BundleHolder, load_bundle
from sidecar.errors import BundleError
from sidecar.telemetry import metrics

log = logging.getLogger("toolauthz.reload")


def fingerprint(directory: pathlib.Path) -> tuple:
    """Cheap change detection: every file's path, size and modification time."""
    entries = []
    for root, _dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue  # removed while we looked; the next look sees the new state
            entries.append((os.path.relpath(path, directory), st.st_size, st.st_mtime_ns))
    return tuple(sorted(entries))


class BundleReloader:
    def __init__(self, holder: BundleHolder, *, poll_seconds: float = 1.0):
        """poll_seconds = 0: no polling; reload only when triggered (SIGHUP)."""
        self._holder = holder
        self._directory = pathlib.Path(holder.current.directory)
        self._poll = poll_seconds
        self._lock = threading.Lock()  # one reload at a time (watcher and SIGHUP)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._seen = fingerprint(self._directory)
        self.last_error = ""
        self.reloads = 0
        self.attempts = 0
        self._attempted = threading.Condition()
        self._thread: threading.Thread | None = None
        self.after_swap: Callable[[], None] | None = None  # serving processes: heap.py
        self.after_attempt: Callable[[], None] | None = None  # the worker's status board

    def wait_for_attempt(self, after: int, timeout: float) -> bool:
        """Block until more than `after` reload attempts have finished (for tests and
        tools that must see the outcome of a change without sleeping)."""
        with self._attempted:
            return self._attempted.wait_for(lambda: self.attempts > after, timeout)

    def reload(self) -> bool:
        """Load, validate and swap. True when a new version is serving."""
        try:
            return self._reload()
        finally:
            if self.after_attempt is not None:
                self.after_attempt()
            with self._attempted:
                self.attempts += 1
                self._attempted.notify_all()

    def _reload(self) -> bool:
        with self._lock:
            seen = fingerprint(self._directory)
            try:
                bundle = load_bundle(self._directory)
            except BundleError as exc:
                self.last_error = str(exc)
                metrics.RELOAD_ERRORS.inc()
                log.error("bundle reload refused; version %s keeps serving:\n%s", self._holder.current.version, exc)
                return False
            finally:
                self._seen = seen
            self.last_error = ""
            if bundle.version == self._holder.current.version:
                return False
            previous = self._holder.current.version
            self._holder.swap(bundle)
            metrics.RELOADS.inc()
            metrics.serving_version(bundle.version, previous)
            if self.after_swap is not None:
                self.after_swap()
            self.reloads += 1
            log.info("bundle reloaded: version %s", bundle.version)
            return True

    def trigger(self) -> None:
        """Ask the watcher thread to reload now (safe from a signal handler)."""
        self._wake.set()

    def start(self) -> BundleReloader:
        self._thread = threading.Thread(target=self._run, name="bundle-reloader", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            triggered = self._wake.wait(self._poll or None)
            self._wake.clear()
            if self._stop.is_set():
                return
            current = fingerprint(self._directory)
            if not triggered and current == self._seen:
                continue
            if not triggered:
                # An editor may still be writing: reload once the directory has held
                # still for one poll interval (SIGHUP reloads at once).
                self._stop.wait(self._poll)
                if fingerprint(self._directory) != current:
                    continue
            self.reload()
