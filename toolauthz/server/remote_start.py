"""The bundle a sidecar with a bundle server starts on, and the last good archive kept for
the next start.

Each archive the sidecar activates is written to `<data_dir>/bundle-server.tar.gz`
(mode 0600, replaced atomically). At start the sidecar fetches from the server; the
cached archive, verified again like any other, serves instead when the server is
unreachable or serves something the sidecar would refuse (a bad archive, or a revision
below the cached one, or other content under it). Without a cached archive, no
verified bundle from the server refuses the start. The cache is a convenience for
restarts during an outage, not a trust anchor: it is verified against the configured
keys each time, and whoever can write the data directory holds the token keys anyway.

The bundle chosen here is then held to the store's revision floor like any other start
(build.py, activation.py): one below the floor another replica raised refuses the start,
with the start's one `bundle` audit record saying why.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from toolauthz.bundle import Bundle
from toolauthz.bundle.archive import ArchiveLimits
from toolauthz.bundle.remote import BundleFetcher, BundleFetchError, Fetched
from toolauthz.errors import BundleError, Problem
from toolauthz.files.bounded import FileRefused, read_bounded
from toolauthz.server.remote_reload import load_from_archive, save_archive, successor

log = logging.getLogger("toolauthz.reload")

CACHE_FILE = "bundle-server.tar.gz"


@dataclass(frozen=True)
class RemoteStart:
    bundle: Bundle
    fetcher: BundleFetcher
    # The archive the poller compares the next one with (its SHA-256) and the ETag.
    fetched: Fetched
    # Why the cached bundle serves instead of the server's ("" when the server's does).
    problem: str = ""
    unreachable: bool = False

    def keep(self, cache: pathlib.Path) -> None:
        """Keep the server's archive for the next start, once it activated (the kept
        one, when it serves, is kept already)."""
        if not self.problem and self.fetched.body is not None:
            save_archive(cache, self.fetched.body)


def first_bundle(fetcher: BundleFetcher, keys: Mapping[str, Ed25519PublicKey], limits: ArchiveLimits,
                 cache: pathlib.Path) -> RemoteStart:
    """The bundle to start on, or BundleError when there is none that verifies."""
    cached = _cached(cache, keys, limits)
    try:
        fetched = fetcher.fetch()
    except BundleFetchError as exc:
        if cached is None:
            raise BundleError([Problem(fetcher.url, f"cannot fetch the bundle: {exc}")]) from None
        problem = f"bundle server: {exc}; serving the cached revision {cached[0].revision}"
        log.error("%s", problem)
        return RemoteStart(cached[0], fetcher, Fetched(cached[1], ""), problem, unreachable=True)
    if fetched.body is None:  # not expected: no ETag was sent, and a 304 to none is an error
        raise BundleError([Problem(fetcher.url, "cannot fetch the bundle: the server sent no archive")])
    try:
        bundle = successor(fetched.body, cached[0] if cached is not None else None, keys, limits, fetcher.url)
    except BundleError as exc:
        if cached is None:
            raise
        problem = f"bundle server archive refused: {exc}; serving the cached revision {cached[0].revision}"
        log.error("%s", problem)
        return RemoteStart(cached[0], fetcher, fetched, problem)
    return RemoteStart(bundle, fetcher, fetched)  # kept (`keep`) once it is activated


def _cached(cache: pathlib.Path, keys: Mapping[str, Ed25519PublicKey],
            limits: ArchiveLimits) -> tuple[Bundle, bytes] | None:
    try:
        data = read_bounded(str(cache), limits.max_compressed_bytes)
        return load_from_archive(data, keys, None, limits, str(cache)), data
    except FileNotFoundError:
        return None
    except (OSError, FileRefused, BundleError) as exc:
        log.warning("the cached bundle archive `%s` is not used: %s", cache, exc)
        return None
