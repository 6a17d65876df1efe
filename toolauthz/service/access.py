"""The gate every handler passes first: who is calling, and may they call this.

`Gate.admit` resolves the caller (`callers`, by default `caller_of`: the identity the
transport proved), applies the policy of roles (toolauthz/service/roles.py) and, on a
refusal, counts it in the audit (toolauthz/service/refusals.py: one record per caller, RPC
and minute, in the caller's own tenant or the system stream, never the tenant the request
names) before raising CallerRefused, which the error boundary (`status_mapped`) answers
with PERMISSION_DENIED.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolauthz.audit.sink import AuditSink
from toolauthz.clock import Clock
from toolauthz.service.callers import Caller, caller_of
from toolauthz.service.refusals import RefusalTally, refusal_stream
from toolauthz.service.roles import Access, CallerRefused, RolePolicy, Rpc, authorize_rpc, check_tenant

# Resolves the caller of an RPC from its grpc ServicerContext. Tests inject one that reads
# a test-only metadata header; servers use `caller_of`.
CallerResolver = Callable[[Any], Caller]

# The audit kind of a refused RPC: the kind of call step it was asked for; RPCs about no
# call step (GetStatus, QueryDecisions) are recorded as `authorize`, the kind of access
# decisions.
_REFUSAL_KIND: dict[str, str] = {"Verify": "verify", "ReportOutcome": "outcome", "ListApprovals": "approval",
                                 "GetApproval": "approval", "WatchApproval": "approval", "DecideApproval": "approval"}


@dataclass(frozen=True)
class About:
    """What a request says it is about: the tenant its caller is checked against."""

    tenant: str = ""
    principal: str = ""
    call_id: str = ""
    request_id: str = ""
    approval_id: str = ""


@dataclass(frozen=True)
class Gate:
    policy: RolePolicy
    audit: AuditSink
    clock: Clock
    callers: CallerResolver = caller_of
    refusals: RefusalTally = field(default=None)  # type: ignore[assignment]  # set in __post_init__

    def __post_init__(self) -> None:
        if self.refusals is None:
            object.__setattr__(self, "refusals", RefusalTally(self.audit, self.clock))

    def admit(self, context: Any, rpc: Rpc, about: About = About()) -> Access:
        caller = self.callers(context)
        try:
            return authorize_rpc(self.policy, caller, rpc, about.tenant)
        except CallerRefused as exc:
            self._audit_refusal(caller, rpc, about, exc)
            raise

    async def admit_async(self, context: Any, rpc: Rpc, about: About = About()) -> Access:
        """`admit` for a coroutine handler: a refusal's audit write, which waits for its
        commit, runs off the event loop."""
        caller = self.callers(context)
        try:
            return authorize_rpc(self.policy, caller, rpc, about.tenant)
        except CallerRefused as exc:
            write = functools.partial(self._audit_refusal, caller, rpc, about, exc)
            await asyncio.get_running_loop().run_in_executor(None, write)
            raise

    def admit_tenant(self, access: Access, rpc: Rpc, about: About) -> None:
        """For an RPC whose tenant is known once its object is read (an approval)."""
        try:
            check_tenant(access, about.tenant)
        except CallerRefused as exc:
            self._audit_refusal(access.caller, rpc, about, exc)
            raise

    def _audit_refusal(self, caller: Caller, rpc: Rpc, about: About, exc: CallerRefused) -> None:
        self.refusals.refused(caller, rpc, exc.reason, stream=refusal_stream(self.policy, caller),
                              kind=_REFUSAL_KIND.get(rpc, "authorize"))


def open_gate(audit: AuditSink, clock: Clock, callers: CallerResolver = caller_of) -> Gate:
    """A gate with no configured callers: every caller may call everything."""
    return Gate(RolePolicy(), audit, clock, callers)
