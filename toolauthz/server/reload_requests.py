"""SIGHUP as a request to reload the bundle, from the first moment of `toolauthz serve`.

Standard library only: the console script (toolauthz/cli/entry.py) installs it before it
imports anything heavy (grpc, cedarpy, the bundle loader take most of a second to load,
and a SIGHUP in that second would end the process with status 129).
"""

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
        self._installed = False
        self._reload: Callable[[], None] | None = None
        self._previous: Callable[[int, FrameType | None], object] | int | None = None

    def install(self) -> ReloadRequests:
        """Handle SIGHUP from now on; a second call does nothing."""
        if self._installed:
            return self
        self._installed = True
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
        self.uninstall()

    def uninstall(self) -> None:
        """SIGHUP's handling as it was before `install`."""
        if self._installed:
            self._installed = False
            signal.signal(signal.SIGHUP, self._previous if self._previous is not None else signal.SIG_DFL)

    def give_up(self) -> None:
        """For a command that is not `serve` after all: SIGHUP as it was, and one that
        arrived meanwhile acts now as it would have then (by default, ends the process)."""
        self.uninstall()
        if self._asked:
            self._asked = False
            signal.raise_signal(signal.SIGHUP)


_EARLY: ReloadRequests | None = None


def install_early() -> ReloadRequests:
    """Called first thing by the console script, before the heavy imports: SIGHUP is
    deferred from then on (see `reload_requests`)."""
    global _EARLY
    if _EARLY is None:
        _EARLY = ReloadRequests().install()
    return _EARLY


def reload_requests() -> ReloadRequests:
    """The ReloadRequests the console script installed, taken (once), else a new one:
    `toolauthz serve` enters it before anything else it does."""
    global _EARLY
    taken, _EARLY = _EARLY, None
    return taken if taken is not None else ReloadRequests()


def release_early() -> None:
    """The command is not `serve`: the early deferral is given up."""
    global _EARLY
    if _EARLY is not None:
        early, _EARLY = _EARLY, None
        early.give_up()
