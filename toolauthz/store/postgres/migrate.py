"""Creating and upgrading the PostgreSQL schema, and checking it before serving."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from toolauthz.errors import StoreUnavailable
from toolauthz.store.postgres.schema import MIGRATION_LOCK, MIGRATIONS, SCHEMA_VERSION, event_columns, grant_serving
from toolauthz.store.postgres.unit import shown_url

MIGRATE_COMMAND = "toolauthz store migrate --store URL"


@dataclass(frozen=True)
class Migrated:
    before: int  # 0: the database had no toolauthz schema
    after: int
    serving_role: str = ""


def schema_version(conn: psycopg.Connection[Any]) -> int:
    """The version recorded in the connection's schema; 0 when there is none."""
    row = conn.execute("SELECT to_regclass('toolauthz_schema') IS NOT NULL").fetchone()
    if row is None or not row[0]:
        return 0
    version = conn.execute("SELECT version FROM toolauthz_schema").fetchone()
    return int(version[0]) if version else 0


def migrate(url: str, *, serving_role: str = "") -> Migrated:
    """Brings the schema to SCHEMA_VERSION in one transaction (all steps or none), under
    the migration lock, so that replicas or operators migrating at once apply each step
    once; idempotent. With `serving_role`, grants it what serving needs and no more:
    SELECT and INSERT on the audit tables (no UPDATE, DELETE or TRUNCATE). Refuses a
    schema newer than this code."""
    try:
        with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            before = schema_version(conn)
            if before > SCHEMA_VERSION:
                raise StoreUnavailable(f"database `{shown_url(url)}` has schema version {before}, newer than this "
                                       f"toolauthz ({SCHEMA_VERSION}): upgrade toolauthz")
            if before == 0:
                conn.execute("CREATE TABLE IF NOT EXISTS toolauthz_schema (version INTEGER NOT NULL)")
                conn.execute("INSERT INTO toolauthz_schema (version) VALUES (0)")
            for version, statements in MIGRATIONS:
                if version > before:
                    conn.execute(statements)  # several statements: sent as one simple query
            for statement in event_columns():
                conn.execute(statement)
            conn.execute("UPDATE toolauthz_schema SET version = %s", (SCHEMA_VERSION,))
            if serving_role:
                schema = conn.execute("SELECT current_schema()").fetchone()
                assert schema is not None
                for statement in grant_serving("{role}", "{schema}"):
                    conn.execute(sql.SQL(statement).format(role=sql.Identifier(serving_role),
                                                           schema=sql.Identifier(schema[0])))
    except psycopg.Error as exc:
        raise StoreUnavailable(f"database `{shown_url(url)}`: migration failed: {exc}") from exc
    return Migrated(before, SCHEMA_VERSION, serving_role)


def check_schema(url: str, *, timeout: float = 5.0) -> None:
    """Serving needs the schema this code writes: a newer one is refused (this code
    would not know its rules), an older or missing one too, naming the command that
    upgrades it."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(timeout))) as conn:
            version = schema_version(conn)
    except psycopg.Error as exc:
        raise StoreUnavailable(f"database `{shown_url(url)}`: cannot read the schema version: {exc}") from exc
    if version > SCHEMA_VERSION:
        raise StoreUnavailable(f"database `{shown_url(url)}` has schema version {version}, newer than this "
                               f"toolauthz ({SCHEMA_VERSION}): upgrade toolauthz before serving from it")
    if version < SCHEMA_VERSION:
        found = f"schema version {version}" if version else "no toolauthz schema"
        raise StoreUnavailable(f"database `{shown_url(url)}` has {found}; this toolauthz needs version "
                               f"{SCHEMA_VERSION}: run `{MIGRATE_COMMAND}` (or serve with --migrate)")
