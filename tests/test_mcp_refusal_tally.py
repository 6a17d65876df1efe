"""The gateway's count of its own refusals (toolauthz/mcp_proxy/refusal_tally.py): every
refusal is in exactly one record's count, a minute leaves at most two records per
caller, tool and code, and the open tallies are bounded."""

from __future__ import annotations

import random

from toolauthz.clock import FrozenClock
from toolauthz.mcp_proxy.refusal_tally import RefusalTally, Report


def test_counts_add_up_over_random_refusals():
    rng = random.Random(38)
    clock = FrozenClock(1_800_000_000.0)
    tally = RefusalTally(clock)
    reports: list[Report] = []
    refused: dict[tuple[str, str, float], int] = {}
    for _ in range(5000):
        clock.advance(rng.choice([0.0, 0.5, 7.0, 61.0]))
        caller, tool = rng.choice("abc"), rng.choice(["t1", "t2"])
        minute = clock.now() // 60 * 60
        refused[(caller, tool, minute)] = refused.get((caller, tool, minute), 0) + 1
        reports += tally.count(caller, tool, "upstream_unavailable", caller)
        if rng.random() < 0.05:
            reports += tally.due()
    reports += tally.flush()
    counted: dict[tuple[str, str, float], int] = {}
    records: dict[tuple[str, str, float], int] = {}
    for report in reports:
        key = (str(report.what), report.tool, report.minute)
        counted[key] = counted.get(key, 0) + report.count
        records[key] = records.get(key, 0) + 1
    assert counted == refused
    assert max(records.values()) <= 2 and len(tally) == 0


def test_the_first_of_a_minute_is_reported_at_once_and_the_rest_after_it():
    clock = FrozenClock(1_800_000_000.0)
    tally = RefusalTally(clock)
    assert [r.count for r in tally.count("alice", "t", "upstream_unavailable", 1)] == [1]
    assert tally.count("alice", "t", "upstream_unavailable", 2) == []
    assert tally.count("alice", "t", "upstream_unavailable", 3) == []
    assert tally.due() == []  # the minute has not ended
    clock.advance(60)
    [late] = tally.due()
    assert (late.count, late.what, late.detail()) == (2, 3, "count=2 minute=1800000000")


def test_open_tallies_are_bounded():
    clock = FrozenClock(1_800_000_000.0)
    tally = RefusalTally(clock, limit=3)
    reports: list[Report] = []
    for caller in range(100):
        reports += tally.count(str(caller), "t", "upstream_unavailable", caller)
        reports += tally.count(str(caller), "t", "upstream_unavailable", caller)
        assert len(tally) <= 3
    reports += tally.flush()
    assert sum(r.count for r in reports) == 200
