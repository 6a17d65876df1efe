"""Entity tenancy: a static entity of one tenant is invisible to another tenant's requests,
every principal and resource is inside its request's tenant, the runtime's entities are
checked as Cedar reads them, and the runtime cannot make anyone a member of a static group."""

from __future__ import annotations

import json

import grpc
import pytest
from conftest import make_request, order_entity

import toolauthz.engine as engine
from toolauthz.audit.store import AuditQuery
from toolauthz.bundle import load_bundle
from toolauthz.cli.main import main
from toolauthz.errors import BundleError, RequestError
from toolauthz.model import Decision, Principal, ProposedCall, TrustedContext
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb


def tenant(name: str) -> dict:
    return {"type": "Tenant", "id": name}


def group(name: str) -> dict:
    return {"type": "Group", "id": name}


def entity(kind: str, name: str, *parents: dict, **attrs) -> dict:
    return {"uid": {"type": kind, "id": name}, "attrs": attrs, "parents": list(parents)}


# finance and staff are shared (no tenant); ops is acme's. bob is acme's finance member,
# gina globex's. sam is a static user whose only group has no tenant. ord_g is globex's.
ENTITIES = [
    entity("Tenant", "acme"), entity("Tenant", "globex"),
    entity("Group", "finance"), entity("Group", "staff"), entity("Group", "ops", tenant("acme")),
    entity("User", "bob", group("finance"), tenant("acme")),
    entity("User", "gina", group("finance"), tenant("globex")),
    entity("User", "sam", group("staff")),
    entity("Tool", "measure_runtime"),
    entity("Order", "ord_g", tenant("globex"), owner={"__entity": {"type": "User", "id": "alice"}},
           refundable_cents=100),
]
ORDERS = """
@id("finance-looks-up") permit (principal in Group::"finance", action == Action::"tool:lookup_order", resource);
@id("ops-looks-up") permit (principal in Group::"ops", action == Action::"tool:lookup_order", resource);
@id("own-order") permit (principal, action == Action::"tool:lookup_order", resource)
when { resource has owner && resource.owner == principal };
"""
MEASUREMENTS = """
@id("acme-measures") permit (principal, action == Action::"tool:measure_runtime", resource)
when { principal in Tenant::"acme" && resource in Tenant::"acme" };
"""
LOOKUP = b'{"order_id":"ord_1"}'
MEASURE = b'{"prototype":"A","metric":"runtime","unit":"hours"}'


@pytest.fixture
def tenancy_files(bundle_dir):
    (bundle_dir / "entities.json").write_text(json.dumps(ENTITIES))
    (bundle_dir / "orders.cedar").write_text(ORDERS)
    (bundle_dir / "measurements.cedar").write_text(MEASUREMENTS)
    return bundle_dir


@pytest.fixture
def settings(settings, tenancy_files):
    return settings  # the sidecar of this module serves the bundle above


@pytest.fixture
def bundle(tenancy_files):
    return load_bundle(tenancy_files)


def decide(bundle, tenant_id: str, principal: str, call: bytes = LOOKUP, entities: list | None = None,
           tool: str = "lookup_order") -> Decision:
    raw = json.dumps(entities).encode() if entities is not None else b""
    ctx = TrustedContext(tenant_id, Principal("User", principal), "run", raw)
    return engine.decide(bundle, ctx, ProposedCall("c1", tool, call)).decision


def member(name: str, *parents: dict) -> dict:
    return {"uid": {"type": "User", "id": name}, "attrs": {}, "parents": list(parents)}


# -- item 1: static entities of one tenant never reach another's requests -------------

def test_a_static_user_of_one_tenant_is_a_stranger_in_another(bundle):
    assert decide(bundle, "acme", "bob") is Decision.ALLOW  # acme's bob is in finance
    assert decide(bundle, "globex", "bob") is Decision.DENY  # globex's bob is not acme's bob
    assert decide(bundle, "globex", "gina") is Decision.ALLOW  # a shared group, globex's member
    assert decide(bundle, "acme", "gina") is Decision.DENY


