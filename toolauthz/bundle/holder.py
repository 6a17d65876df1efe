"""The bundle a process serves now, swapped whole by a reload."""

from __future__ import annotations

import threading

from toolauthz.bundle.loader import Bundle
from toolauthz.errors import PreconditionError

BELOW_FLOOR = "bundle_below_floor"


class BundleHolder:
    """The current bundle. A reload swaps the reference; a request reads it once, so it
    finishes on the version it started with.

    A bundle held back (`hold_back`: another process of the fleet activated a newer
    revision, and this one has none to load) still answers what reads it (status, display
    hints), but decides nothing: `deciding` refuses until a bundle at the floor is swapped
    in or the floor comes back down."""

    def __init__(self, bundle: Bundle):
        self._bundle = bundle
        self._held_back = ""
        self._lock = threading.Lock()

    @property
    def current(self) -> Bundle:
        return self._bundle

    @property
    def deciding(self) -> Bundle:
        """The bundle to decide on, or PreconditionError (`bundle_below_floor`) when it is held back."""
        reason = self._held_back
        if reason:
            raise PreconditionError(reason, BELOW_FLOOR)
        return self._bundle

    @property
    def held_back(self) -> str:
        return self._held_back

    def hold_back(self, reason: str) -> None:
        self._held_back = reason

    def release(self) -> None:
        self._held_back = ""

    def swap(self, bundle: Bundle) -> None:
        with self._lock:
            self._bundle = bundle
            self._held_back = ""
