"""Callers the gate turns away, audited in aggregate: one record per caller, RPC and minute.

A refusal of the gate (toolauthz/service/access.py: `caller_unknown`, `role_not_permitted`,
`tenant_not_permitted`) is about a caller that has not shown it may act, so what its
request says (tenant, principal, call) is not recorded: a stranger could otherwise fill
any tenant's trail, one permanent record per RPC. The rule:

* Refusals are counted per (caller, RPC, reason) and minute of the sidecar's clock (UTC,
  `WINDOW_SECONDS`). The first of a minute is written at once, `count: 1`. The others of
  that minute are written as one record, with their number as `count`, once the minute
  has ended: at the next refusal of anyone, at the flusher's next tick (`FLUSH_SECONDS`),
  or when the sidecar closes (drain and shutdown), whichever comes first. A minute thus
  leaves one record per caller, RPC and reason, or two when it was refused more than once;
  the counts of its records add up to its refusals, exactly.
* The record goes to the tenant the caller is bound to: the one tenant of its entry in
  `callers`. A caller with several tenants, every tenant (`*`), or none (not configured,
  unauthenticated) is recorded in the system stream, `SYSTEM_STREAM`, a tenant value no
  tenant can take (a tenant name starts with a letter or digit). Never in the tenant the
  request names.
* Calls the decision pump sheds under overload (`shed_recorder`) are refused before any
  work, the caller's check included: they are counted with no caller, in the system
  stream, and written as one record per minute once it has ended (`counted`: the pump's
  thread and the event loop never wait for an audit commit).
* At most `MAX_TALLIES` (caller, RPC, reason) tallies are open; past that, a new caller's
  refusals are counted in one tally per RPC and reason with no caller (`""`, detail
  `"overflow": true`), in the system stream, so a flood of distinct caller ids costs
  bounded memory and a bounded number of records.

The record: kind as the RPC's call step (`authorize`, `verify`, `outcome`, `approval`),
result `refused`, the reason as its error code, the caller, and detail `{"rpc", "count",
"minute"}` (`minute`: the window's start, in Unix seconds).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from toolauthz.audit.records import SYSTEM_TENANT, AuditEvent
from toolauthz.audit.sink import AuditSink
from toolauthz.clock import Clock
from toolauthz.service.callers import Caller
from toolauthz.service.roles import ALL_TENANTS, RolePolicy

SYSTEM_STREAM = SYSTEM_TENANT  # the sidecar's own tenant (audit/records.py), which no tenant name matches
WINDOW_SECONDS = 60.0
FLUSH_SECONDS = 5.0
MAX_TALLIES = 4096
_MAX_SHOWN = 256  # a caller id is at most 512 characters (callers.MAX_CALLER_ID); the record keeps 256

_Key = tuple[int, str, str, str]  # (minute, caller, rpc, reason)


@dataclass
class _Tally:
    stream: str
    kind: str
    unwritten: int = 0  # refusals after the first, not yet written
    last: float = 0.0


def refusal_stream(policy: RolePolicy, caller: Caller) -> str:
    """The tenant a refusal of `caller` is recorded in: its one configured tenant, else
    the system stream."""
    grant = policy.grants.get(caller.id) if caller.authenticated else None
    if grant is None or len(grant.tenants) != 1 or ALL_TENANTS in grant.tenants:
        return SYSTEM_STREAM
    [tenant] = grant.tenants
    return tenant


class RefusalTally:
    """The counts of one sidecar's refusals, and the records they become."""

    def __init__(self, audit: AuditSink, clock: Clock, *, window: float = WINDOW_SECONDS,
                 max_tallies: int = MAX_TALLIES):
        self._audit, self._clock, self._window, self._max = audit, clock, window, max_tallies
        self._lock = threading.Lock()
        self._tallies: dict[_Key, _Tally] = {}
        self._overflow: dict[_Key, _Tally] = {}  # at most one per RPC and reason and open minute
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None

    def refused(self, caller: Caller, rpc: str, reason: str, *, stream: str, kind: str) -> None:
        """Count one refusal; write its record if it is the first of its minute, and the
        records of minutes that have ended. Returns once they are committed."""
        now = self._clock.now()
        minute = math.floor(now / self._window)
        with self._lock:
            events = self._take_ended(minute)
            key, tallies, stream = self._place(minute, caller, rpc, reason, stream)
            tally = tallies.get(key)
            if tally is None:
                tallies[key] = _Tally(stream, kind, last=now)
                events.append(self._event(key, stream, kind, count=1, time=now, overflow=tallies is self._overflow))
            else:
                tally.unwritten += 1
                tally.last = now
        for event in events:
            self._audit.write(event)

    def counted(self, caller: Caller, rpc: str, reason: str, *, stream: str, kind: str, count: int) -> None:
        """Count `count` refusals and write nothing now: one record of them all is written
        once their minute has ended (by the flusher, a later refusal or the close). For a
        thread that must not wait for a commit: the decision pump's, or the event loop."""
        now = self._clock.now()
        with self._lock:
            key, tallies, stream = self._place(math.floor(now / self._window), caller, rpc, reason, stream)
            tally = tallies.setdefault(key, _Tally(stream, kind))
            tally.unwritten += count
            tally.last = now

    def _place(self, minute: int, caller: Caller, rpc: str, reason: str,
               stream: str) -> tuple[_Key, dict[_Key, _Tally], str]:
        """The tally a refusal counts in (its key, its map, its stream): the caller's own,
        or once MAX_TALLIES are open and it has none, the overflow's, in the system stream.
        Called under the lock."""
        key = (minute, caller.id[:_MAX_SHOWN], rpc, reason)
        if key not in self._tallies and len(self._tallies) >= self._max:
            return (minute, "", rpc, reason), self._overflow, SYSTEM_STREAM
        return key, self._tallies, stream

    def flush(self, *, everything: bool = False) -> int:
        """Write the counts of minutes that have ended (`everything`: of every minute, as
        the sidecar closes); returns the number of records written."""
        with self._lock:
            events = self._take_ended(None if everything else math.floor(self._clock.now() / self._window))
        for event in events:
            self._audit.write(event)
        return len(events)

    @property
    def open_tallies(self) -> int:
        with self._lock:
            return len(self._tallies) + len(self._overflow)

    def start(self, interval: float = FLUSH_SECONDS) -> RefusalTally:
        """Flush ended minutes every `interval` seconds on a thread of its own."""
        def run() -> None:
            while not self._stop.wait(interval):
                self.flush()

        self._flusher = threading.Thread(target=run, name="refusal-flusher", daemon=True)
        self._flusher.start()
        return self

    def close(self) -> None:
        """Stop the flusher and write every count still held (drain, shutdown)."""
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
        self.flush(everything=True)

    def _take_ended(self, current: int | None) -> list[AuditEvent]:
        """The records of the tallies of minutes before `current` (None: every minute),
        which are dropped. Called with the lock held."""
        events: list[AuditEvent] = []
        for tallies in (self._tallies, self._overflow):
            ended = [key for key in tallies if current is None or key[0] < current]
            for key in ended:
                tally = tallies.pop(key)
                if tally.unwritten:
                    events.append(self._event(key, tally.stream, tally.kind, count=tally.unwritten, time=tally.last,
                                              overflow=tallies is self._overflow))
        return events

    def _event(self, key: _Key, stream: str, kind: str, *, count: int, time: float, overflow: bool) -> AuditEvent:
        minute, caller, rpc, reason = key
        detail: dict[str, object] = {"rpc": rpc, "count": count, "minute": minute * self._window}
        if overflow:
            detail["overflow"] = True
        return AuditEvent(kind=kind, time=time, tenant=stream, result="refused", error_codes=(reason,),
                          detail=detail, caller=caller)


OVERLOADED = "overloaded"  # the reason of a shed call's record
DECISION_RPCS = "decisions"  # shed calls are recorded for every RPC the decision pump serves together
_SHED = Caller("", False)  # shed before its caller was resolved: no caller to name


def shed_recorder(tally: RefusalTally) -> Callable[[int], None]:
    """The decision pump's `on_shed`: calls refused undecided under overload (server/pump.py)
    are counted in the system stream, one record per minute once it has ended, with reason
    `overloaded`, no caller and detail rpc `decisions`."""

    def shed(count: int) -> None:
        tally.counted(_SHED, DECISION_RPCS, OVERLOADED, stream=SYSTEM_STREAM, kind="authorize", count=count)

    return shed