def test_cached_entity_sets_stay_with_their_tenant(bundle):
    for _round in range(2):  # the second round is answered from the caches
        assert [decide(bundle, t, "bob") for t in ("acme", "globex", "acme")] == \
            [Decision.ALLOW, Decision.DENY, Decision.ALLOW]
    assert {key[0] for key in bundle.anchored_entities} == {"acme", "globex"}


@pytest.mark.parametrize("parent", [group("ops"), {"__entity": group("ops")}])
def test_a_runtime_entity_cannot_join_another_tenants_group(bundle, parent):
    with pytest.raises(RequestError, match='`User::"mallory"` may not have parent `Group::"ops"`'):
        decide(bundle, "globex", "mallory", entities=[member("mallory", parent)])


# -- item 2: closed static groups ----------------------------------------------------

@pytest.mark.parametrize("tenant_id", ["acme", "globex"])
@pytest.mark.parametrize("parent", [group("finance"), {"__entity": group("finance")}])
def test_a_runtime_entity_cannot_join_a_static_group(bundle, tenant_id, parent):
    with pytest.raises(RequestError, match='may not have parent `Group::"finance"`'):
        decide(bundle, tenant_id, "mallory", entities=[member("mallory", parent)])


def test_a_runtime_entity_cannot_make_a_static_user_a_parent(bundle):
    with pytest.raises(RequestError, match='may not have parent `User::"bob"`'):
        decide(bundle, "acme", "mallory", entities=[member("mallory", {"type": "User", "id": "bob"})])


def test_runtime_groups_open_a_visible_group_and_no_other(tenancy_files):
    (tenancy_files / "bundle.yaml").write_text(
        'principal_types: [User]\nruntime_groups: [Group::"finance", Group::"ops"]\n')
    bundle = load_bundle(tenancy_files)
    assert decide(bundle, "globex", "mallory", entities=[member("mallory", group("finance"))]) is Decision.ALLOW
    assert decide(bundle, "acme", "mallory", entities=[member("mallory", group("ops"))]) is Decision.ALLOW
    with pytest.raises(RequestError, match='may not have parent `Group::"ops"`'):  # ops is acme's
        decide(bundle, "globex", "mallory", entities=[member("mallory", group("ops"))])


@pytest.mark.parametrize("entry, message", [
    ('Group::"nope"', "not an entity of entities.json"),
    ('Tenant::"acme"', "a tenant cannot be a runtime group"),
    ("Group::finance", "must be an entity like"),
    ('"Group::\\"finance\\"\\n"', "must be an entity like"),
    ("{type: Group, id: finance}", "must be an entity like"),
])
def test_runtime_groups_are_validated_at_load(tenancy_files, entry, message):
    (tenancy_files / "bundle.yaml").write_text(f"principal_types: [User]\nruntime_groups: [{entry}]\n")
    with pytest.raises(BundleError, match=message):
        load_bundle(tenancy_files)


# -- item 10: every anchor is inside its tenant --------------------------------------

@pytest.mark.parametrize("principal", ["sam", "bob", "newcomer"])
def test_every_principal_and_resource_is_inside_its_tenant(bundle, principal):
    """sam is static and shared (his only group has no tenant), bob is acme's, newcomer is
    built; the resource Tool::"measure_runtime" is static and shared."""
    assert decide(bundle, "acme", principal, MEASURE, tool="measure_runtime") is Decision.ALLOW
    assert decide(bundle, "globex", principal, MEASURE, tool="measure_runtime") is Decision.DENY


def test_a_supplied_principal_is_inside_its_tenant(bundle):
    described = [member("dora")]
    assert decide(bundle, "acme", "dora", MEASURE, described, tool="measure_runtime") is Decision.ALLOW


