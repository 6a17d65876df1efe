"""What a PostgreSQL replica foresees of the rows its decisions read
(store/postgres/foresight.py): learned from its transactions, bounded, and given up for
the long way while another writer keeps moving them."""

from __future__ import annotations

from toolauthz.store.ledger import CallEntry, Standing
from toolauthz.store.postgres import foresight as module
from toolauthz.store.postgres.foresight import PROBE_EVERY, RECENT, Foresight
from toolauthz.usage.charges import Charge

CHARGE = Charge("spent", "alice", 700, 3600)


def _entry(request_id: str = "run", tool: str = "t", at: float = 10.0) -> CallEntry:
    return CallEntry("acme", "c", request_id, tool, "d", 'User::"alice"', at, charges=(CHARGE,))


def test_unknown_runs_and_meters_are_foreseen_new_and_what_a_transaction_left_is_foreseen_after_it():
    sight = Foresight()
    assert sight.standing([_entry()]) == [Standing(0, 0, (0,))]
    sight.learn({("acme", "run", "t", 10.0): (3, 2)}, {("acme", "spent", "alice", 10.0, 3600): 1400},
                {"5": (7, "h7")})
    # Keyed without the time it was read at: a later call of the run foresees the same;
    # one of another tool, the run's calls and none of its tool.
    assert sight.standing([_entry(at=99.0), _entry(tool="other")]) == [Standing(3, 2, (1400,)),
                                                                       Standing(3, 0, (1400,))]
    assert sight.heads(["5", "6"]) == {"5": (7, "h7")}


def test_what_is_remembered_is_bounded_least_recently_used_first_out(monkeypatch):
    monkeypatch.setattr(module, "MAX_REMEMBERED", 3)
    sight = Foresight()
    for n in range(5):
        sight.learn_counts([_entry(request_id=f"r{n}")], [(n + 1, n + 1)])
    assert [sight.counts(_entry(request_id=f"r{n}")) for n in range(5)] == [(0, 0), (0, 0), (3, 3), (4, 4), (5, 5)]
    assert sight.counts(_entry(request_id="r4", tool="other")) == (5, 0)


def test_a_replica_that_keeps_missing_goes_the_long_way_and_probes_again():
    sight = Foresight()
    assert sight.worth_trying()
    for _ in range(RECENT):
        sight.tally(hit=False)
    assert not sight.worth_trying()
    for _ in range(PROBE_EVERY - 1):
        sight.skipped()
        assert not sight.worth_trying()
    sight.skipped()
    assert sight.worth_trying()  # one batch foreseen again, to find out
    sight.tally(hit=False)
    assert not sight.worth_trying()  # still missing: the long way again
    for _ in range(RECENT):
        sight.tally(hit=True)
    assert sight.worth_trying()
