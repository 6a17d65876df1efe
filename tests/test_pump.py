"""The decision pump: one thread, batches, each request answered alone."""

from __future__ import annotations

import asyncio
import threading

import pytest
from conftest import make_request, verify_request

from toolauthz.errors import InputError, StoreUnavailable
from toolauthz.model import Decision
from toolauthz.server.pump import DecisionPump
from toolauthz.service.common import proposed_call, trusted_context


def plan_for(car, request):
    return lambda: car.authorizer.plan_authorize(trusted_context(request.context), proposed_call(request.call))


@pytest.fixture
def pump(sidecar):
    pump = DecisionPump(sidecar.authorizer)
    yield pump
    pump.close()


def held_first_batch(pump):
    """A job that holds the pump until released, so that what is queued meanwhile forms
    one known batch."""
    entered, release = threading.Event(), threading.Event()

    def make_plan():
        entered.set()
        release.wait(30)
        raise InputError("held", "held on purpose")

    return make_plan, entered, release


def test_requests_queued_while_the_pump_is_busy_share_one_batch_and_one_commit(sidecar, pump, monkeypatch):
    applied = []
    real_apply = sidecar.ledger.apply
    monkeypatch.setattr(sidecar.ledger, "apply", lambda ops: applied.append(len(ops)) or real_apply(ops))
    hold, entered, release = held_first_batch(pump)

    async def main():
        first = asyncio.ensure_future(pump.answer(hold))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
        plans = [plan_for(sidecar, make_request(call_id=f"c{i}", request_id=f"run{i}")) for i in range(20)]
        rest = [asyncio.ensure_future(pump.answer(plan)) for plan in plans]
        await asyncio.sleep(0)  # let the 20 reach the queue before the pump is released
        release.set()
        with pytest.raises(InputError):
            await first
        return await asyncio.gather(*rest)

    results = asyncio.run(main())
    assert [r.decision for r in results] == [Decision.ALLOW] * 20
    assert len({r.token.jti for r in results}) == 20
    assert pump.batches == 2 and applied == [20]  # the 20 in one batch, their writes in one apply
    assert sidecar.ledger.get("acme", "c19").decision == "ALLOW"


def test_the_pump_counts_what_it_answered_what_batches_and_what_waits(sidecar, pump):
    hold, entered, release = held_first_batch(pump)
    seen = {}

    async def main():
        first = asyncio.ensure_future(pump.answer(hold))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
        rest = [asyncio.ensure_future(pump.answer(plan_for(sidecar, make_request(call_id=f"c{i}"))))
                for i in range(5)]
        await asyncio.sleep(0)
        seen["held"] = (pump.answered, pump.batches, pump.waiting)
        release.set()
        await asyncio.gather(first, *rest, return_exceptions=True)

    asyncio.run(main())
    assert seen["held"] == (0, 0, 5)
    assert (pump.answered, pump.batches, pump.waiting) == (6, 2, 0)


def test_get_status_reports_the_answering_workers_pump(stub):
    for i in range(3):
        stub.Authorize(make_request(call_id=f"s{i}"))
    from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

    status = stub.GetStatus(pb.GetStatusRequest())
    assert status.decisions == 3 and 1 <= status.decision_batches <= 3 and status.decisions_waiting == 0


def test_a_bad_request_in_a_batch_fails_alone(sidecar, pump):
    async def main():
        good = pump.answer(plan_for(sidecar, make_request(call_id="good")))
        bad = pump.answer(lambda: (_ for _ in ()).throw(InputError("bad_input", "bad")))
        return await asyncio.gather(good, bad, return_exceptions=True)

    good, bad = asyncio.run(main())
    assert good.decision is Decision.ALLOW and good.token is not None
    assert isinstance(bad, InputError) and bad.code == "bad_input"


def test_a_plan_raising_stop_iteration_fails_alone_and_leaves_no_one_waiting(sidecar):
    # A future refuses StopIteration: set on one, it would raise in the loop's callback
    # and leave every later answer of the batch unset, its callers waiting for ever.
    def stops():
        raise StopIteration

    pump = DecisionPump(sidecar.authorizer, inline_after=None)
    hold, entered, release = held_first_batch(pump)

    async def main():
        held = asyncio.ensure_future(pump.answer(hold))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
        answers = [asyncio.ensure_future(pump.answer(stops)),
                   asyncio.ensure_future(pump.answer(plan_for(sidecar, make_request(call_id="after"))))]
        await asyncio.sleep(0)
        assert pump.waiting == 2  # so they share one batch, the StopIteration first
        release.set()
        await asyncio.gather(held, return_exceptions=True)
        return await asyncio.wait_for(asyncio.gather(*answers, return_exceptions=True), 30)

    try:
        stopped, after = asyncio.run(main())
    finally:
        pump.close()
    assert isinstance(stopped, RuntimeError) and after.decision is Decision.ALLOW and after.token is not None


