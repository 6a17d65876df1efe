"""Hot reload: watch the bundle directory (and SIGHUP), load and validate a new bundle
off the request path, then swap it in atomically. An invalid bundle never replaces a
good one: the last good bundle keeps serving and the error is kept for GetStatus.

A bundle directory may be published by swapping a symlink: Kubernetes projects a
ConfigMap as `DIR/..data -> ..<timestamp>/` (the kubelet writes a new timestamped
directory in full, then renames a new `..data` link over the old one, then deletes the
old directory), and a deploy tool may swap `DIR` itself (`ln -sfn`). Every load reads
one resolved snapshot (`bundle_snapshot`), so a half-written directory is never read
and a swap in the middle of a load never mixes two versions.

A load reads the snapshot once into memory (bundle/snapshot.py), verifies the signature
over those bytes and parses them (bundle/verified.py): the disk is never read again, so
a file swapped after the read cannot be enforced. A signed bundle is also held to the
revision floor the store keeps (store/bundle_floor.py): the highest revision any process
sharing the store activated; going below it takes `toolauthz bundle allow-rollback`."""

from __future__ import annotations

import logging
import os
import pathlib
import stat
import threading
from collections.abc import Callable, Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from toolauthz.audit.sink import AuditSink
from toolauthz.bundle import Bundle, BundleHolder
from toolauthz.bundle.snapshot import BundleSnapshot, read_snapshot
from toolauthz.bundle.verified import load_verified
from toolauthz.clock import Clock
from toolauthz.errors import BundleError, Problem
from toolauthz.server.activation import BUNDLE_LOADED, BUNDLE_REFUSED, Activations
from toolauthz.store.faces import BundleFloor

log = logging.getLogger("toolauthz.reload")

# The link the kubelet swaps when it updates a projected ConfigMap or Secret volume.
KUBERNETES_DATA_LINK = "..data"
_SNAPSHOT_ATTEMPTS = 5
__all__ = ["BUNDLE_LOADED", "BUNDLE_REFUSED", "BundleReloader", "bundle_snapshot", "load_bundle_snapshot"]


def bundle_snapshot(directory: str | os.PathLike[str]) -> pathlib.Path:
    """The real directory that holds the bundle now: the target of `DIR/..data` when
    there is one (a Kubernetes projected volume), else `DIR` with its symlinks resolved.
    Neither changes once published: a new version arrives as a new directory."""
    root = pathlib.Path(directory)
    data = root / KUBERNETES_DATA_LINK
    return pathlib.Path(os.path.realpath(data if os.path.lexists(data) else root))


def load_bundle_snapshot(directory: str | os.PathLike[str], keys: Mapping[str, Ed25519PublicKey] | None = None,
                         min_revision: int | None = None) -> Bundle:
    """Load the bundle from one snapshot of `directory` (see `bundle_snapshot`), read once
    into memory; the bundle keeps `directory` as its name. When the snapshot is replaced
    while it is read (the kubelet deletes the old directory right after the swap), read
    the new one. With `keys` (bundle_verification), the bytes read must verify against
    their signature, and are then parsed; a revision below `min_revision` (the floor) is a
    rollback. A refusal is a BundleError on `.signatures.json`."""
    return load_verified(read_bundle_files(directory), keys, min_revision, name=directory)


def read_bundle_files(directory: str | os.PathLike[str]) -> BundleSnapshot:
    """Every file of one published snapshot of `directory`, read once (a BundleError when
    the snapshot is refused: bounds, a FIFO, a symlink out of the bundle)."""
    for _attempt in range(_SNAPSHOT_ATTEMPTS):
        resolved = bundle_snapshot(directory)
        try:
            files = read_snapshot(resolved)
        except BundleError:
            if bundle_snapshot(directory) != resolved:
                continue
            raise
        if bundle_snapshot(directory) != resolved:
            continue  # replaced while it was read: a mix of two publications is never loaded
        return files
    raise BundleError([Problem(str(directory), "the bundle directory kept being replaced while it was loaded")])


def fingerprint(directory: pathlib.Path) -> tuple[object, ...]:
    """Cheap change detection over what `load_bundle_snapshot` would read: the resolved
    snapshot, and every file's path, size and modification time under it (symlinks
    followed, each directory visited once). A timestamped directory that the kubelet is
    still writing is not under the snapshot, so it is not seen until `..data` points to it."""
    snapshot = bundle_snapshot(directory)
    entries: list[tuple[str, int, int]] = []
    visited: set[tuple[int, int]] = set()
    pending = [snapshot]
    while pending:
        current = pending.pop()
        try:
            st = os.stat(current)
            if (st.st_dev, st.st_ino) in visited:
                continue  # a symlink loop, or two links to one directory
            visited.add((st.st_dev, st.st_ino))
            names = sorted(os.listdir(current))
        except OSError:
            continue  # removed while we looked; the next look sees the new state
        for name in names:
            path = current / name
            try:
                st = os.stat(path)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                pending.append(path)
            else:
                entries.append((os.path.relpath(path, snapshot), st.st_size, st.st_mtime_ns))
    return (str(snapshot), tuple(sorted(entries)))


class BundleReloader(Activations):
    def __init__(self, holder: BundleHolder, *, poll_seconds: float = 1.0,
                 keys: Mapping[str, Ed25519PublicKey] | None = None, audit: AuditSink | None = None,
                 clock: Clock | None = None, floor: BundleFloor | None = None, retaining: bool = True,
                 settings_changes: Callable[[], tuple[str, ...]] | None = None):
        """poll_seconds = 0: no polling; reload only when triggered (SIGHUP). `keys`: a
        bundle loads only when its signature verifies with one of them, and its revision
        is not below the floor (`floor`, the store's; else the serving one's). `audit`:
        where refusals and swaps are recorded. `retaining`: whether this process started
        with a retainer of inputs (`audit.retain_input` needs one, made only at start).
        `settings_changes`: what changed in the config file since the start (notices)."""
        super().__init__(holder, keys=keys, floor=floor, audit=audit, clock=clock, retaining=retaining,
                         settings_changes=settings_changes)
        self._directory = pathlib.Path(holder.current.directory)
        self._poll = poll_seconds
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._seen = fingerprint(self._directory)
        self._thread: threading.Thread | None = None

    def reload(self) -> bool:
        """Load, validate and swap. True when a new version is serving."""
        try:
            return self._reload()
        finally:
            self._attempt_done()

    def _reload(self) -> bool:
        with self._lock:
            seen = fingerprint(self._directory)
            serving = self._holder.current
            try:
                bundle = self._admit(lambda floor: load_bundle_snapshot(self._directory, self._keys, floor), serving)
            except BundleError as exc:
                self.last_error = str(exc)
                self._refuse(exc, serving, "bundle reload", {})
                return False
            finally:
                self._seen = seen
            self.last_error = ""
            if bundle.version == serving.version:
                return False
            self._swap(bundle, serving, {"at": "reload"})
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
                self.check_floor()  # another replica may have raised the floor
                continue
            if not triggered:
                # An editor may still be writing: reload once the directory has held
                # still for one poll interval (SIGHUP reloads at once).
                self._stop.wait(self._poll)
                if fingerprint(self._directory) != current:
                    continue
            self.reload()
