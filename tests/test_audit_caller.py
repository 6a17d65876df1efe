"""The caller in audit records, and audit trails written before records had one."""

from __future__ import annotations

import sqlite3

from conftest import make_request

from sidecar.audit.store import AuditQuery
from sidecar.cli.main import main
from sidecar.service.common import proposed_call, trusted_context


def authorize(car, call_id: str, caller: str = "") -> None:
    request = make_request(call_id=call_id)
    car.authorizer.authorize(trusted_context(request.context), proposed_call(request.call), caller=caller)


def drop_caller_column(database) -> None:
    """The audit table as a version without `caller` left it (its rows hashed without one)."""
    conn = sqlite3.connect(database)
    conn.execute("ALTER TABLE audit_record DROP COLUMN caller")
    conn.commit()
    conn.close()


def test_a_trail_written_before_callers_still_verifies_and_continues(settings, clock, capsys):
    from sidecar.server.build import build_sidecar

    car = build_sidecar(settings, clock=clock)
    for i in range(3):
        authorize(car, f"toolu_old_{i}")  # no caller: the records hash as an older version hashed them
    car.close()
    drop_caller_column(settings.database_path)

    data_dir = ["audit", "--data-dir", str(settings.data_dir)]
    assert main([*data_dir, "verify"]) == 0
    assert "ok: 3 records in 3 chains, 1 checkpoints" in capsys.readouterr().out
    car = build_sidecar(settings, clock=clock)
    authorize(car, "toolu_new", caller="spiffe://acme.example/agent")
    [new] = car.audit_log.query(AuditQuery(call_id="toolu_new"), limit=5)
    assert new.event.caller == "spiffe://acme.example/agent"
    assert {r.event.caller for r in car.audit_log.query(AuditQuery(), limit=10)} == {"", new.event.caller}
    car.close()
    assert main([*data_dir, "verify"]) == 0


def test_editing_the_caller_of_a_record_is_found(settings, clock, capsys):
    from sidecar.server.build import build_sidecar

    car = build_sidecar(settings, clock=clock)
    authorize(car, "toolu_1", caller="spiffe://acme.example/agent")
    authorize(car, "toolu_2")
    car.close()
    conn = sqlite3.connect(settings.database_path)
    conn.execute("DROP TRIGGER audit_record_no_update")
    conn.execute("UPDATE audit_record SET caller = 'spiffe://someone/else' WHERE call_id = 'toolu_1'")
    conn.execute("UPDATE audit_record SET caller = 'spiffe://acme.example/agent' WHERE call_id = 'toolu_2'")
    conn.commit()
    conn.close()
    assert main(["audit", "--data-dir", str(settings.data_dir), "verify"]) == 1
    out = capsys.readouterr().out
    assert out.count(": edited: record 1 of chain") == 2  # each call has its chain
