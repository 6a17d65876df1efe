"""Per-call timelines for the bench (`python -m bench.targets --timeline`): off unless a
bench turns them on, and then the times an Authorize call reached each step on its way
through this process, to find what the slowest calls wait for.

Off (the default), every hook costs one module attribute read: no object, no clock
read. On (`enable`), the handler starts a call's timeline (`begin`, keyed by its call
id); it travels with the call's coroutine (a context variable) to the decision pump,
which marks the call's steps, and those of the batch it runs in: a batch's steps (taken,
planned, store write) are marked for each of its calls through `in_batch`, on the thread
that runs the batch. Times are `time.perf_counter_ns()`, CLOCK_MONOTONIC on Linux: the
same clock in every process of the machine, so a bench client's send and receive times
line up with the server's marks.

The steps, in order (a call marks those it passes):

    received   the handler started (the request was read and parsed by gRPC)
    queued     handed to the decision pump (or staged on the loop for the inline path)
    taken      a batch took it (`inline`: decided on the event loop instead)
    planned    the batch's plans are made (validation, the decision's inputs)
    store      the ledger write began (Cedar and the token are done by then)
    stored     the ledger write, its commit (fsync) included, returned
    answered   the answer was handed to the event loop
    resumed    the handler had its answer back on the loop
    returned   the handler returned the response to gRPC
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

STEPS = ("received", "queued", "taken", "inline", "planned", "store", "stored", "answered", "resumed", "returned")


class CallTimeline:
    """One call's marks: (step, perf_counter_ns), in the order they were made."""

    __slots__ = ("key", "marks")

    def __init__(self, key: str):
        self.key = key
        self.marks: list[tuple[str, int]] = []

    def mark(self, step: str) -> None:
        self.marks.append((step, time.perf_counter_ns()))  # list.append: atomic under the GIL


class _State:
    # The timelines recorded since the last `drain`, None when off. Bounded: a bench
    # that forgets to drain does not grow the process without limit.
    recorded: list[CallTimeline] | None = None
    limit = 0


_current: contextvars.ContextVar[CallTimeline | None] = contextvars.ContextVar("toolauthz_timeline", default=None)
_batch = threading.local()  # .timelines: the running batch's calls, on the thread that runs it


def enable(limit: int = 200_000) -> None:
    """Record timelines from now on (at most `limit` between drains)."""
    _State.limit = limit
    _State.recorded = []


def disable() -> None:
    _State.recorded = None


def enabled() -> bool:
    return _State.recorded is not None


def drain() -> list[dict[str, Any]]:
    """The timelines recorded so far, as plain data ({"key", "marks"}), forgotten here."""
    recorded = _State.recorded
    if recorded is None:
        return []
    _State.recorded = []
    return [{"key": t.key, "marks": list(t.marks)} for t in recorded]


def begin(key: str, started_ns: int | None = None) -> CallTimeline | None:
    """A call's timeline, current in the calling coroutine's context; None when off.
    `started_ns`: when the call was received, if earlier than now."""
    recorded = _State.recorded
    if recorded is None or len(recorded) >= _State.limit:
        return None
    timeline = CallTimeline(key)
    timeline.marks.append(("received", started_ns if started_ns is not None else time.perf_counter_ns()))
    recorded.append(timeline)
    _current.set(timeline)
    return timeline


def reached(step: str) -> CallTimeline | None:
    """Marks `step` on the timeline of the call whose coroutine runs now, and returns
    that timeline (None when off or not begun)."""
    if _State.recorded is None:
        return None
    timeline = _current.get()
    if timeline is not None:
        timeline.mark(step)
    return timeline


def mark(timeline: CallTimeline | None, step: str) -> None:
    if timeline is not None:
        timeline.mark(step)


def mark_all(timelines: Iterable[CallTimeline | None], step: str) -> None:
    """The same step for each call of a batch, at one time (nothing when off)."""
    if _State.recorded is None:
        return
    now = time.perf_counter_ns()
    for timeline in timelines:
        if timeline is not None:
            timeline.marks.append((step, now))


def in_batch(timelines: Iterable[CallTimeline | None], taken: str = "taken") -> AbstractContextManager[None]:
    """While a batch runs on this thread: `batch_mark` marks each of its calls; marks
    `taken` (or `inline`) on entry and `answered` when the batch's answers are made. Off,
    a shared no-op context (the generator of timelines is never run)."""
    if _State.recorded is None:
        return _NOTHING
    return _in_batch([t for t in timelines if t is not None], taken)


_NOTHING = nullcontext()


@contextmanager
def _in_batch(timelines: list[CallTimeline], taken: str) -> Iterator[None]:
    _batch.timelines = timelines
    mark_all(timelines, taken)
    try:
        yield
        mark_all(timelines, "answered")
    finally:
        _batch.timelines = ()


def batch_mark(step: str) -> None:
    """A step of the batch that runs on this thread (the store write), for each of its
    calls; nothing when timelines are off."""
    if _State.recorded is None:
        return
    mark_all(getattr(_batch, "timelines", ()), step)