def test_another_tenants_static_resource_is_never_an_anchor(bundle):
    """ord_g is globex's order, owned by alice: an acme alice naming it gets an acme
    order of that id that nobody described, not globex's."""
    assert decide(bundle, "globex", "alice", b'{"order_id":"ord_g"}') is Decision.ALLOW
    assert decide(bundle, "acme", "alice", b'{"order_id":"ord_g"}') is Decision.DENY


def test_another_tenants_static_uid_may_be_described_by_this_tenants_runtime(bundle):
    """acme's runtime vouches for its own ord_g: globex's static order of that id is no
    concern of acme's, and refusing it would tell acme that it exists."""
    mine = [order_entity("ord_g", "alice", tenant="acme")]
    assert decide(bundle, "acme", "alice", b'{"order_id":"ord_g"}', mine) is Decision.ALLOW
    with pytest.raises(RequestError, match="may not be supplied by the runtime: the bundle defines it"):
        decide(bundle, "globex", "alice", b'{"order_id":"ord_g"}', [order_entity("ord_g", "alice")])


# -- item 11: entities are checked as Cedar parses them ------------------------------

@pytest.mark.parametrize("parent", [
    {"__entity": tenant("globex")},
    {"type": "Tenant", "id": "acme", "__entity": tenant("globex")},  # Cedar reads the __entity
    {"__expr": 'Tenant::"globex"'},
    {"type": " Tenant", "id": "globex"},
    {"type": "Tenant", "id": "globex", "extra": 1},
])
def test_a_tenant_parent_is_read_as_cedar_reads_it(bundle, parent):
    order = order_entity("ord_1", "alice")
    order["parents"].append(parent)
    with pytest.raises(RequestError):
        decide(bundle, "acme", "alice", entities=[order])


@pytest.mark.parametrize("uid", [
    {"__entity": {"type": "Group", "id": "finance"}},  # a static entity redefined
    {"__entity": tenant("acme")},
    {"type": "Group", "id": "finance", "__entity": {"type": "User", "id": "x"}},
])
def test_a_supplied_uid_is_read_as_cedar_reads_it(bundle, uid):
    with pytest.raises(RequestError):
        decide(bundle, "acme", "alice", entities=[{"uid": uid, "attrs": {}, "parents": []}])


def test_an_attribute_naming_another_tenant_is_refused(bundle):
    order = order_entity("ord_1", "alice")
    order["attrs"]["owner"] = {"__entity": tenant("globex")}
    with pytest.raises(RequestError, match="names another tenant"):
        decide(bundle, "acme", "alice", entities=[order])


def test_the_entity_form_of_a_reference_is_accepted(bundle):
    order = order_entity("ord_1", "alice")
    order["uid"] = {"__entity": order["uid"]}
    order["parents"] = [{"__entity": tenant("acme")}]
    assert decide(bundle, "acme", "alice", entities=[order]) is Decision.ALLOW


# -- the bundle: an entity belongs to one tenant at most ------------------------------

def test_an_entity_in_two_tenants_fails_check(tenancy_files, capsys):
    (tenancy_files / "entities.json").write_text(json.dumps(ENTITIES + [
        entity("Group", "globex-ops", tenant("globex")),
        entity("User", "eve", group("ops"), group("globex-ops")),
    ]))
    with pytest.raises(BundleError, match="entity `User::\"eve\"` belongs to tenants acme, globex"):
        load_bundle(tenancy_files)
    assert main(["check", str(tenancy_files)]) == 1
    assert "belongs to tenants acme, globex" in capsys.readouterr().err


def test_a_tenant_is_neither_a_principal_type_nor_a_resource_type(tenancy_files):
    (tenancy_files / "bundle.yaml").write_text("principal_types: [User, Tenant]\n")
    tool = tenancy_files / "tools" / "lookup_order.yaml"
    tool.write_text(tool.read_text().replace("resource: {type: Order,", "resource: {type: Tenant,"))
    with pytest.raises(BundleError) as info:
        load_bundle(tenancy_files)
    assert "`Tenant` cannot be a principal type" in str(info.value)
    assert "`Tenant` cannot be a resource type" in str(info.value)


