"""The Authorizer: each RPC as a plan (`plan_*`, made on the caller's thread) and the
running of plans, whose ledger writes share commits (`run_many`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from toolauthz.authorizer import deciding, reports, verifying, writes
from toolauthz.authorizer.parts import Parts
from toolauthz.authorizer.plans import AuthorizeResult, OutcomeResult, Plan, VerifyResult
from toolauthz.model import ProposedCall, TrustedContext
from toolauthz.store.ledger import only_result

T = TypeVar("T")


class Authorizer(Parts):
    """`caller` of every request: who asked, as the transport proved it. Every audit
    record names it, and a new call belongs to it (with its principal and run): only
    they verify, report, replay it or receive its approval's token."""

    def run(self, plan: Plan[T]) -> T:
        """One request's plan: its write, then its answer (or the exception)."""
        return only_result(self.run_many([plan]))

    def run_many(self, plans: Sequence[Plan]) -> list:
        """Many requests' plans (`writes.run_many`)."""
        return writes.run_many(self.ledger, plans)

    def authorize(self, ctx: TrustedContext, call: ProposedCall,
                  still_wanted: Callable[[], bool] = lambda: True, *, caller: str = "") -> AuthorizeResult:
        """`still_wanted` is asked right before a token would be minted: a client that
        cancelled or whose deadline passed gets none (a retry replays the decision)."""
        return self.run(self.plan_authorize(ctx, call, still_wanted, caller=caller))

    def plan_authorize(self, ctx: TrustedContext, call: ProposedCall,
                       still_wanted: Callable[[], bool] = lambda: True, *, caller: str = "",
                       deadline: float | None = None) -> Plan[AuthorizeResult]:
        """`deadline`: when the caller stops waiting (time.monotonic() seconds)."""
        return deciding.plan_authorize(self, ctx, call, still_wanted, caller, deadline)

    def verify(self, token: str, ctx: TrustedContext, call: ProposedCall, *, caller: str = "") -> VerifyResult:
        return self.run(self.plan_verify(token, ctx, call, caller=caller))

    def plan_verify(self, token: str, ctx: TrustedContext, call: ProposedCall, *,
                    caller: str = "") -> Plan[VerifyResult]:
        return verifying.plan_verify(self, token, ctx, call, caller)

    def report_outcome(self, ctx: TrustedContext, call_id: str, status: str, error_code: str = "",
                       output_digest: str = "", *, caller: str = "") -> OutcomeResult:
        return self.run(self.plan_report_outcome(ctx, call_id, status, error_code, output_digest, caller=caller))

    def plan_report_outcome(self, ctx: TrustedContext, call_id: str, status: str, error_code: str = "",
                            output_digest: str = "", *, caller: str = "") -> Plan[OutcomeResult]:
        return reports.plan_report_outcome(self, ctx, call_id, status, error_code, output_digest, caller)

    def report_refusal(self, ctx: TrustedContext, call_id: str, tool: str, code: str, detail: str = "", *,
                       caller: str = "") -> str:
        return self.run(self.plan_report_refusal(ctx, call_id, tool, code, detail, caller=caller))

    def plan_report_refusal(self, ctx: TrustedContext, call_id: str, tool: str, code: str, detail: str = "", *,
                            caller: str = "") -> Plan[str]:
        return reports.plan_report_refusal(self, ctx, call_id, tool, code, detail, caller)
