"""Adaptive throttling of new decisions in the client.

Why in the client: a sidecar refuses an excess call (RESOURCE_EXHAUSTED) in its Python gRPC
process, and that refusal costs about what a no-op RPC costs, a fifth to a half of a
decision (`python -m bench.overload`). Offered 2.5 times what it can decide, a sidecar
spends a third of its core refusing. A client that refuses part of its own calls while
the sidecar is refusing them keeps that work off the sidecar.

How: the client refuses a new call itself with a probability `p` that it steers so that
the sidecar refuses about `1 - 1/multiplier` of the calls the client still sends (1 in 11
at 1.1): about `multiplier` times what the sidecar accepts reaches it. Each refusal by the
sidecar raises `p` by `step * (1 - target)`, each other answer lowers it by
`step * target`, and `p` halves every `half_life` seconds whatever happens, so a client
that sends little is never shut out for long. When the sidecar recovers, its accepts and
the decay bring `p` to 0 within seconds. (The adaptive throttling of Google's SRE book,
`p = (requests - K * accepts) / (requests + 1)`, reaches the same balance, but there a call
refused here counts as a request, so with K near 1 the calls let through grow only K-fold
per window once the sidecar recovers: minutes of refusing calls it would accept.) While
fewer than `min_requests` calls were asked of the client in the last `window` seconds,
nothing is refused here: a client that sends a few calls a second cannot overload anyone.

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import grpc

__all__ = ["ThrottlePolicy", "AdaptiveThrottle", "Throttled", "DEFAULT_THROTTLE", "OVERLOAD_CODES", "THROTTLED"]

THROTTLED = frozenset({"Authorize", "AuthorizeBatch"})
# The sidecar's shedding. Every other answer, a DENY or INVALID_ARGUMENT included, is an
# accept: the sidecar did the work. So is UNAVAILABLE (a sidecar that is down is not
# overloaded, and its callers should see UNAVAILABLE, not a throttle) and DEADLINE_EXCEEDED
# (a sidecar that cannot decide in time sheds the call itself; a deadline that passed may
# be the caller's own, too short).
OVERLOAD_CODES = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED})
_BUCKETS = 10
_MOST = 0.999  # never refuse every call: the calls let through see the sidecar recover


@dataclass(frozen=True)
class ThrottlePolicy:
    multiplier: float = 1.1  # calls let through per call the sidecar accepts, while it refuses
    window: float = 10.0  # seconds over which calls are counted (min_requests)
    min_requests: int = 20  # below this many requests in the window, nothing is refused here
    step: float = 0.05  # how far one answer moves the probability
    half_life: float = 5.0  # seconds in which the probability halves by itself

    def __post_init__(self) -> None:
        if not (math.isfinite(self.multiplier) and self.multiplier >= 1.0):
            raise ValueError("multiplier must be a finite number >= 1")
        if not (math.isfinite(self.window) and 0 < self.window <= 3600):
            raise ValueError("window must be between 0 and 3600 seconds")
        if self.min_requests < 0:
            raise ValueError("min_requests must be >= 0")
        if not (math.isfinite(self.step) and 0 < self.step <= 1):
            raise ValueError("step must be above 0 and at most 1")
        if not (math.isfinite(self.half_life) and 0 < self.half_life <= 3600):
            raise ValueError("half_life must be between 0 and 3600 seconds")

    @property
    def target(self) -> float:
        """The share of the calls it sends that the client lets the sidecar refuse."""
        return 1 - 1 / self.multiplier


class Throttled(grpc.RpcError):
    """A call this client refused itself while the sidecar was refusing calls."""

    def __init__(self, refused: int, answered: int, window: float):
        super().__init__()
        self._details = (f"throttled by the client: the sidecar refused {refused} of the {answered} calls it answered "
                         f"in the last {window:g} s (adaptive throttling); retry later")

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
    """One client's refusal probability, and its calls counted in `_BUCKETS` buckets over
    the window. Thread-safe: a sync client is shared by threads, an async one by tasks."""

    def __init__(self, policy: ThrottlePolicy | None = None, *, clock: Callable[[], float] = time.monotonic,
                 rand: Callable[[], float] = random.random):
        self.policy = policy or ThrottlePolicy()
        self._clock, self._rand = clock, rand
        self._width = self.policy.window / _BUCKETS
        self._requests = [0] * _BUCKETS  # calls asked of the client, refused here or not
        self._refused = [0] * _BUCKETS  # ... that the sidecar refused
        self._answered = [0] * _BUCKETS  # ... that the sidecar answered
        now = clock()
        self._epoch = math.floor(now / self._width)  # the newest bucket's number
        self._p, self._at = 0.0, now
        self._lock = threading.Lock()

    def _advance(self) -> int:
        """Lets the probability decay to now and empties the buckets that fell out of the
        window; the newest bucket's index."""
        now = self._clock()
        if now > self._at:
            self._p *= 0.5 ** ((now - self._at) / self.policy.half_life)
            self._at = now
        epoch = math.floor(now / self._width)
        if epoch - self._epoch >= _BUCKETS:
            self._requests, self._refused, self._answered = [0] * _BUCKETS, [0] * _BUCKETS, [0] * _BUCKETS
        else:
            for gone in range(self._epoch + 1, epoch + 1):
                self._requests[gone % _BUCKETS] = self._refused[gone % _BUCKETS] = self._answered[gone % _BUCKETS] = 0
        self._epoch = max(self._epoch, epoch)
        return self._epoch % _BUCKETS

    def _probability(self) -> float:
        return self._p if sum(self._requests) >= self.policy.min_requests else 0.0

    def rejection_probability(self) -> float:
        """The probability that the next call is refused here."""
        with self._lock:
            self._advance()
            return self._probability()

    def admit(self) -> None:
        """Counts a call the application asked for; `Throttled` if it is refused here."""
        with self._lock:
            newest = self._advance()
            p = self._probability()  # taken before this call counts
            self._requests[newest] += 1
            refused, answered = sum(self._refused), sum(self._answered)
        if self._rand() < p:
            raise Throttled(refused, answered, self.policy.window)

    @contextmanager
    def counted(self) -> Iterator[None]:
        """One call through the throttle: `admit()`, then its answer counted as the block
        ends (a response, its status, or none: a call that ended without the sidecar's
        answer, a closed channel or a cancelled caller, is no overload)."""
        self.admit()
        try:
            yield
        except grpc.RpcError as exc:
            self.answered(exc.code())
            raise
        except BaseException:
            self.answered(grpc.StatusCode.UNKNOWN)
            raise
        self.answered(None)

    def answered(self, code: grpc.StatusCode | None) -> None:
        """Counts the sidecar's answer to an admitted call (None: a response)."""
        policy = self.policy
        with self._lock:
            newest = self._advance()
            self._answered[newest] += 1
            if code in OVERLOAD_CODES:
                self._refused[newest] += 1
                self._p = min(_MOST, self._p + policy.step * (1 - policy.target))
            else:
                self._p = max(0.0, self._p - policy.step * policy.target)


DEFAULT_THROTTLE = ThrottlePolicy()
