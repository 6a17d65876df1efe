"""The PostgreSQL store: choosing it, its migrations, the serving role's privileges, and
failing closed when the database goes away. (The behaviour shared with SQLite is tested
on both backends through the `store` fixture.)"""

from __future__ import annotations

import secrets

import psycopg
import pytest

from toolauthz.audit.records import AuditEvent
from toolauthz.errors import StoreUnavailable, ToolAuthzError
from toolauthz.server.config import Settings, load_settings
from toolauthz.store.open import migrate_store, open_store, parse_store_url
from toolauthz.store.postgres import migrate
from toolauthz.store.postgres.schema import SCHEMA_VERSION


def event(i: int) -> AuditEvent:
    return AuditEvent(kind="authorize", time=float(i), call_id=f"c{i}", tenant="acme", result="ALLOW")


def test_the_store_is_chosen_by_url_flag_file_or_environment(tmp_path, monkeypatch):
    assert Settings(data_dir=tmp_path).store_url == f"sqlite://{(tmp_path / 'toolauthz.db').absolute()}"
    config = tmp_path / "toolauthz.yaml"
    config.write_text("store: postgresql://db.example/toolauthz\nstore_pool_size: 4\n")
    assert load_settings(config).store_url == "postgresql://db.example/toolauthz"
    monkeypatch.setenv("TOOLAUTHZ_STORE", "sqlite:///var/lib/toolauthz/x.db")
    assert load_settings(config).store_url == "sqlite:///var/lib/toolauthz/x.db"
    assert load_settings(config, store="postgresql://other/db").store_url == "postgresql://other/db"
    with pytest.raises(ToolAuthzError, match="store"):
        load_settings(store="mysql://nope")
    assert parse_store_url("sqlite:///a/b.db").path == "/a/b.db"


def test_migrate_creates_the_schema_once_and_is_idempotent(postgres_url):
    assert migrate_store(postgres_url) == (0, SCHEMA_VERSION)
    assert migrate_store(postgres_url) == (SCHEMA_VERSION, SCHEMA_VERSION)
    with open_store(postgres_url) as store:
        assert store.audit_log.append([event(1)])[0].seq == 1


def test_serving_refuses_a_missing_schema_naming_the_command(postgres_url):
    with pytest.raises(StoreUnavailable, match="no toolauthz schema.*toolauthz store migrate --store URL"):
        open_store(postgres_url)
    open_store(postgres_url, migrate=True).close()  # serve --migrate makes it first
    open_store(postgres_url).close()


def test_serving_refuses_a_newer_schema(postgres_url):
    migrate(postgres_url)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE toolauthz_schema SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreUnavailable, match="newer than this toolauthz"):
        open_store(postgres_url)
    with pytest.raises(StoreUnavailable, match="newer than this toolauthz"):
        open_store(postgres_url, migrate=True)


def test_the_cli_migrates_and_serve_takes_the_store(postgres_url, capsys):
    from toolauthz.cli.main import main

    assert main(["store", "migrate", "--store", postgres_url]) == 0
    assert f"schema version {SCHEMA_VERSION} (created)" in capsys.readouterr().out
    assert main(["store", "--store", postgres_url, "migrate"]) == 0
    assert "already current" in capsys.readouterr().out


@pytest.fixture
def serving_role(postgres_database):
    """A login role of its own, dropped at the end (roles belong to the whole server)."""
    role = f"toolauthz_serving_{secrets.token_hex(4)}"
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
    yield role
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute(f'DROP OWNED BY "{role}"')
        conn.execute(f'DROP ROLE "{role}"')


def as_role(url: str, role: str) -> str:
    return url.replace("postgresql://postgres@", f"postgresql://{role}@", 1)


