"""The caller in audit records, and audit trails written before records had one."""

from __future__ import annotations

import sqlite3

from conftest import make_request

from toolauthz.audit.store import AuditQuery
from toolauthz.cli.main import main
from toolauthz.service.common import proposed_call, trusted_context


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
    from toolauthz.server.build import build_sidecar

    car = build_sidecar(settings, clock=clock)
    for i in range(3):
        authorize(car, f"toolu_old_{i}")  # no caller: the records hash as an older version hashed them
    car.close()
    drop_caller_column(settings.database_path)

    data_dir = ["audit", "--data-dir", str(settings.data_dir)]
    assert main([*data_dir, "verify"]) == 0
    # 3 calls and the bundle loaded at start-up (kind `bundle`, tenant `_system`).
    assert "ok: 4 records in 3 chains, 1 checkpoints" in capsys.readouterr().out
    car = build_sidecar(settings, clock=clock)
    authorize(car, "toolu_new", caller="spiffe://acme.example/agent")
    [new] = car.audit_log.query(AuditQuery(call_id="toolu_new"), limit=5)
    assert new.event.caller == "spiffe://acme.example/agent"
    assert {r.event.caller for r in car.audit_log.query(AuditQuery(), limit=10)} == {"", new.event.caller}
    car.close()
    assert main([*data_dir, "verify"]) == 0


def test_editing_the_caller_of_a_record_is_found(settings, clock, capsys):
    from toolauthz.server.build import build_sidecar

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


def test_verify_of_a_store_elsewhere_says_how_to_pass_the_public_key(settings, clock, capsys, tmp_path, monkeypatch):
    from toolauthz.server.build import build_sidecar
    from toolauthz.tokens.keys import load_private_key_file

    car = build_sidecar(settings, clock=clock)
    authorize(car, "toolu_1")
    car.close()  # signs the final checkpoint
    store = ["audit", "--store", f"sqlite:///{settings.database_path}", "verify"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no `.toolauthz/audit-key.pem` here, as on an auditor's machine
    assert main(store) != 0
    said = capsys.readouterr().err
    assert "--public-key FILE" in said and "PASERK k4.public" in said and ".toolauthz/audit-key.pem" in said
    public = elsewhere / "audit-public.paserk"
    public.write_text(load_private_key_file(settings.audit_key_file).public_key.to_paserk())
    assert main([*store, "--public-key", str(public)]) == 0
    assert "ok: 2 records in 2 chains, 1 checkpoints" in capsys.readouterr().out  # the call and the start-up
    assert main([*store, "--public-key", "missing.paserk"]) != 0
    assert "the public key file `missing.paserk` does not exist" in capsys.readouterr().err
