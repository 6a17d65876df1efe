"""Injected clocks, so tests can freeze and move time."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the Unix epoch."""


class SystemClock:
    def now(self) -> float:
        return time.time()


class FrozenClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1_800_000_000.0):
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def set(self, when: float) -> None:
        self._now = float(when)
