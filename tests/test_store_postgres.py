"""The PostgreSQL store: choosing it, its migrations, the serving role's privileges, and
failing closed when the database goes away. (The behaviour shared with SQLite is tested
on both backends through the `store` fixture.)"""

from __future__ import annotations

import secrets

import psycopg
import pytest

from sidecar.audit.records import AuditEvent
from sidecar.errors import StoreUnavailable, ToolAuthzError
from sidecar.server.config import Settings, load_settings
from sidecar.store.open import migrate_store, open_store, parse_store_url
from sidecar.store.postgres import migrate
from sidecar.store.postgres.schema import SCHEMA_VERSION


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
    from sidecar.cli.main import main

    assert main(["store", "migrate", "--store", postgres_url]) == 0
    assert "schema version 1 (created)" in capsys.readouterr().out
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
        from sidecar.store.ledger import CallEntry

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
