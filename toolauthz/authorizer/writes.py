"""Running plans: their ledger writes share commits, and each new call's decision is made
on its run's counts and its meters as they stand in the transaction that records it."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from toolauthz.authorizer.plans import Plan
from toolauthz.errors import StoreUnavailable
from toolauthz.store.ledger import CallLedger, LedgerOp, Reservation, ReserveCall, Standing
from toolauthz.telemetry import metrics, timeline, tracing

# Tries at recording a decision whose run's counts or meters moved meanwhile (`write_all`).
MAX_ROUNDS = 16


def run_many(ledger: CallLedger, plans: Sequence[Plan]) -> list:
    """Many requests' plans, their writes sharing the ledger's commits; each one's answer
    or the exception it failed with, in order, so that one bad request never fails the
    others."""
    written = write_all(ledger, plans)
    answers: list = []
    for plan, result in zip(plans, written, strict=True):
        try:
            if isinstance(result, BaseException):
                raise result
            answers.append(plan.finish(result))
        except Exception as exc:  # noqa: BLE001 - this request's failure, answered to it alone
            answers.append(exc)
    return answers


def write_all(ledger: CallLedger, plans: Sequence[Plan]) -> list[Any]:
    """Each plan's write result (None without a write), or the exception it failed with.

    A new call's decision is made here, before the ledger's transaction, on the run's
    counts and the call's meters as read now plus what the reservations ahead of it in
    this batch take; the ledger records it only if what it reads in the transaction is
    the same, and otherwise answers with how things stand, to be decided on again in the
    next round. So Cedar and the token's signature stay out of the locks (every
    replica's writes to the run or meter queue on them), storage never runs policy, and
    no decision commits on counts or meter values that no longer hold. Each round that
    moves a call's standing means another transaction reserved a call of its run or
    charged its meter: a round never fails without someone's progress, and after
    `MAX_ROUNDS` the call is refused as unavailable (fail closed)."""
    results: list[Any] = [None] * len(plans)
    pending = [i for i, plan in enumerate(plans) if plan.op is not None or plan.deciding is not None]
    standing = _first_standing(ledger, plans)
    for _ in range(MAX_ROUNDS):
        placed, ops = _round_ops(plans, pending, standing, results)
        try:
            timeline.batch_mark("store")
            with _store_spans(plans), metrics.timed(metrics.AUDIT_WRITE_SECONDS):
                out = list(ledger.apply(ops)) if ops else []
            timeline.batch_mark("stored")
        except StoreUnavailable as exc:
            metrics.AUDIT_WRITE_FAILURES.inc()
            out = [StoreUnavailable.caused_by(exc) for _ in ops]
        pending = []
        for i, result in zip(placed, out, strict=True):
            if isinstance(result, Reservation) and result.moved is not None:
                standing[i] = result.moved
                pending.append(i)
            else:
                results[i] = result
        if not pending:
            return results
    for i in pending:
        results[i] = StoreUnavailable("the run's calls kept changing while this call was decided; retry")
    return results


def _first_standing(ledger: CallLedger, plans: Sequence[Plan]) -> dict[int, Standing]:
    deciding = [(i, plan.deciding.entry) for i, plan in enumerate(plans) if plan.deciding is not None]
    if not deciding:
        return {}
    try:
        read = ledger.expected_standing([entry for _, entry in deciding])
    except StoreUnavailable:  # a guess: the transaction reads them (or fails the batch)
        read = [Standing(0, 0, tuple(0 for _ in entry.charges)) for _, entry in deciding]
    return {i: standing for (i, _), standing in zip(deciding, read, strict=True)}


def _round_ops(plans: Sequence[Plan], pending: list[int], standing: dict[int, Standing],
               results: list[Any]) -> tuple[list[int], list[LedgerOp]]:
    """The writes of one round: the plans' own, and each pending decision made on its
    run's counts and meters plus what the reservations ahead of it in this round take."""
    placed: list[int] = []
    ops: list[LedgerOp] = []
    ahead: Counter[tuple[str, ...]] = Counter()
    calls_seen: set[tuple[str, str]] = set()
    for i in pending:
        plan = plans[i]
        if plan.deciding is None:
            assert plan.op is not None
            placed.append(i)
            ops.append(plan.op)
            continue
        entry = plan.deciding.entry
        run = ("run", entry.tenant, entry.request_id)
        meters = [("meter", entry.tenant, charge.meter, charge.key) for charge in entry.charges]
        read = standing[i]
        stands = Standing(read.calls + ahead[run], read.tool_calls + ahead[(*run, entry.tool)],
                          tuple(value + ahead[meter] for value, meter in zip(read.usage, meters, strict=True)))
        try:
            decision = plan.deciding.decide(stands)
        except Exception as exc:  # noqa: BLE001 - this call's failure alone: nothing of it is written
            results[i] = exc
            continue
        first = (entry.tenant, entry.call_id) not in calls_seen
        calls_seen.add((entry.tenant, entry.call_id))
        if first and decision.uses_run_budget:  # a second one of this call finds the first
            ahead[run] += 1
            ahead[(*run, entry.tool)] += 1
            for meter, charge in zip(meters, entry.charges, strict=True):
                ahead[meter] += charge.amount
        placed.append(i)
        ops.append(ReserveCall(entry, decision, stands, deadline=plan.deadline))
    return placed, ops


@contextlib.contextmanager
def _store_spans(plans: Sequence[Plan]) -> Iterator[None]:
    """A `store` span for each traced request of a batch: their writes share one
    transaction, so each span covers that whole commit."""
    traced = [plan.trace for plan in plans
              if plan.trace is not None and (plan.op is not None or plan.deciding is not None)]
    if not traced:
        yield
        return
    with contextlib.ExitStack() as spans:
        for parent in traced:
            spans.enter_context(tracing.step("store", parent, {"toolauthz.batch_size": len(plans)}))
        yield
