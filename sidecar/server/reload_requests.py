"""SIGHUP as a request to reload the bundle, honoured at any moment of startup."""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType, TracebackType


class ReloadRequests:
    """SIGHUP as a request to reload the bundle, from the moment this is entered: one
    that arrives before a reloader is attached (`route_to`) is kept and passed on then,
    so a SIGHUP at any moment of startup neither kills the process nor is lost."""

    def __init__(self) -> None:
        self._asked = False
        self._reload: Callable[[], None] | None = None
        self._previous: Callable[[int, FrameType | None], object] | int | None = None

    def install(self) -> ReloadRequests:
        self._previous = signal.signal(signal.SIGHUP, self._on_hup)
        # A supervisor may start the sidecar with SIGHUP blocked: what it holds back
        # arrives now, when it is handled.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
        return self

    def route_to(self, reload: Callable[[], None]) -> None:
        self._reload = reload
        if self._asked:
            self._asked = False
            reload()

    def _on_hup(self, _signum: int, _frame: FrameType | None) -> None:
        if self._reload is None:
            self._asked = True
        else:
            self._reload()

    def __enter__(self) -> ReloadRequests:
        return self.install()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        signal.signal(signal.SIGHUP, self._previous if self._previous is not None else signal.SIG_DFL)
