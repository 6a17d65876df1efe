"""Adaptive throttling of new decisions in the client (Site Reliability Engineering,
"Handling Overload": client-side throttling).

Why in the client: a sidecar refuses an excess call (RESOURCE_EXHAUSTED) in its Python gRPC
process, and that refusal costs about what a no-op RPC costs, a fifth to a half of a
decision (`python -m bench.overload`). Offered 2.5 times what it can decide, a sidecar
spends a third of its core refusing. A client that refuses part of its own calls while
the sidecar is refusing them keeps that work off the sidecar.

How: over the last `window` seconds, `requests` (every call the application asked for,
those refused here included) and `accepts` (calls the sidecar answered with anything but
an overload). A new call is refused here, with probability

    p = max(0, (requests - multiplier * accepts) / (requests + 1))

so that about `multiplier` times what the sidecar accepts still reaches it: when it
recovers, those calls see it, accepts rise and p falls to 0. While the window holds
fewer than `min_requests`, nothing is refused here: a client that sends a few calls a
second cannot overload anyone, and one refusal must not shut it out.

Only the calls that start a decision are throttled (Authorize, AuthorizeBatch): a Verify
or ReportOutcome completes a decision already made, and refusing it would waste that.
A call refused here fails closed, as one the sidecar refused: `Throttled`, a
`grpc.RpcError` with RESOURCE_EXHAUSTED, safe to retry later, no token.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

__all__ = ["ThrottlePolicy", "AdaptiveThrottle", "Throttled", "DEFAULT_THROTTLE", "OVERLOAD_CODES", "THROTTLED"]

THROTTLED = frozenset({"Authorize", "AuthorizeBatch"})
# The answers that say "the sidecar did not decide this in time": its shedding, or a call
# that waited past its deadline. Every other answer, a DENY or INVALID_ARGUMENT included, is
# an accept: the sidecar did the work. UNAVAILABLE is one too: a sidecar that is down is
# not overloaded, and its callers should see UNAVAILABLE, not a throttle, when it is back.
OVERLOAD_CODES = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED})
_BUCKETS = 10


@dataclass(frozen=True)
class ThrottlePolicy:
    multiplier: float = 1.1  # calls let through per call the sidecar accepts, while it refuses
    window: float = 10.0  # seconds of history
    min_requests: int = 20  # below this many requests in the window, nothing is refused here

    def __post_init__(self) -> None:
        if not (math.isfinite(self.multiplier) and self.multiplier >= 1.0):
            raise ValueError("multiplier must be a finite number >= 1")
        if not (math.isfinite(self.window) and 0 < self.window <= 3600):
            raise ValueError("window must be between 0 and 3600 seconds")
        if self.min_requests < 0:
            raise ValueError("min_requests must be >= 0")


class Throttled(grpc.RpcError):
    """A call this client refused itself while the sidecar was refusing calls."""

    def __init__(self, requests: int, accepts: int):
        super().__init__()
        self._details = (f"throttled by the client: the sidecar accepted {accepts} of the last {requests} calls "
                         "(adaptive throttling); retry later")

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.RESOURCE_EXHAUSTED

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> tuple:
        return ()

    def trailing_metadata(self) -> tuple:
        return ()

    def __str__(self) -> str:
        return f"RESOURCE_EXHAUSTED: {self._details}"


class AdaptiveThrottle:
    """The request and accept counts of one client, in `_BUCKETS` buckets over the window.
    Thread-safe: a sync client is shared by threads, an async one by tasks."""

    def __init__(self, policy: ThrottlePolicy | None = None, *, clock: Callable[[], float] = time.monotonic,
                 rand: Callable[[], float] = random.random):
        self.policy = policy or ThrottlePolicy()
        self._clock, self._rand = clock, rand
        self._width = self.policy.window / _BUCKETS
        self._requests = [0] * _BUCKETS
        self._accepts = [0] * _BUCKETS
        self._epoch = math.floor(clock() / self._width)  # the newest bucket's number
        self._lock = threading.Lock()

    def _advance(self) -> int:
        """Empties the buckets that fell out of the window; the newest one's index."""
        now = math.floor(self._clock() / self._width)
        for epoch in range(self._epoch + 1, min(now, self._epoch + _BUCKETS) + 1):
            self._requests[epoch % _BUCKETS] = self._accepts[epoch % _BUCKETS] = 0
        if now - self._epoch >= _BUCKETS:
            self._requests, self._accepts = [0] * _BUCKETS, [0] * _BUCKETS
        self._epoch = max(self._epoch, now)
        return self._epoch % _BUCKETS

    def _probability(self, requests: int, accepts: int) -> float:
        if requests < self.policy.min_requests:
            return 0.0
        return max(0.0, (requests - self.policy.multiplier * accepts) / (requests + 1))

    def rejection_probability(self) -> float:
        """The probability that the next call is refused here."""
        with self._lock:
            self._advance()
            return self._probability(sum(self._requests), sum(self._accepts))

    def admit(self) -> None:
        """Counts a call the application asked for; `Throttled` if it is refused here."""
        with self._lock:
            newest = self._advance()
            requests, accepts = sum(self._requests), sum(self._accepts)
            self._requests[newest] += 1
        if self._rand() < self._probability(requests, accepts):
            raise Throttled(requests, accepts)

    def answered(self, code: grpc.StatusCode | None) -> None:
        """Counts the sidecar's answer to an admitted call (None: a response)."""
        if code in OVERLOAD_CODES:
            return
        with self._lock:
            self._accepts[self._advance()] += 1


DEFAULT_THROTTLE = ThrottlePolicy()