# -- the same through the sidecar: Authorize, DecideApproval, the audit trail ---------

def test_authorize_keeps_tenants_apart(stub):
    globex_bob = make_request("lookup_order", {"order_id": "ord_1"}, principal="bob", tenant="globex",
                              entities=[])
    assert stub.Authorize(globex_bob).decision == pb.DENY
    acme_bob = make_request("lookup_order", {"order_id": "ord_1"}, principal="bob", entities=[], call_id="c2")
    assert stub.Authorize(acme_bob).decision == pb.ALLOW


@pytest.mark.parametrize("parent", [group("finance"), {"__entity": group("finance")}])
def test_authorize_refuses_a_runtime_member_of_a_static_group_and_audits_it(stub, sidecar, parent):
    request = make_request("lookup_order", {"order_id": "ord_1"}, principal="mallory",
                           entities=[member("mallory", parent)])
    with pytest.raises(grpc.RpcError) as info:
        stub.Authorize(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert 'User::"mallory"' in info.value.details() and 'Group::"finance"' in info.value.details()
    [record] = sidecar.audit_log.query(AuditQuery(call_id="toolu_1", kind="authorize"), limit=5)
    assert (record.event.result, record.event.error_codes) == ("refused", ("invalid_entities",))
    assert record.event.principal == 'User::"mallory"' and "runtime_groups" in record.event.detail["error"]
    # Nothing but the record was stored: the same call id is still free for another call.
    allowed = make_request("lookup_order", {"order_id": "ord_1"}, principal="bob", entities=[])
    assert stub.Authorize(allowed).decision == pb.ALLOW


def test_authorize_reads_an_entity_form_tenant_parent(stub):
    order = order_entity("ord_1", "alice")
    order["parents"] = [{"__entity": tenant("globex")}]
    with pytest.raises(grpc.RpcError) as info:
        stub.Authorize(make_request(entities=[order]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


LARGE = {"order_id": "ord_1", "amount_cents": 6000}


def pending_approval(stub, tenant_id: str) -> str:
    request = make_request(args=LARGE, tenant=tenant_id, entities=[order_entity("ord_1", "alice")])
    response = stub.Authorize(request)
    assert response.decision == pb.APPROVAL_REQUIRED
    return response.approval_id


def decide_approval(channel, approval_id: str, who: str, tenant_id: str, entities: list | None = None):
    approver = pb.TrustedContext(tenant=tenant_id, principal=pb.Principal(type="User", id=who),
                                 request_id="approval-ui", entities_json=json.dumps(entities or []).encode())
    return apb_grpc.ApprovalsStub(channel).DecideApproval(apb.DecideApprovalRequest(
        approval_id=approval_id, approver=approver, verdict=apb.APPROVE, reason="ok"))


def test_an_approver_named_like_another_tenants_finance_member_is_refused(stub, channel):
    approval_id = pending_approval(stub, "globex")
    with pytest.raises(grpc.RpcError) as info:
        decide_approval(channel, approval_id, "bob", "globex")  # acme's bob is in finance, globex's is not
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert decide_approval(channel, approval_id, "gina", "globex").status == apb.APPROVED


@pytest.mark.parametrize("parent", [group("finance"), {"__entity": group("finance")}])
def test_an_approver_cannot_join_finance_through_the_runtime(stub, channel, sidecar, parent):
    approval_id = pending_approval(stub, "acme")
    with pytest.raises(grpc.RpcError) as info:
        decide_approval(channel, approval_id, "mallory", "acme", [member("mallory", parent)])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert 'Group::"finance"' in info.value.details()
    [record] = sidecar.audit_log.query(AuditQuery(kind="approval"), limit=5)
    assert (record.event.result, record.event.error_codes) == ("refused", ("invalid_entities",))
    assert decide_approval(channel, approval_id, "bob", "acme").status == apb.APPROVED
