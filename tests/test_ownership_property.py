"""Property: no request from caller Y reads, closes, consumes or approves anything that
caller X created, unless a documented role lets Y (README "Callers and roles"): an
approver reads and decides its tenants' approvals (never receiving a token), an auditor
reads its tenants' audit records, and a runtime acts on its own calls alone.

One in-process sidecar serves every example over gRPC (callers named by the test-only
header of tests/test_roles.py). Each example: X, a runtime of the tenant, proposes a call
(an ALLOW, or an APPROVAL_REQUIRED that an approver approves); Y, drawn from callers of
every role combination, the unlisted and the unauthenticated, tries one thing on it,
claiming any tenant, principal and run (X's exact context included). Then X's call must
be as it was: X's token still verifies once."""

from __future__ import annotations

import itertools

import grpc
import pytest
from conftest import make_request, verify_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_roles import HEADER, with_callers

from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import audit_pb2 as aupb
from toolauthz.proto.toolauthz.v1 import audit_pb2_grpc as aupb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc

TENANTS = ("acme", "globex")
CALLERS = [
    {"id": "rt-acme-1", "roles": ["runtime"], "tenants": ["acme"]},
    {"id": "rt-acme-2", "roles": ["runtime"], "tenants": ["acme"]},
    {"id": "rt-globex", "roles": ["runtime"], "tenants": ["globex"]},
    {"id": "rt-all", "roles": ["runtime"], "tenants": ["*"]},
    {"id": "ap-acme", "roles": ["approver"], "tenants": ["acme"]},
    {"id": "ap-all", "roles": ["approver"], "tenants": ["*"]},
    {"id": "au-acme", "roles": ["auditor"], "tenants": ["acme"]},
    {"id": "rt-ap-acme", "roles": ["runtime", "approver"], "tenants": ["acme"]},
    {"id": "all-globex", "roles": ["runtime", "approver", "auditor"], "tenants": ["globex"]},
]
UNLISTED, UNAUTHENTICATED = "stranger", ""
APPROVER_OF = {"acme": "bob", "globex": "gina"}  # a member of the finance group in each tenant
SMALL, LARGE = {"order_id": "ord_1", "amount_cents": 1500}, {"order_id": "ord_1", "amount_cents": 6000}
ACTIONS = ("verify", "outcome", "replay", "get", "get_as_requester", "watch", "decide", "query")


def roles_of(caller: str, tenant: str) -> set[str]:
    return {role for c in CALLERS if c["id"] == caller and ({"*", tenant} & set(c["tenants"]))
            for role in c["roles"]}


def runtimes_of(tenant: str) -> list[str]:
    return [c["id"] for c in CALLERS if "runtime" in roles_of(c["id"], tenant)]


def as_(caller: str) -> tuple[tuple[str, str], ...]:
    return ((HEADER, caller),) if caller else ()


@pytest.fixture
def sidecar(settings, clock):
    yield from with_callers(settings, clock, CALLERS)


@st.composite
def scenarios(draw):
    tenant = draw(st.sampled_from(TENANTS))
    creator = draw(st.sampled_from(runtimes_of(tenant)))
    others = [c["id"] for c in CALLERS if c["id"] != creator] + [UNLISTED, UNAUTHENTICATED]
    return {"tenant": tenant, "creator": creator, "gated": draw(st.booleans()),
            "attacker": draw(st.sampled_from(others)), "action": draw(st.sampled_from(ACTIONS)),
            "claims_tenant": draw(st.sampled_from(TENANTS)), "claims_principal": draw(st.sampled_from(
                ("alice", "mallory"))), "claims_same_run": draw(st.booleans()),
            "verdict": draw(st.sampled_from((apb.APPROVE, apb.REJECT)))}


