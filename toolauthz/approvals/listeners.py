"""Who hears that an approval changed: how watches wait without a thread each."""

from __future__ import annotations

import threading
from typing import Protocol


class ChangeListener(Protocol):
    """Hears that an approval changed."""

    def changed(self, approval_id: str | None) -> None:
        """Called on the thread that made the change, after it is committed; must return
        at once (hand the news to wherever the watches wait). None: any approval may
        have changed."""


class Listeners:
    """The listeners of one desk. Subscribing replaces the tuple whole, so telling them
    reads it without the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: tuple[ChangeListener, ...] = ()

    def subscribe(self, listener: ChangeListener) -> None:
        with self._lock:
            self._listeners = (*self._listeners, listener)

    def unsubscribe(self, listener: ChangeListener) -> None:
        with self._lock:
            self._listeners = tuple(kept for kept in self._listeners if kept is not listener)

    def tell(self, approval_id: str | None) -> None:
        for listener in self._listeners:
            listener.changed(approval_id)
