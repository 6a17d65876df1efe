"""Impact before deploy: tools that opt in keep their calls' inputs sealed for replay, and
`toolauthz policy impact` re-decides them under the current bundle and a new one."""

from __future__ import annotations

import json
import os

import pytest

from toolauthz.audit.retention import MAX_RETAINED_BYTES, RetainedCall, RetentionError, seal, unseal
from toolauthz.audit.store import AuditQuery
from toolauthz.bundle import load_bundle
from toolauthz.cli.impact import REFUSED, Outcome, Report, changes, redecide
from toolauthz.cli.main import main as cli
from toolauthz.engine import RunCounts, decide
from toolauthz.errors import BundleError, KeyFileError
from toolauthz.model import Principal, ProposedCall, TrustedContext
from toolauthz.store import retained as retained_module
from toolauthz.store.retained import RetainedInputs, RetainedRow

KEY = bytes(range(32))
DAY = 86400.0


def retaining(bundle_dir, period: str = "7d"):
    path = bundle_dir / "tools" / "issue_refund.yaml"
    path.write_text(path.read_text().replace("audit:\n", f"audit:\n  retain_input: {period}\n"))
    return bundle_dir


def order(order_id: str, owner: str, refundable: int) -> dict:
    return {"uid": {"type": "Order", "id": order_id},
            "attrs": {"owner": {"__entity": {"type": "User", "id": owner}}, "refundable_cents": refundable},
            "parents": []}


def call(i: int) -> RetainedCall:
    """A spread of refunds: amounts across both thresholds, own and others' orders."""
    owner = "alice" if i % 5 else "carol"
    amount = 500 + (i * 37) % 9000
    body = {"order_id": f"ord_{i}", "amount_cents": amount}
    return RetainedCall("acme", f"call-{i}", "issue_refund", "User", "alice", f"run-{i // 3}",
                        json.dumps(body, separators=(",", ":")).encode(),
                        json.dumps([order(f"ord_{i}", owner, 8000)]).encode(), i % 3, i % 2)


def fill(store: RetainedInputs, count: int, now: float) -> None:
    for i in range(count):
        store.put(RetainedRow("acme", f"call-{i}", "issue_refund", now - i, now + DAY, "v", seal(KEY, call(i))))


@pytest.mark.parametrize("period, ok", [("7d", True), ("12h", True), ("90d", True), ("91d", False),
                                        ("forever", False), ("0d", False), (7, False)])
def test_retain_input_is_a_bounded_duration(bundle_dir, period, ok):
    path = bundle_dir / "tools" / "issue_refund.yaml"
    path.write_text(path.read_text().replace("audit:\n", f"audit:\n  retain_input: {json.dumps(period)}\n"))
    if ok:
        assert load_bundle(bundle_dir).tools["issue_refund"].tool.retain_input_seconds > 0
    else:
        with pytest.raises(BundleError, match="retain_input"):
            load_bundle(bundle_dir)


def test_a_sealed_input_opens_only_for_its_tenant_call_and_tool():
    sealed = seal(KEY, call(1))
    assert unseal(KEY, "acme", "call-1", "issue_refund", sealed) == call(1)
    for tenant, call_id, tool in (("globex", "call-1", "issue_refund"), ("acme", "call-2", "issue_refund"),
                                  ("acme", "call-1", "lookup_order")):
        with pytest.raises(RetentionError):
            unseal(KEY, tenant, call_id, tool, sealed)
    with pytest.raises(RetentionError):
        unseal(bytes(32), "acme", "call-1", "issue_refund", sealed)
    assert b"ord_1" not in sealed and b"alice" not in sealed


def test_an_input_over_the_limit_is_not_retained():
    big = RetainedCall("acme", "c", "t", "User", "alice", "r", b"{}", b"[" + b" " * MAX_RETAINED_BYTES + b"]", 0, 0)
    assert seal(KEY, big) is None
    with pytest.raises(RetentionError):
        unseal(KEY, "acme", "c", "t", b"x" * (MAX_RETAINED_BYTES + 1))


