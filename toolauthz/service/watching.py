"""Approval watches that wait on the event loop, and the limits on how many are open.

A runtime may wait minutes for a person, so an open WatchApproval stream is ordinary
load. Its waiting holds no thread: the watch awaits an asyncio event that the desk's
poke sets (through `LoopNotifier`, one loop wake-up per poke), or a timer. The timer
bounds each wait by `MAX_WATCH_WAIT`, so that a decision made by another worker process
(which shares the database, not the pokes) is seen within it, and by the approval's
expiry. Each look at the store is a short SQLite read on the loop's executor: a thread
is held for the read alone, never for the wait.

`WatchLimits` bounds the open watches per caller and in the whole process; a watch over
either limit is refused with ResourceExhaustedError (RESOURCE_EXHAUSTED). The caller is
the identity the transport proved (`caller_of`): every unauthenticated caller shares one
id, so on a development listener the per-caller limit is shared by all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator

from toolauthz.approvals import MAX_WATCH_WAIT, TERMINAL, ApprovalDesk
from toolauthz.display.escape import shown
from toolauthz.errors import ResourceExhaustedError
from toolauthz.store.approvals import ApprovalRecord
from toolauthz.store.ledger import CallOwner


class WatchSlot:
    """One admitted watch; `release()` gives its place back (a second call does nothing)."""

    def __init__(self, limits: WatchLimits, caller_id: str):
        self._limits = limits
        self.caller_id = caller_id
        self._released = False

    def release(self) -> None:
        self._limits._release(self)


class WatchLimits:
    """Counts the open watches of each caller and of the process (every server of one
    sidecar shares one WatchLimits). Safe from any thread."""

    def __init__(self, *, per_caller: int, total: int):
        self.per_caller = per_caller
        self.total = total
        self._open: dict[str, int] = {}
        self._open_total = 0
        self._changed = threading.Condition()

    def admit(self, caller_id: str) -> WatchSlot:
        """A slot for one more watch of `caller_id`, or ResourceExhaustedError."""
        with self._changed:
            if self._open.get(caller_id, 0) >= self.per_caller:
                raise ResourceExhaustedError(
                    f"caller `{shown(caller_id)}` has {self.per_caller} approval watches open, its limit "
                    "(approvals.max_watches_per_caller); end one before opening another")
            if self._open_total >= self.total:
                raise ResourceExhaustedError(
                    f"the sidecar has {self.total} approval watches open, its limit (approvals.max_watches); "
                    "try again later")
            self._open[caller_id] = self._open.get(caller_id, 0) + 1
            self._open_total += 1
        return WatchSlot(self, caller_id)

    def _release(self, slot: WatchSlot) -> None:
        with self._changed:
            if slot._released:  # a slot's flag is read and set under this lock alone
                return
            slot._released = True
            left = self._open[slot.caller_id] - 1
            if left:
                self._open[slot.caller_id] = left
            else:
                del self._open[slot.caller_id]  # no entry kept per caller once its watches end
            self._open_total -= 1
            self._changed.notify_all()

    def open_watches(self, caller_id: str | None = None) -> int:
        """The watches open now: of `caller_id`, or of everyone."""
        with self._changed:
            return self._open_total if caller_id is None else self._open.get(caller_id, 0)

    def wait_until_at_most(self, count: int, timeout: float) -> bool:
        """Blocks until at most `count` watches are open; False if `timeout` passed first
        (for a stop that wants its watches gone, and for tests)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._open_total <= count, timeout)


class LoopNotifier:
    """The watches waiting on one event loop, woken by the desk's pokes from any thread.

    It listens to the desk only while some watch is registered, so a server with no
    watch open costs a poke nothing. Registration happens on the loop's thread."""

    def __init__(self, desk: ApprovalDesk, loop: asyncio.AbstractEventLoop):
        self._desk = desk
        self.loop = loop
        self._waiting: dict[str, set[asyncio.Event]] = {}

    def register(self, approval_id: str) -> asyncio.Event:
        """An event set whenever `approval_id` may have changed."""
        if not self._waiting:
            self._desk.subscribe(self)
        flag = asyncio.Event()
        self._waiting.setdefault(approval_id, set()).add(flag)
        return flag

    def unregister(self, approval_id: str, flag: asyncio.Event) -> None:
        flags = self._waiting.get(approval_id)
        if flags is None:
            return
        flags.discard(flag)
        if not flags:
            del self._waiting[approval_id]
            if not self._waiting:
                self._desk.unsubscribe(self)

    def changed(self, approval_id: str | None) -> None:
        """The desk's ChangeListener: called on any thread, returns at once."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: its watches are gone
            self.loop.call_soon_threadsafe(self._wake, approval_id)

    def _wake(self, approval_id: str | None) -> None:
        if approval_id is None:
            groups = list(self._waiting.values())
        else:
            groups = [self._waiting.get(approval_id, set())]
        for flags in groups:
            for flag in flags:
                flag.set()


async def watch_records(desk: ApprovalDesk, notifier: LoopNotifier, approval_id: str,
                        owner: CallOwner | None) -> AsyncGenerator[ApprovalRecord, None]:
    """The approval as `owner` (None: anyone but its call's owner) sees it: now, then
    each time it changes, until it is decided or expires. Must run on the notifier's loop."""
    loop = asyncio.get_running_loop()
    flag = notifier.register(approval_id)
    try:
        last = None
        while True:
            # Cleared before the read: a poke landing after it sets the flag again, and
            # one landing before it was made after a commit that this read sees.
            flag.clear()
            record = await loop.run_in_executor(None, desk.get, approval_id, owner)
            if record != last:
                yield record
                last = record
            if record.status in TERMINAL:
                return
            until_expiry = max(0.0, record.expires_at - desk.clock.now())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(MAX_WATCH_WAIT, until_expiry + 0.001)):
                    await flag.wait()
    finally:
        notifier.unregister(approval_id, flag)