class Example:
    """One scenario against the shared server: X's call, then Y's one try."""

    counter = itertools.count()

    def __init__(self, channel: grpc.Channel, scenario: dict):
        self.s = scenario
        self.stub, self.desk = pb_grpc.ToolAuthorizerStub(channel), apb_grpc.ApprovalsStub(channel)
        self.audit = aupb_grpc.AuditStub(channel)
        n = next(self.counter)
        self.request = make_request(args=LARGE if scenario["gated"] else SMALL, tenant=scenario["tenant"],
                                    call_id=f"toolu_{n}", request_id=f"run-{n}")
        self.run = f"run-{n}"

    def create(self) -> str:
        """X's call; its token (approved by an approver of the tenant when gated)."""
        s = self.s
        response = self.stub.Authorize(self.request, metadata=as_(s["creator"]), timeout=10)
        self.approval_id, self.decision_id = response.approval_id, response.decision_id
        if not s["gated"]:
            assert response.decision == pb.ALLOW
            return response.token
        assert response.decision == pb.APPROVAL_REQUIRED
        approver = pb.TrustedContext(tenant=s["tenant"], principal=pb.Principal(type="User",
                                                                                id=APPROVER_OF[s["tenant"]]))
        self.desk.DecideApproval(apb.DecideApprovalRequest(approval_id=self.approval_id, approver=approver,
                                                           verdict=apb.APPROVE), metadata=as_("ap-all"), timeout=10)
        return self.owners_token()

    def owners_token(self) -> str:
        mine = apb.GetApprovalRequest(approval_id=self.approval_id, context=self.request.context)
        return self.desk.GetApproval(mine, metadata=as_(self.s["creator"]), timeout=10).token

    def claimed(self) -> pb.TrustedContext:
        s = self.s
        context = pb.TrustedContext()
        context.CopyFrom(self.request.context)
        context.tenant, context.principal.id = s["claims_tenant"], s["claims_principal"]
        context.request_id = self.run if s["claims_same_run"] else f"{self.run}-other"
        return context

    def attack(self, token: str):
        """Y's try; its answer, or the RpcError it got."""
        s, who = self.s, as_(self.s["attacker"])
        context, call = self.claimed(), self.request.call
        try:
            match s["action"]:
                case "verify":
                    return self.stub.Verify(pb.VerifyRequest(token=token, context=context, call=call),
                                            metadata=who, timeout=10)
                case "outcome":
                    return self.stub.ReportOutcome(pb.ReportOutcomeRequest(
                        context=context, call_id=call.call_id, status=pb.CANCELLED), metadata=who, timeout=10)
                case "replay":
                    return self.stub.Authorize(pb.AuthorizeRequest(context=context, call=call), metadata=who,
                                               timeout=10)
                case "get" | "get_as_requester" | "watch" if s["gated"]:
                    asked = apb.GetApprovalRequest(approval_id=self.approval_id)
                    if s["action"] != "get":
                        asked.context.CopyFrom(context)
                    if s["action"] == "watch":
                        return list(self.desk.WatchApproval(asked, metadata=who, timeout=10))
                    return self.desk.GetApproval(asked, metadata=who, timeout=10)
                case "decide" if s["gated"]:
                    approver = pb.TrustedContext(tenant=s["tenant"], principal=pb.Principal(
                        type="User", id=APPROVER_OF[s["tenant"]]))
                    return self.desk.DecideApproval(apb.DecideApprovalRequest(
                        approval_id=self.approval_id, approver=approver, verdict=s["verdict"]),
                        metadata=who, timeout=10)
                case "query":
                    return list(self.audit.QueryDecisions(aupb.QueryDecisionsRequest(call_id=call.call_id),
                                                          metadata=who, timeout=10))
        except grpc.RpcError as exc:
            return exc
        return None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenario=scenarios())
def test_no_caller_acts_on_another_callers_call_beyond_its_role(sidecar, channel, scenario):
    example = Example(channel, scenario)
    token = example.create()
    assert token
    answer = example.attack(token)
    roles = roles_of(scenario["attacker"], scenario["tenant"])
    entry = sidecar.ledger.get(scenario["tenant"], example.request.call.call_id)
    # Nothing of X's call was consumed or closed by Y.
    assert (entry.caller, entry.verified_jti, entry.outcome) == (scenario["creator"], "", "")
    match scenario["action"]:
        case "verify":
            assert isinstance(answer, grpc.RpcError) or not answer.valid
        case "outcome":
            assert isinstance(answer, grpc.RpcError)
        case "replay":  # refused, or a call of Y's own in another tenant, where the call id is free
            assert isinstance(answer, grpc.RpcError) or (
                scenario["claims_tenant"] != scenario["tenant"] and not answer.replayed
                and answer.decision_id != example.decision_id)
        case "get" | "get_as_requester" | "watch" if scenario["gated"]:
            seen = answer if isinstance(answer, list) else [answer]
            if not isinstance(answer, grpc.RpcError):
                assert "approver" in roles and all(a.token == "" for a in seen)
        case "decide" if scenario["gated"]:
            if not isinstance(answer, grpc.RpcError):
                assert "approver" in roles and answer.token == ""
        case "query":
            if not isinstance(answer, grpc.RpcError) and answer:
                assert "auditor" in roles
    if scenario["gated"]:  # approved is final: Y's decision changed nothing, and the token is X's alone
        token = example.owners_token()
    verified = example.stub.Verify(verify_request(example.request, token), metadata=as_(scenario["creator"]),
                                   timeout=10)
    assert verified.code == "ok"
