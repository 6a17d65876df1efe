"""The bundle a process serves now, swapped whole by a reload."""

from __future__ import annotations

import threading

from toolauthz.bundle.loader import Bundle


class BundleHolder:
    """The current bundle. A reload swaps the reference; a request reads it once, so it
    finishes on the version it started with."""

    def __init__(self, bundle: Bundle):
        self._bundle = bundle
        self._lock = threading.Lock()

    @property
    def current(self) -> Bundle:
        return self._bundle

    def swap(self, bundle: Bundle) -> None:
        with self._lock:
            self._bundle = bundle
