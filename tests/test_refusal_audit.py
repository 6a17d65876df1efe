"""Refused callers are audited in aggregate (toolauthz/service/refusals.py).

10,000 refusals through the sidecar's own gate (in process: the RPC layer adds nothing to
what is counted), with the clock moved across minutes: the records are counted exactly,
their counts add up, none lands in the tenant the requests name, a close flushes what is
still counted, and a flood of distinct caller ids holds a bounded table.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest

from toolauthz.audit.records import AuditEvent
from toolauthz.audit.store import AuditQuery
from toolauthz.clock import FrozenClock
from toolauthz.model import TENANT
from toolauthz.server.config import CallerSettings
from toolauthz.service.access import About
from toolauthz.service.callers import UNAUTHENTICATED, Caller
from toolauthz.service.refusals import SYSTEM_STREAM, RefusalTally, refusal_stream
from toolauthz.service.roles import CallerGrant, CallerRefused, RolePolicy

AGENT, MULTI, STRANGER = "spiffe://acme.example/agent", "spiffe://shared/agent", "spiffe://elsewhere/who"
CALLERS = [{"id": AGENT, "roles": ["runtime"], "tenants": ["acme"]},
           {"id": MULTI, "roles": ["runtime"], "tenants": ["acme", "globex"]}]
VICTIM = "victim"  # the tenant every refused request names


def _build(settings, clock):
    from toolauthz.server.build import build_sidecar

    configured = settings.model_copy(update={"callers": tuple(CallerSettings(**c) for c in CALLERS)})
    return build_sidecar(configured, clock=clock, callers=lambda context: context)  # the context is the caller


def _refuse(car: Any, caller: Caller, rpc: str, tenant: str = VICTIM) -> str:
    with pytest.raises(CallerRefused) as refused:
        car.gate.admit(caller, rpc, About(tenant=tenant, principal='User::"mallory"', call_id="c"))
    return refused.value.reason


def _refusals(car: Any) -> list[AuditEvent]:
    events, after = [], 0
    while page := car.audit_log.query(AuditQuery(result="refused"), limit=500, after_seq=after):
        events += [r.event for r in page]
        after = page[-1].seq
    return events


def test_ten_thousand_refusals_leave_one_record_per_caller_rpc_and_minute(settings, clock: FrozenClock) -> None:
    car = _build(settings, clock)
    who = [UNAUTHENTICATED, Caller(STRANGER, True), Caller(AGENT, True), Caller(MULTI, True)]
    rpcs = ["Authorize", "Verify", "QueryDecisions"]
    sent: collections.Counter[tuple[int, str, str, str]] = collections.Counter()
    clock.set(1_800_000_000.0)  # a minute's start: 2,500 refusals a minute, 4 ms apart
    for i in range(10_000):
        caller, rpc = who[i % len(who)], rpcs[(i // 7) % len(rpcs)]
        tenant = "acme" if caller.id == MULTI and rpc == "QueryDecisions" else VICTIM
        reason = _refuse(car, caller, rpc, tenant)
        sent[(int(clock.now() // 60), caller.id, rpc, reason)] += 1
        clock.advance(0.024)
    mid_minute = len(_refusals(car))
    car.close()  # the last minute's counts are written as the sidecar closes

    reopened = _build(settings, clock)
    try:
        events = _refusals(reopened)
    finally:
        reopened.close()
    assert len(sent) == 4 * 4 * 3  # four minutes, four callers, three RPCs, one reason each
    # Exactly: each (minute, caller, RPC, reason) one record of its first refusal, and one
    # of the rest when there were more (here there always are).
    assert len(events) == len(sent) + sum(1 for n in sent.values() if n > 1) == 96
    assert mid_minute == 96 - 12  # before the close: the last minute's twelve counts were still held
    got: collections.Counter[tuple[int, str, str, str]] = collections.Counter()
    for event in events:
        got[(int(event.detail["minute"] // 60), event.caller, event.detail["rpc"], event.error_codes[0])] += \
            event.detail["count"]
    assert got == sent and sum(got.values()) == 10_000
    streams = {(e.caller, e.tenant) for e in events}
    assert streams == {("unauthenticated", SYSTEM_STREAM), (STRANGER, SYSTEM_STREAM), (AGENT, "acme"),
                       (MULTI, SYSTEM_STREAM)}
    assert all(e.principal == "" and e.call_id == "" for e in events)  # what the request says is not kept


def test_refusals_never_land_in_the_tenant_the_request_names(settings, clock: FrozenClock) -> None:
    car = _build(settings, clock)
    try:
        for tenant in ("globex", VICTIM, "acme"):
            _refuse(car, Caller(STRANGER, True), "Authorize", tenant)
            if tenant != "acme":  # acme is the agent's own: admitted
                _refuse(car, Caller(AGENT, True), "Authorize", tenant)
            _refuse(car, Caller(AGENT, True), "ListApprovals", tenant)
        clock.advance(60)
        car.gate.refusals.flush()
        events = _refusals(car)
        assert {e.tenant for e in events} == {"acme", SYSTEM_STREAM}
        assert car.audit_log.query(AuditQuery(tenant="globex"), limit=10) == []
        assert car.audit_log.query(AuditQuery(tenant=VICTIM), limit=10) == []
    finally:
        car.close()


def test_the_system_stream_is_no_tenant_name() -> None:
    assert not TENANT.fullmatch(SYSTEM_STREAM)
    policy = RolePolicy.of([CallerGrant("one", frozenset({"runtime"}), frozenset({"acme"})),
                            CallerGrant("two", frozenset({"runtime"}), frozenset({"acme", "globex"})),
                            CallerGrant("all", frozenset({"auditor"}), frozenset({"*"}))])
    assert refusal_stream(policy, Caller("one", True)) == "acme"
    assert refusal_stream(policy, Caller("one", False)) == SYSTEM_STREAM  # the id, unproven, binds nothing
    for caller in ("two", "all", "nobody"):
        assert refusal_stream(policy, Caller(caller, True)) == SYSTEM_STREAM


class _Recorder:
    def __init__(self) -> None:
        self.events: list[AuditEvent] = []

    def write(self, event: AuditEvent) -> None:
        self.events.append(event)


def test_a_minute_ends_by_the_flusher_the_next_refusal_or_the_close(clock: FrozenClock) -> None:
    sink = _Recorder()
    tally = RefusalTally(sink, clock)
    clock.set(1_800_000_000.0)
    for _ in range(5):
        tally.refused(UNAUTHENTICATED, "Authorize", "caller_unknown", stream=SYSTEM_STREAM, kind="authorize")
    assert [e.detail["count"] for e in sink.events] == [1]  # the first, at once
    assert tally.flush() == 0  # the minute has not ended
    clock.advance(60)
    assert tally.flush() == 1 and sink.events[-1].detail["count"] == 4  # the flusher's tick
    tally.refused(UNAUTHENTICATED, "Authorize", "caller_unknown", stream=SYSTEM_STREAM, kind="authorize")
    tally.refused(UNAUTHENTICATED, "Authorize", "caller_unknown", stream=SYSTEM_STREAM, kind="authorize")
    clock.advance(60)
    tally.refused(UNAUTHENTICATED, "Verify", "caller_unknown", stream=SYSTEM_STREAM, kind="verify")  # ends it
    assert [(e.detail["rpc"], e.detail["count"]) for e in sink.events[2:]] == [
        ("Authorize", 1), ("Authorize", 1), ("Verify", 1)]
    tally.refused(UNAUTHENTICATED, "Verify", "caller_unknown", stream=SYSTEM_STREAM, kind="verify")
    tally.close()
    assert sink.events[-1].detail["count"] == 1 and tally.open_tallies == 0
    assert sum(e.detail["count"] for e in sink.events) == 5 + 2 + 1 + 1


def test_a_flood_of_distinct_callers_holds_a_bounded_table(clock: FrozenClock) -> None:
    sink = _Recorder()
    tally = RefusalTally(sink, clock, max_tallies=16)
    clock.set(1_800_000_000.0)
    for i in range(5_000):
        tally.refused(Caller(f"spiffe://flood/{i}", True), "Authorize", "caller_unknown", stream=SYSTEM_STREAM,
                      kind="authorize")
        assert tally.open_tallies <= 17  # sixteen callers and one overflow tally
    tally.close()
    assert len(sink.events) == 16 + 2  # sixteen firsts; the overflow's first and its count
    overflow = [e for e in sink.events if e.detail.get("overflow")]
    assert [(e.caller, e.tenant, e.detail["count"]) for e in overflow] == [
        ("", SYSTEM_STREAM, 1), ("", SYSTEM_STREAM, 5_000 - 16 - 1)]
    assert sum(e.detail["count"] for e in sink.events) == 5_000
