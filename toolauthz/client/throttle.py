"""Adaptive throttling of new decisions in the client.

Why in the client: a sidecar refuses an excess call (RESOURCE_EXHAUSTED) in its Python gRPC
process, and that refusal costs about what a no-op RPC costs, a fifth to a half of a
decision (`python -m bench.overload`). Offered 2.5 times what it can decide, a sidecar
spends a third of its core refusing. A client that refuses part of its own calls while
the sidecar is refusing them keeps that work off the sidecar.

How: the client refuses a new call itself with a probability `p`. Its signals are the
sidecar's refusals and its congestion marks: a successful answer with the trailing
metadata `toolauthz-congested: 1`, which the sidecar puts on a share of its answers while
its decision queue is long (from none at a tenth of the queue's bound to all at the
bound), so that clients slow down before it has to refuse. On a signal about a call the
client sent while refusing `s` of its calls, the share it lets through becomes a fraction
of what it was then, `p = 1 - (1 - s) * backoff`, unless `p` is already higher: `backoff`
is 0.8 for a mark and 0.5 for a refusal, which says the queue is at its bound (TCP backs
off less on an ECN mark than on a loss for the same reason, RFC 8511). All
the answers to the calls sent at one setting describe the queue before the client
reacted, so together they lower the share once, not once each (TCP reduces its window
once per round trip for the same reason; counted once each, the marks of a long queue
shut a client out for seconds and the sidecar idles). Every other answer lowers `p` by
`recovery`, and `p` halves every `half_life` seconds whatever happens, so a client that
sends little is never shut out for long and one that the sidecar answers again is back
to sending everything within seconds. (The adaptive throttling of Google's SRE book,
`p = (requests - K * accepts) / (requests + 1)`, needs refusals to steer by, each of which
costs the sidecar what an empty RPC costs, and lets calls through again only K-fold per
window once the sidecar recovers.) While
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

__all__ = ["ThrottlePolicy", "AdaptiveThrottle", "Throttled", "DEFAULT_THROTTLE", "OVERLOAD_CODES", "THROTTLED",
           "CONGESTED", "congested", "marked"]

THROTTLED = frozenset({"Authorize", "AuthorizeBatch"})
# The sidecar's shedding. Every other answer, a DENY or INVALID_ARGUMENT included, is an
# accept: the sidecar did the work. So is UNAVAILABLE (a sidecar that is down is not
# overloaded, and its callers should see UNAVAILABLE, not a throttle) and DEADLINE_EXCEEDED
# (a sidecar that cannot decide in time sheds the call itself; a deadline that passed may
# be the caller's own, too short).
OVERLOAD_CODES = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED})
CONGESTED = "toolauthz-congested"  # the trailing metadata of a marked answer, value "1"
_BUCKETS = 10
_MOST = 0.999  # never refuse every call: the calls let through see the sidecar recover


def congested(trailing_metadata) -> bool:
    """Whether an answer's trailing metadata carries the sidecar's congestion mark."""
    return any(key == CONGESTED and value == "1" for key, value in trailing_metadata or ())


def marked(call) -> bool:
    """Whether a finished sync call's answer was marked; metadata that cannot be read is
    no mark (the answer and its token stand)."""
    try:
        return congested(call.trailing_metadata())
    except Exception:  # noqa: BLE001 - a mark is advice, never a reason to lose an answer
        return False


@dataclass(frozen=True)
class ThrottlePolicy:
    mark_backoff: float = 0.8  # on a mark, the share let through becomes this times what it was
    refusal_backoff: float = 0.5  # ... on a refusal
    recovery: float = 0.01  # how far each other answer lowers the probability
    window: float = 10.0  # seconds over which calls are counted (min_requests)
    min_requests: int = 20  # below this many requests in the window, nothing is refused here
    half_life: float = 5.0  # seconds in which the probability halves by itself

    def __post_init__(self) -> None:
        for name in ("mark_backoff", "refusal_backoff"):
            if not (math.isfinite(getattr(self, name)) and 0 < getattr(self, name) < 1):
                raise ValueError(f"{name} must be above 0 and below 1")
        if not (math.isfinite(self.recovery) and 0 < self.recovery <= 1):
            raise ValueError("recovery must be above 0 and at most 1")
        if not (math.isfinite(self.window) and 0 < self.window <= 3600):
            raise ValueError("window must be between 0 and 3600 seconds")
        if self.min_requests < 0:
            raise ValueError("min_requests must be >= 0")
        if not (math.isfinite(self.half_life) and 0 < self.half_life <= 3600):
            raise ValueError("half_life must be between 0 and 3600 seconds")


class Throttled(grpc.RpcError):
    """A call this client refused itself while the sidecar was refusing calls."""

    def __init__(self, refused: int, answered: int, window: float):
        super().__init__()
        self._details = (f"throttled by the client: the sidecar refused or marked congested {refused} of the "
                         f"{answered} calls it answered in the last {window:g} s (adaptive throttling); retry later")

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
        self._refused = [0] * _BUCKETS  # ... that the sidecar refused or marked congested
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

    def admit(self) -> float:
        """Counts a call the application asked for; `Throttled` if it is refused here, else
        the probability it passed (its `sent_at` for `answered`)."""
        with self._lock:
            newest = self._advance()
            p = self._probability()  # taken before this call counts
            self._requests[newest] += 1
            refused, answered = sum(self._refused), sum(self._answered)
        if self._rand() < p:
            raise Throttled(refused, answered, self.policy.window)
        return p

    @contextmanager
    def counted(self) -> Iterator[Answer]:
        """One call through the throttle: `admit()`, then its answer counted as the block
        ends (a response, marked congested if the block sets `congested` on what it is
        given; its status; or none: a call that ended without the sidecar's answer, a
        closed channel or a cancelled caller, is no overload)."""
        answer = Answer(self.admit())
        try:
            yield answer
        except grpc.RpcError as exc:
            self.answered(exc.code(), sent_at=answer.sent_at)
            raise
        except BaseException:
            self.answered(grpc.StatusCode.UNKNOWN, sent_at=answer.sent_at)
            raise
        self.answered(None, congested=answer.congested, sent_at=answer.sent_at)

    def answered(self, code: grpc.StatusCode | None, *, congested: bool = False, sent_at: float | None = None) -> None:
        """Counts the sidecar's answer to an admitted call: None for a response, which
        `congested` says was marked; `sent_at`, what `admit()` returned for it (None: now)."""
        if sent_at is not None and not 0 <= sent_at <= 1:  # a NaN would stick in p and end throttling
            raise ValueError("sent_at must be between 0 and 1")
        policy = self.policy
        with self._lock:
            newest = self._advance()
            self._answered[newest] += 1
            if code in OVERLOAD_CODES or (code is None and congested):
                self._refused[newest] += 1
                sent = self._p if sent_at is None else sent_at
                backoff = policy.mark_backoff if code is None else policy.refusal_backoff
                self._p = min(_MOST, max(self._p, 1 - (1 - sent) * backoff))
            else:
                self._p = max(0.0, self._p - policy.recovery)


@dataclass
class Answer:
    """What `counted()` knows of its call: the probability it passed, and whether the
    sidecar's response was marked congested (set by the caller, from its trailing metadata)."""

    sent_at: float
    congested: bool = False


DEFAULT_THROTTLE = ThrottlePolicy()