def test_the_sidecar_retains_sealed_inputs_and_deletes_them_when_retention_ends(tmp_path, bundle_dir, clock):
    from toolauthz.server.build import build_sidecar
    from toolauthz.server.config import Settings

    retaining(bundle_dir, "1d")
    settings = Settings(bundle=bundle_dir, data_dir=tmp_path / "data", listen="127.0.0.1:0",
                        audit={"checkpoint_interval_seconds": 3600}, reload_poll_seconds=0)
    car = build_sidecar(settings, clock=clock)
    try:
        assert os.stat(settings.retention_key_file).st_mode & 0o777 == 0o600
        ctx = TrustedContext("acme", Principal("User", "alice"), "run-1",
                             json.dumps([order("ord_a1", "alice", 9000)]).encode())
        secret = "the customer's private note"
        body = {"order_id": "ord_a1", "amount_cents": 700, "reason": secret}
        result = car.authorizer.authorize(ctx, ProposedCall("c1", "issue_refund", json.dumps(body).encode()))
        assert result.decision.value == "ALLOW"
        car.authorizer.authorize(ctx, ProposedCall("c2", "measure_runtime",  # not retained: no opt-in
                                                   b'{"prototype":"A","metric":"runtime","unit":"hours"}'))
        store = car.authorizer.retainer.store
        [row] = list(store.stream(since=0, now=clock.now()))
        assert (row.tenant, row.call_id, row.tool) == ("acme", "c1", "issue_refund")
        database = settings.database_path.read_bytes()
        assert secret.encode() not in database and secret.encode() not in row.sealed
        kept = unseal(settings.retention_key_file.read_bytes(), "acme", "c1", "issue_refund", row.sealed)
        assert json.loads(kept.input_json)["reason"] == secret and kept.request_id == "run-1"
        [record] = car.audit_log.query(AuditQuery(call_id="c1"), limit=2)
        assert secret not in json.dumps(record.event.fields) + json.dumps(record.event.detail)
        # Past its retention a row is never read, and the next write deletes it.
        clock.advance(DAY + 1)
        assert list(store.stream(since=0, now=clock.now())) == []
        car.authorizer.authorize(ctx, ProposedCall("c3", "issue_refund", json.dumps(body).encode()))
        assert [r.call_id for r in store.stream(since=0, now=clock.now())] == ["c3"] and store.count() == 1
    finally:
        car.close()


def test_a_production_sidecar_needs_the_retention_key_when_a_tool_retains(tmp_path, bundle_dir, clock):
    from toolauthz.server.build import build_sidecar
    from toolauthz.server.config import Settings

    retaining(bundle_dir)
    settings = Settings(bundle=bundle_dir, data_dir=tmp_path / "data", listen="127.0.0.1:0",
                        audit={"checkpoint_interval_seconds": 3600}, reload_poll_seconds=0)
    build_sidecar(settings, clock=clock).close()  # development: keys are made
    settings.retention_key_file.unlink()
    production = Settings(**{**settings.model_dump(), "generate_missing_keys": False})
    with pytest.raises(KeyFileError, match="retention key"):
        build_sidecar(production, clock=clock)


def by_hand(base, new, count: int) -> set[str]:
    """The calls whose decision, reasons or group differ, each decided with engine.decide."""
    changed = set()
    for i in range(count):
        c = call(i)
        ctx = TrustedContext(c.tenant, Principal(c.principal_type, c.principal_id), c.request_id, c.entities_json)
        proposed = ProposedCall(c.call_id, c.tool, c.input_json)
        run = RunCounts(c.run_calls, c.run_tool_calls)
        a, b = decide(base, ctx, proposed, run), decide(new, ctx, proposed, run)
        if (a.decision, a.reasons, a.approval_group) != (b.decision, b.reasons, b.approval_group):
            changed.add(c.call_id)
    return changed


@pytest.fixture
def tightened(bundle_dir, tmp_path):
    """NEW: the small-refund permit tightened from 5000 to 3000 (the large one unchanged)."""
    import shutil

    new = tmp_path / "new"
    shutil.copytree(bundle_dir, new)
    refunds = new / "refunds.cedar"
    refunds.write_text(refunds.read_text().replace("amount_cents <= 5000", "amount_cents <= 3000"))
    return load_bundle(bundle_dir), load_bundle(new), new


def test_impact_reports_exactly_the_calls_that_deciding_by_hand_finds_changed(tmp_path, tightened, monkeypatch):
    base, new, _ = tightened
    count = 3000
    monkeypatch.setattr(retained_module, "PAGE", 250)  # several pages
    store = RetainedInputs(f"sqlite:///{tmp_path / 'store.db'}")
    fill(store, count, now=10_000.0)
    pages: list[int] = []
    real_run = store._run
    monkeypatch.setattr(store, "_run", lambda *a: (lambda rows: pages.append(len(rows)) or rows)(real_run(*a)))
    report = Report(max_examples=5)
    found = set()
    for row, change in changes(base, new, store.stream(since=0, now=10_000.0), KEY):
        report.add(row, change)
        if change is not None:
            found.add(change.call_id)
    expected = by_hand(base, new, count)
    assert expected and found == expected and report.changed == len(expected) and report.total == count
    # every change is the tightened permit: ALLOW under it becomes nothing-permits DENY
    assert report.by_policy == {"refund-own-order-small": len(expected)}
    assert report.transitions == {"ALLOW -> DENY": len(expected)}
    # bounded: one page at a time, and only a few examples kept
    assert max(pages) == 250 and len(pages) == count // 250 + 1 and len(report.examples) == 5
    example = report.examples[0].to_dict()
    assert set(example["fields"]) == {"/order_id", "/amount_cents"}  # audit.record fields only


def test_a_row_that_does_not_open_is_skipped_and_counted(tmp_path, tightened):
    base, new, _ = tightened
    store = RetainedInputs(f"sqlite:///{tmp_path / 'store.db'}")
    store.put(RetainedRow("globex", "call-1", "issue_refund", 1.0, 10.0, "v", seal(KEY, call(1))))  # moved row
    report = Report()
    for row, change in changes(base, new, store.stream(since=0, now=5.0), KEY, report.unreadable):
        report.add(row, change)
    assert report.total == 0 and sum(report.unreadable.values()) == 1