def test_the_serving_role_appends_to_the_trail_and_cannot_edit_it(postgres_url, serving_role):
    migrate(postgres_url, serving_role=serving_role)
    served = as_role(postgres_url, serving_role)
    with open_store(served) as store:  # serves: the ledger, approvals and appends work
        from toolauthz.store.ledger import CallEntry

        store.ledger.reserve(CallEntry("acme", "c1", "run", "t", "d" * 64, 'User::"a"', 1.0))
        assert store.ledger.consume("acme", "c1", "jti", 2.0) == "ok"
        store.audit_log.append([event(1), event(2)])
    with psycopg.connect(served, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM audit_record").fetchone() == (2,)
        for statement in ("UPDATE audit_record SET result = 'DENY'", "DELETE FROM audit_record",
                          "TRUNCATE audit_record", "UPDATE audit_checkpoint SET count = 0",
                          "DELETE FROM audit_checkpoint"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # the owner's mistakes: the triggers
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            conn.execute("UPDATE audit_record SET result = 'DENY'")
        assert conn.execute("SELECT count(*) FROM audit_record").fetchone() == (2,)


def test_an_unreachable_database_is_store_unavailable_and_never_an_answer(postgres_url):
    migrate(postgres_url)
    closed_port = postgres_url.replace("127.0.0.1:5432", "127.0.0.1:1", 1)
    with pytest.raises(StoreUnavailable, match="cannot read the schema version"):
        open_store(closed_port)


def test_the_prune_command_refuses_recent_dates_and_prunes_old_ones(store_url, capsys):
    from toolauthz.cli.main import main

    assert main(["store", "prune", "--store", store_url, "--before", "2999-01-01"]) == 1
    assert "at least an hour ago" in capsys.readouterr().err
    assert main(["store", "prune", "--store", store_url, "--before", "2020-01-01", "--batch", "10"]) == 0
    assert "removed the ledger rows of 0 ended calls" in capsys.readouterr().out


def owner_sql(store_url: str, statements: list[tuple[str, tuple]]) -> None:
    """What the owner of the database (or of the file) can do, triggers out of the way."""
    if store_url.startswith("sqlite://"):
        import sqlite3

        conn = sqlite3.connect(store_url[len("sqlite://"):], isolation_level=None)
        conn.execute("DROP TRIGGER IF EXISTS audit_record_no_update")
        for sql, params in statements:
            conn.execute(sql.replace("%s", "?"), params)
        conn.close()
        return
    with psycopg.connect(store_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE audit_record DISABLE TRIGGER USER")
        conn.execute("ALTER TABLE audit_checkpoint DISABLE TRIGGER USER")
        for sql, params in statements:
            conn.execute(sql, params)


def test_audit_verify_covers_the_store_and_exported_checkpoints_outlive_a_rewrite(store_url, tmp_path, capsys):
    """An edit is named; a writer holding the database and the audit key who re-hashes
    the chains and re-signs the stored checkpoints passes `verify` against the store, but
    not against the checkpoints exported before."""
    from conftest import key_pair

    from toolauthz.audit.checkpoint import sign_heads
    from toolauthz.audit.merkle import ChainHead
    from toolauthz.audit.records import GENESIS_HASH, chain
    from toolauthz.cli.main import main

    private, public = key_pair()
    key_file = tmp_path / "audit.pub"
    key_file.write_text(public.to_paserk())
    with open_store(store_url) as store:
        store.audit_log.append([event(i) for i in range(1, 4)])
        signed = sign_heads(store.audit_log.heads(), 10.0, private, "k1")
        store.audit_log.add_checkpoint(signed.token, signed)
    base = ["audit", "--store", store_url]
    assert main([*base, "verify", "--public-key", str(key_file)]) == 0
    assert "ok: 3 records in" in capsys.readouterr().out
    exported = tmp_path / "checkpoints.txt"
    assert main([*base, "checkpoints", "--out", str(exported)]) == 0
    assert len(exported.read_text().splitlines()) == 1

    owner_sql(store_url, [("UPDATE audit_record SET result = 'DENY' WHERE seq = %s", (2,))])
    assert main([*base, "verify", "--public-key", str(key_file)]) == 1
    assert ": edited: record 1 of chain" in capsys.readouterr().out

    with open_store(store_url) as store:  # the rewrite: every chain re-hashed, the checkpoints re-signed
        records = list(store.audit_log.iter_records())
        statements, heads = [], []
        for name in sorted({r.chain for r in records}):
            own = [r for r in records if r.chain == name]
            rewritten = chain([r.event for r in own], 0, GENESIS_HASH, name)
            statements += [("UPDATE audit_record SET prev_hash = %s, hash = %s WHERE seq = %s",
                             (new.prev_hash, new.hash, old.seq)) for old, new in zip(own, rewritten, strict=True)]
            statements.append(("UPDATE audit_head SET hash = %s WHERE chain = %s", (rewritten[-1].hash, name)))
            heads.append(ChainHead(name, len(own), rewritten[-1].hash))
        owner_sql(store_url, statements + [("DELETE FROM audit_checkpoint", ())])
        others = [h for h in store.audit_log.heads() if h.chain not in {h.chain for h in heads}]
        forged = sign_heads(heads + others, 20.0, private, "k1")
        store.audit_log.add_checkpoint(forged.token, forged)
    assert main([*base, "verify", "--public-key", str(key_file)]) == 0
    capsys.readouterr()
    assert main([*base, "verify", "--public-key", str(key_file), "--checkpoints", str(exported)]) == 1
    assert "checkpoint_mismatch" in capsys.readouterr().out


def undo_version_6(conn) -> None:
    conn.execute("DROP TABLE usage_charges")
    conn.execute("ALTER TABLE approvals DROP COLUMN usage_seen")


def test_a_version_5_database_gains_usage_meters_and_keeps_its_approvals(postgres_url):
    from toolauthz.store.approvals import ApprovalRecord
    from toolauthz.store.ledger import CallEntry, RecordedDecision
    from toolauthz.usage.charges import Charge

    migrate(postgres_url)
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # as version 5 left it
        undo_version_6(conn)
        conn.execute("INSERT INTO approvals (approval_id, tenant, call_id, request_id, requester_type, requester_id, "
                     "tool, resource, group_name, policy_id, digest, short_code, decision_id, policy_version, "
                     "created_at, expires_at, fields, status) VALUES ('a-old', 'acme', 'c-old', 'r', 'User', "
                     "'alice', 't', 'Tool::\"t\"', 'finance', 'p', 'd', 'code', 'dec', 'v', 1, 9e9, '{}', "
                     "'pending')")
        conn.execute("UPDATE toolauthz_schema SET version = 5")
    assert migrate(postgres_url).before == 5
    store = open_store(postgres_url)
    try:
        assert store.approvals.get("a-old").usage == {}
        charge = Charge("spent", '["User::\\"alice\\""]', 700, 3600)
        entry = CallEntry("acme", "c-new", "r", "t", "d", 'User::"alice"', 100.0, charges=(charge,))
        store.ledger.reserve(entry, RecordedDecision("ALLOW", "dec-new", "v"))
        record = ApprovalRecord("a-new", "acme", "c2", "r", "User", "alice", "t", 'Tool::"t"', "finance", "p", "d",
                                "code", "dec2", "v", 100.0, 9e9, usage={"spent": 700})
        store.approvals.create(record)
        assert store.approvals.get("a-new").usage == {"spent": 700}
        [standing] = store.ledger.standing([entry])
        assert standing.usage == (700,)
    finally:
        store.close()


def test_a_version_4_database_gains_retained_inputs_and_bundle_records(postgres_url):
    from toolauthz.store.retained import RetainedInputs, RetainedRow

    migrate(postgres_url)
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # as version 4 left it
        undo_version_6(conn)
        conn.execute("DROP TABLE retained_inputs")
        conn.execute("ALTER TABLE audit_record DROP CONSTRAINT audit_record_kind_check")
        conn.execute("ALTER TABLE audit_record ADD CONSTRAINT audit_record_kind_check "
                     "CHECK (kind IN ('authorize', 'verify', 'approval', 'outcome'))")
        conn.execute("UPDATE toolauthz_schema SET version = 4")
    assert migrate(postgres_url).before == 4
    store = open_store(postgres_url)
    try:
        store.audit_log.append([AuditEvent(kind="bundle", time=1.0, result="loaded")])
    finally:
        store.close()
    retained = RetainedInputs(postgres_url)
    try:
        retained.put(RetainedRow("acme", "c", "t", 1.0, 2.0, "v", b"sealed"))
        assert retained.count() == 1
    finally:
        retained.close()
