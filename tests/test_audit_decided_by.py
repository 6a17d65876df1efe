"""Each decision's audit record names the entities it was made on, and of the entities
the runtime supplied only the attributes the tool's `audit.record_entities` allows."""

from __future__ import annotations

import json
import pathlib

import pytest
from conftest import make_request, order_entity

from toolauthz.audit import AuditQuery
from toolauthz.bundle.catalog import load_catalog
from toolauthz.cli.main import main
from toolauthz.decided_by import MAX_UIDS
from toolauthz.errors import Problem
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.server.config import DATABASE_FILE

SECRET = "4111-1111-1111-1111-SECRET"


@pytest.fixture
def bundle_dir(bundle_dir):
    """The example bundle with an Order attribute nobody allows in the audit."""
    schema = bundle_dir / "schema.cedarschema"
    declared = "refundable_cents: Long,"
    schema.write_text(schema.read_text().replace(declared, declared + "\n  card?: String,\n  big?: Long,"))
    tool = bundle_dir / "tools" / "issue_refund.yaml"
    text = tool.read_text()
    assert "record_entities: {Order: [/owner, /refundable_cents]}" in text
    tool.write_text(text.replace("record_entities: {Order: [/owner, /refundable_cents]}",
                                 "record_entities: {Order: [/refundable_cents, /missing, /big]}"))
    return bundle_dir


def _order_with_card(order_id: str = "ord_1") -> dict:
    entity = order_entity(order_id, "alice")
    entity["attrs"]["card"] = SECRET
    return entity


def _decision(sidecar, call_id: str) -> dict:
    [record] = sidecar.store.audit_log.query(AuditQuery(call_id=call_id, kind="authorize"), limit=10)
    return record.event.detail["decided_by"]


def test_a_decision_records_its_entities_and_only_allowed_attributes(stub, sidecar):
    stub.Authorize(make_request(call_id="call_card", entities=[_order_with_card()]))
    decided = _decision(sidecar, "call_card")
    assert decided["principal"] == ['User::"alice"', 'Tenant::"acme"']
    assert decided["resource"] == ['Order::"ord_1"', 'Tenant::"acme"']
    assert decided["supplied"] == [{"uid": 'Order::"ord_1"', "attrs": {"/refundable_cents": 10000}}]
    assert decided["omitted"] == {"uids": 0, "attributes": 2}  # owner and card: not listed
    database = pathlib.Path(sidecar.settings.data_dir) / DATABASE_FILE
    assert SECRET.encode() not in b"".join(p.read_bytes() for p in database.parent.glob(DATABASE_FILE + "*"))


def test_a_long_past_what_canonical_json_holds_is_left_out_not_a_failed_decision(stub, sidecar):
    order = order_entity("ord_1", "alice")
    order["attrs"]["big"] = 2**60
    assert stub.Authorize(make_request(call_id="call_big", entities=[order])).decision == pb.ALLOW
    decided = _decision(sidecar, "call_big")
    assert decided["supplied"] == [{"uid": 'Order::"ord_1"', "attrs": {"/refundable_cents": 10000}}]
    assert decided["omitted"]["attributes"] == 2  # owner (not listed) and big (listed, not recordable)


def test_a_principal_in_a_static_group_records_its_ancestors(stub, sidecar):
    stub.Authorize(make_request(principal="bob", call_id="call_bob", entities=[order_entity("ord_1", "bob")]))
    decided = _decision(sidecar, "call_bob")
    assert decided["principal"] == ['User::"bob"', 'Group::"finance"', 'Tenant::"acme"']


def test_the_uids_recorded_are_capped_with_a_count(stub, sidecar):
    many = [_order_with_card()] + [order_entity(f"ord_x{i}", "alice") for i in range(MAX_UIDS + 10)]
    stub.Authorize(make_request(call_id="call_many", entities=many))
    decided = _decision(sidecar, "call_many")
    kept = len(decided["principal"]) + len(decided["resource"]) + len(decided["supplied"])
    assert kept == MAX_UIDS
    assert decided["omitted"]["uids"] == 2 + 2 + len(many) - MAX_UIDS


def test_a_uid_too_long_to_read_is_counted_not_kept(stub, sidecar):
    # A runtime names any ids it likes: kept whole, 64 of them could make each decision's
    # record, and its console timeline, a megabyte.
    long_ones = [order_entity("o" * 10_000, "alice"), {"uid": {"type": "Group", "id": "g" * 10_000}, "attrs": {},
                                                       "parents": []}]
    entities = [order_entity("ord_1", "alice"), *long_ones]
    assert stub.Authorize(make_request(call_id="call_long", entities=entities)).decision == pb.ALLOW
    decided = _decision(sidecar, "call_long")
    assert decided["resource"] == ['Order::"ord_1"', 'Tenant::"acme"']
    assert [e["uid"] for e in decided["supplied"]] == ['Order::"ord_1"']
    assert decided["omitted"]["uids"] == 2
    assert len(json.dumps(decided)) < 1000


def test_show_and_export_give_the_entities_escaped(stub, sidecar, capsys):
    stub.Authorize(make_request(call_id="call_card", entities=[_order_with_card()]))
    sidecar.close()
    data = str(sidecar.settings.data_dir)
    assert main(["audit", "--data-dir", data, "show", "call_card"]) == 0
    out = capsys.readouterr().out
    assert 'on principal User::"alice", Tenant::"acme" | resource Order::"ord_1", Tenant::"acme"' in out
    assert '{"/refundable_cents": 10000}' in out and "left out: 2 attributes" in out and SECRET not in out
    assert main(["audit", "--data-dir", data, "export"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    [row] = [r for r in rows if r["kind"] == "authorize"]  # and the bundle loaded at start-up
    assert row["detail"]["decided_by"]["supplied"][0]["attrs"] == {"/refundable_cents": 10000}
    assert main(["audit", "--data-dir", data, "verify"]) == 0  # the chain covers what was recorded


@pytest.mark.parametrize("rules, message", [
    ("record_entities: [Order]", "map entity types"),
    ("record_entities: {'Order x': [/a]}", "not an entity type name"),
    ("record_entities: {Order: [owner]}", "JSON pointers"),
    ("recorded: [/order_id]", "unknown audit rule"),
])
def test_bad_record_entities_rules_are_refused(tmp_path, rules, message):
    tools = tmp_path / "tools"
    tools.mkdir()
    text = (pathlib.Path(__file__).parent.parent / "policies" / "tools" / "issue_refund.yaml").read_text()
    head = text[:text.index("audit:")]
    (tools / "issue_refund.yaml").write_text(head + f"audit:\n  {rules}\n")
    problems: list[Problem] = []
    assert load_catalog(tools, problems) == {}
    assert any(message in p.message for p in problems), problems


def test_record_entities_of_an_undeclared_type_is_refused(bundle_dir):
    from toolauthz.bundle import load_bundle
    from toolauthz.errors import BundleError

    tool = bundle_dir / "tools" / "issue_refund.yaml"
    tool.write_text(tool.read_text().replace("record_entities: {Order:", "record_entities: {Ordr:"))
    with pytest.raises(BundleError) as info:
        load_bundle(bundle_dir)
    assert "audit.record_entities names `Ordr`, which is not declared" in str(info.value)