def test_a_request_the_sidecar_would_refuse_is_an_outcome_not_a_crash(tightened):
    base, _, _ = tightened
    c = call(1)
    refused = RetainedCall(c.tenant, c.call_id, c.tool, c.principal_type, c.principal_id, c.request_id,
                           c.input_json, b'[{"uid": {"type": "Tenant", "id": "acme"}, "attrs": {}, "parents": []}]',
                           0, 0)
    assert redecide(base, "acme", "call-1", "issue_refund", refused) == Outcome(REFUSED, (), "")


def test_the_cli_prints_counts_and_examples_as_text_json_and_junit(tmp_path, tightened, capsys):
    import time
    import xml.etree.ElementTree as ET

    base, _, new_dir = tightened
    data = tmp_path / "data"
    data.mkdir()
    key_file = data / "retention-key"
    key_file.write_bytes(KEY)
    key_file.chmod(0o600)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = RetainedInputs(url)
    fill(store, 200, now=time.time())
    store.close()
    expected = len(by_hand(base, load_bundle(new_dir), 200))
    common = ["policy", "impact", "--bundle", str(new_dir), "--base", str(base.directory), "--store", url,
              "--key", str(key_file)]
    assert cli(common) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"{expected} of 200 retained calls change"
    assert f"{expected:8d}  refund-own-order-small" in out and "ALLOW -> DENY" in out
    assert cli([*common, "--format", "json", "--junit", str(tmp_path / "impact.xml"), "--fail-on-change"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert (report["total"], report["changed"]) == (200, expected)
    junit = ET.parse(tmp_path / "impact.xml").getroot()
    assert junit.find(".//testcase[@name='issue_refund']/failure").get("message") == \
        f"{expected} of 200 calls change"
    assert cli([*common, "--tenant", "globex"]) == 0
    assert capsys.readouterr().out.startswith("0 of 0 retained calls change")
    assert cli([*common, "--since", "soon"]) == 1
    assert "--since takes a duration" in capsys.readouterr().err


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)
def test_the_retained_inputs_table_in_both_stores(store_url):
    store = RetainedInputs(store_url)
    try:
        fill(store, 5, now=100.0)
        store.put(RetainedRow("acme", "call-0", "issue_refund", 0.0, 1.0, "v", b"again"))  # first one kept
        rows = list(store.stream(since=0, now=100.0))
        assert [r.call_id for r in rows] == [f"call-{i}" for i in (4, 3, 2, 1, 0)]
        assert unseal(KEY, "acme", "call-0", "issue_refund", rows[-1].sealed) == call(0)
        assert [r.call_id for r in store.stream(since=0, now=100.0, tenant="globex")] == []
        assert store.purge(100.0 + DAY) == 5 and store.count() == 0
    finally:
        store.close()


def test_an_example_shows_model_written_values_escaped():
    from toolauthz.cli.impact import Change

    report = Report()
    change = Change("acme", "c\nforged", "issue_refund", 1.0, Outcome("ALLOW", ("p",), ""),
                    Outcome("DENY", (), ""), {"/note": "\x1b[8mhidden\u202e"})
    report.add(RetainedRow("acme", "c", "issue_refund", 1.0, 2.0, "v", b""), change)
    text = report.text()
    assert "\x1b" not in text and "\u202e" not in text and "\nforged" not in text
    assert '/note="\\u001b[8mhidden\\u202e"' in text and "c\\nforged" in text


def test_the_impact_bench_runs_and_counts_the_tightened_calls():
    from bench.impact import run

    figures = run(200)  # amounts pass 3000 from the 68th call on
    assert figures["calls"] == 200 and 0 < figures["changed"] < 200
    assert figures["peak_rss_mb_after_replay"] >= figures["peak_rss_mb_before_replay"] > 0


def test_impact_decides_again_on_the_meter_values_the_call_saw(bundle_dir, tmp_path):
    """A call allowed when 498,500 of the 500,000 daily budget were spent: a new bundle
    that lowers the budget to 499,000 denies it on replay, which it could only know from the
    meter value the call was decided on."""
    import shutil

    c = call(1)
    near = RetainedCall(c.tenant, c.call_id, c.tool, c.principal_type, c.principal_id, c.request_id,
                        json.dumps({"order_id": "ord_1", "amount_cents": 1500}).encode(), c.entities_json, 0, 0,
                        {"refund_cents_24h": 498_500})
    assert unseal(KEY, c.tenant, c.call_id, c.tool, seal(KEY, near)).usage == {"refund_cents_24h": 498_500}
    new_dir = tmp_path / "lower-budget"
    shutil.copytree(bundle_dir, new_dir)
    refunds = new_dir / "refunds.cedar"
    refunds.write_text(refunds.read_text().replace("> 500000 }", "> 499000 }"))
    base, new = load_bundle(bundle_dir), load_bundle(new_dir)
    before = redecide(base, near.tenant, near.call_id, near.tool, near)
    after = redecide(new, near.tenant, near.call_id, near.tool, near)
    assert (before.decision, after.decision, after.reasons) == ("ALLOW", "DENY", ("refund-daily-budget",))
