"""Who may call which RPC, for which tenants: the whole policy of roles, and nothing else.

Pure: no gRPC, no storage. `authorize_rpc` answers for one caller (the identity the
transport proved, toolauthz/service/callers.py) and one RPC, with the tenant the request is
about when it names one, and raises ForbiddenError otherwise.

    runtime   Authorize, AuthorizeBatch, Verify, ReportOutcome, ReportRefusal, GetStatus, GetCatalog, and
              GetApproval/WatchApproval of its own calls (the token only with the call's
              context; service/ownership.py)
    approver  ListApprovals, GetApproval/WatchApproval (never a token), DecideApproval
    auditor   QueryDecisions
    anyone    GetKeys (public keys)

Without any configured caller (`RolePolicy.open`), every caller may call everything, as
in development; an unauthenticated caller then acts as "unauthenticated". With callers
configured, a caller that is not listed (authenticated or not) may call GetKeys alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from toolauthz.errors import ForbiddenError
from toolauthz.service.callers import Caller

Role = Literal["runtime", "approver", "auditor"]
ROLES: tuple[Role, ...] = ("runtime", "approver", "auditor")
ALL_TENANTS = "*"

Rpc = Literal["Authorize", "AuthorizeBatch", "Verify", "ReportOutcome", "ReportRefusal", "ListVisible", "GetKeys",
              "GetStatus", "GetCatalog", "ListApprovals", "GetApproval", "WatchApproval", "DecideApproval",
              "QueryDecisions"]
# The roles that may call each RPC; an RPC missing here is refused to every listed role.
RPC_ROLES: Mapping[Rpc, frozenset[Role]] = {
    "Authorize": frozenset({"runtime"}),
    "AuthorizeBatch": frozenset({"runtime"}),
    "Verify": frozenset({"runtime"}),
    "ReportOutcome": frozenset({"runtime"}),
    "ReportRefusal": frozenset({"runtime"}),
    "ListVisible": frozenset({"runtime"}),
    "GetStatus": frozenset({"runtime"}),
    # The verified bundle's tool files: what the MCP gateway routes by (a runtime).
    "GetCatalog": frozenset({"runtime"}),
    "GetKeys": frozenset(ROLES),
    "GetApproval": frozenset({"runtime", "approver"}),
    "WatchApproval": frozenset({"runtime", "approver"}),
    "ListApprovals": frozenset({"approver"}),
    "DecideApproval": frozenset({"approver"}),
    "QueryDecisions": frozenset({"auditor"}),
}
PUBLIC_RPCS: frozenset[Rpc] = frozenset({"GetKeys"})


@dataclass(frozen=True)
class CallerGrant:
    """What one configured caller may do: its roles, in its tenants ("*": every tenant)."""

    id: str
    roles: frozenset[Role]
    tenants: frozenset[str]

    def in_tenant(self, tenant: str) -> bool:
        return ALL_TENANTS in self.tenants or tenant in self.tenants


@dataclass(frozen=True)
class Access:
    """What a caller admitted to one RPC may see. `tenants` None: every tenant; else the
    only tenants whose records and approvals it is shown. `roles`: the caller's roles
    (every role when roles are not enforced)."""

    caller: Caller
    roles: frozenset[Role]
    tenants: frozenset[str] | None

    def sees(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants

    def has(self, role: Role, tenant: str) -> bool:
        return role in self.roles and self.sees(tenant)


@dataclass(frozen=True)
class RolePolicy:
    grants: Mapping[str, CallerGrant] = field(default_factory=dict)

    @classmethod
    def of(cls, grants: Iterable[CallerGrant]) -> RolePolicy:
        return cls({grant.id: grant for grant in grants})

    @property
    def open(self) -> bool:
        """No callers configured: roles are not enforced (development, or a deployment
        whose listeners alone decide who may connect)."""
        return not self.grants


class CallerRefused(ForbiddenError):
    """A caller outside its roles or tenants; `reason` is a stable code for the audit."""

    def __init__(self, message: str, reason: str):
        self.reason = reason
        super().__init__(message)


def authorize_rpc(policy: RolePolicy, caller: Caller, rpc: Rpc, tenant: str = "") -> Access:
    """The caller's access to `rpc`, about `tenant` when the request names one; raises
    CallerRefused when its roles or tenants do not cover it."""
    if policy.open:
        return Access(caller, frozenset(ROLES), None)
    grant = policy.grants.get(caller.id) if caller.authenticated else None
    if grant is None:
        if rpc in PUBLIC_RPCS:
            return Access(caller, frozenset(), frozenset())
        who = "an unauthenticated caller" if not caller.authenticated else "a caller that is not configured"
        raise CallerRefused(f"{who} may not call {rpc}", "caller_unknown")
    if not grant.roles & RPC_ROLES[rpc]:
        raise CallerRefused(f"the caller's roles do not include {rpc}", "role_not_permitted")
    if tenant and not grant.in_tenant(tenant):
        raise CallerRefused(f"the caller may not act in tenant `{tenant[:64]}`", "tenant_not_permitted")
    return Access(caller, grant.roles, None if ALL_TENANTS in grant.tenants else grant.tenants)


def check_tenant(access: Access, tenant: str) -> None:
    """For an RPC whose tenant is known only once its object is read (an approval)."""
    if not access.sees(tenant):
        raise CallerRefused(f"the caller may not act in tenant `{tenant[:64]}`", "tenant_not_permitted")
