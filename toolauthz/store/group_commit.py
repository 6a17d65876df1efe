"""Group commit without a thread of its own, for the stores every decision writes to.

A caller that finds no batch under way leads: it runs everything queued, its own item
included, as one batch (one transaction, one fsync). Callers arriving meanwhile queue
and sleep, each on its own lock; the leader wakes the callers it served, then promotes
the first still queued to lead the next batch. So one call in flight runs on its own
thread with no hand-off, and many in flight share transactions rather than queue on a
write lock one transaction each, which under 32 threads costs more CPU in lock convoys
and GIL hand-offs than the transactions themselves (docs/performance.md).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from toolauthz.errors import StoreUnavailable

T = TypeVar("T")
# The most items one batch (one transaction) takes.
MAX_BATCH = 256
R = TypeVar("R")


class ItemFailed(Exception):
    """A batch's result for one item that failed on its own: its caller gets `error`
    and the other items of the batch are unaffected."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class _Waiter(Generic[T, R]):
    __slots__ = ("item", "done", "lead", "wake", "result", "error")

    def __init__(self, item: T):
        self.item = item
        self.done = False  # settled: result or error is final
        self.lead = False  # promoted: this caller runs the next batch
        self.wake = threading.Lock()  # held until the caller is settled or promoted
        self.wake.acquire()
        self.result: R | None = None
        self.error: BaseException | None = None


class GroupCommit(Generic[T, R]):
    """`run_batch(items)` returns one result per item, in order: a value, or ItemFailed
    for an item that failed alone. An exception it raises fails the whole batch: every
    caller in it gets StoreUnavailable (a StoreUnavailable of its own, with the cause)."""

    def __init__(self, run_batch: Callable[[Sequence[T]], Sequence[R | ItemFailed]], *,
                 max_batch: int = MAX_BATCH, name: str = "batch"):
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._name = name
        self._queue: deque[_Waiter[T, R]] = deque()
        self._cond = threading.Condition()  # guards the state; close() waits on it
        self._running = False
        self._closed = False

    def submit(self, item: T, timeout: float | None = None) -> R:
        """Run `item` in a batch and return its result. `timeout` bounds the wait for
        other callers' batches; a leader's own batch is bounded by the store's lock
        timeout. An item given up on may still be run if a batch had already taken it."""
        waiter: _Waiter[T, R] = _Waiter(item)
        with self._cond:
            if self._closed:
                raise StoreUnavailable(f"{self._name} is closed")
            self._queue.append(waiter)
            waiter.lead = not self._running
            self._running = True
            self._cond.notify_all()  # only close() and wait_until_queued() wait on it
        if not waiter.lead and not waiter.wake.acquire(timeout=-1 if timeout is None else timeout):
            with self._cond:
                if not (waiter.done or waiter.lead):
                    if waiter in self._queue:  # no batch has taken it: none will
                        self._queue.remove(waiter)
                    raise StoreUnavailable(f"{self._name}: not done within {timeout}s")
        if waiter.lead:  # first, or promoted: run a batch, then pass the lead on
            self._lead()
        if waiter.error is not None:
            raise waiter.error
        assert waiter.done
        return waiter.result  # type: ignore[return-value]

    def submit_many(self, items: Sequence[T]) -> list[R | BaseException]:
        """Run `items` in as few batches as `max_batch` allows and return, in order, each
        one's result or the exception it failed with (instead of raising it): a caller
        that batches requests itself, like the decision pump, settles each on its own."""
        waiters: list[_Waiter[T, R]] = [_Waiter(item) for item in items]
        if not waiters:
            return []
        with self._cond:
            if self._closed:
                raise StoreUnavailable(f"{self._name} is closed")
            self._queue.extend(waiters)
            waiters[0].lead = not self._running
            self._running = True
            self._cond.notify_all()
        for waiter in waiters:
            if not waiter.lead:
                waiter.wake.acquire()  # settled by a batch, or promoted to lead the next
            if waiter.lead and not waiter.done:
                self._lead()  # it heads the queue: the batch includes it
        assert all(w.done for w in waiters)
        return [w.error if w.error is not None else w.result for w in waiters]  # type: ignore[misc]

    def wait_until_queued(self, count: int, timeout: float) -> bool:
        """True once `count` callers wait behind the running batch (for tests that need
        a known batch composition without sleeping)."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self._queue) >= count, timeout)

    def close(self) -> None:
        """Refuse new items; return once everything queued has run."""
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: not self._running)

    def _lead(self) -> None:
        with self._cond:
            batch = [self._queue.popleft() for _ in range(min(len(self._queue), self._max_batch))]
        try:
            self._settle(batch)
        finally:
            for waiter in batch:
                if not waiter.lead:
                    waiter.wake.release()
            with self._cond:
                if self._queue:
                    successor = self._queue[0]
                    successor.lead = True
                    successor.wake.release()
                else:
                    self._running = False
                    self._cond.notify_all()

    def _settle(self, batch: list[_Waiter[T, R]]) -> None:
        try:
            results = list(self._run_batch([w.item for w in batch]))
            if len(results) != len(batch):
                raise StoreUnavailable(f"{self._name} returned {len(results)} results for {len(batch)} items")
        except BaseException as exc:
            for waiter in batch:
                waiter.error, waiter.done = StoreUnavailable.caused_by(exc), True
            if not isinstance(exc, Exception):
                raise
            return
        for waiter, result in zip(batch, results, strict=True):
            if isinstance(result, ItemFailed):
                waiter.error = result.error
            else:
                waiter.result = result
            waiter.done = True