def test_a_failed_commit_fails_every_request_of_its_batch_with_no_token(sidecar, pump, monkeypatch):
    def broken_apply(ops):
        raise StoreUnavailable("disk gone")

    monkeypatch.setattr(sidecar.ledger, "apply", broken_apply)

    async def main():
        return await asyncio.gather(*(pump.answer(plan_for(sidecar, make_request(call_id=f"c{i}")))
                                      for i in range(3)), return_exceptions=True)

    answers = asyncio.run(main())
    assert all(isinstance(a, StoreUnavailable) for a in answers) and len({id(a) for a in answers}) == 3


def test_verify_through_the_pump_consumes_once(sidecar, pump):
    request = make_request()
    car = sidecar

    async def main():
        decided = await pump.answer(plan_for(car, request))
        verify = verify_request(request, decided.token.token)

        def plan():
            return car.authorizer.plan_verify(verify.token, trusted_context(verify.context), proposed_call(verify.call))

        return await asyncio.gather(pump.answer(plan), pump.answer(plan))

    first, second = asyncio.run(main())
    assert sorted([first.code, second.code]) == ["already_used", "ok"]


def test_a_cancelled_caller_does_not_disturb_the_others(sidecar, pump):
    hold, entered, release = held_first_batch(pump)

    async def main():
        first = asyncio.ensure_future(pump.answer(hold))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
        gone = asyncio.ensure_future(pump.answer(plan_for(sidecar, make_request(call_id="gone"))))
        kept = asyncio.ensure_future(pump.answer(plan_for(sidecar, make_request(call_id="kept"))))
        await asyncio.sleep(0)
        gone.cancel()
        release.set()
        await asyncio.gather(first, return_exceptions=True)
        return await kept

    assert asyncio.run(main()).decision is Decision.ALLOW
    # The cancelled call was still decided (its client may retry and replay it).
    assert sidecar.ledger.get("acme", "gone") is not None


def test_close_answers_what_is_queued_then_refuses(sidecar):
    pump = DecisionPump(sidecar.authorizer)
    hold, entered, release = held_first_batch(pump)

    async def main():
        first = asyncio.ensure_future(pump.answer(hold))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
        queued = asyncio.ensure_future(pump.answer(plan_for(sidecar, make_request(call_id="queued"))))
        await asyncio.sleep(0)
        closing = asyncio.get_running_loop().run_in_executor(None, pump.close)
        release.set()
        await closing
        with pytest.raises(StoreUnavailable):
            await pump.answer(plan_for(sidecar, make_request(call_id="late")))
        await asyncio.gather(first, return_exceptions=True)
        return await queued

    assert asyncio.run(main()).decision is Decision.ALLOW
    assert sidecar.ledger.get("acme", "late") is None


def test_a_group_runs_in_one_batch_and_a_batch_takes_no_more_plans_than_fit_one_transaction(sidecar, monkeypatch):
    """With room for 4 plans: 3 singles queued, then a group of 3 (one member failing in
    planning), then 1 single. The group never splits: the singles go first, the group and
    the last single after, each batch in one ledger apply."""
    applied = []
    real_apply = sidecar.ledger.apply
    monkeypatch.setattr(sidecar.ledger, "apply", lambda ops: applied.append(len(ops)) or real_apply(ops))
    pump = DecisionPump(sidecar.authorizer, max_batch=4)
    hold, entered, release = held_first_batch(pump)

    def group():
        return [plan_for(sidecar, make_request(call_id="g1", request_id="run-g"))(), InputError("bad_input", "bad"),
                plan_for(sidecar, make_request(call_id="g3", request_id="run-g"))()]

    async def main():
        first = asyncio.ensure_future(pump.answer(hold))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
        singles = [asyncio.ensure_future(pump.answer(plan_for(sidecar, make_request(call_id=f"s{i}"))))
                   for i in range(3)]
        grouped = asyncio.ensure_future(pump.answer_group(group, 3))
        last = asyncio.ensure_future(pump.answer(plan_for(sidecar, make_request(call_id="s3", request_id="run-s3"))))
        await asyncio.sleep(0)
        release.set()
        with pytest.raises(InputError):
            await first
        return await asyncio.gather(*singles), await grouped, await last

    try:
        singles, grouped, last = asyncio.run(main())
    finally:
        pump.close()
    assert [r.decision for r in singles] == [Decision.ALLOW] * 3 and last.decision is Decision.ALLOW
    assert grouped[0].decision is Decision.ALLOW and grouped[2].decision is Decision.ALLOW
    assert isinstance(grouped[1], InputError)
    assert pump.batches == 3 and applied == [3, 3]  # the held job wrote nothing; then 3 singles; then 2 + 1


def test_a_group_whose_planning_fails_fails_whole(sidecar, pump):
    def refused():
        raise InputError("bad_batch", "refused whole")

    async def main():
        return await asyncio.gather(pump.answer_group(refused, 2),
                                    pump.answer(plan_for(sidecar, make_request(call_id="ok"))),
                                    return_exceptions=True)

    group, single = asyncio.run(main())
    assert isinstance(group, InputError) and single.decision is Decision.ALLOW
