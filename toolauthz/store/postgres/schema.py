"""The PostgreSQL schema, as numbered migrations.

`toolauthz_schema` holds the version. Each migration runs in the migrating transaction,
under one advisory lock (`MIGRATION_LOCK`), so replicas migrating together apply each
step once. The audit tables get one column per AuditEvent field: a field added to the
event gets its column from `_event_columns`, which every migration run applies.
"""

from __future__ import annotations

from toolauthz.audit.records import KINDS
from toolauthz.store.audit_rows import EQUALITY_FILTERS, EVENT_COLUMNS, JSON_COLUMNS
from toolauthz.store.bundle_floor import FLOOR_TABLE
from toolauthz.store.bundle_floor import SCHEMA as FLOOR_SCHEMA
from toolauthz.store.deliveries import DELIVERY_TABLE
from toolauthz.store.deliveries import SCHEMA as DELIVERY_SCHEMA
from toolauthz.store.usage_rows import SCHEMA as USAGE_SCHEMA
from toolauthz.store.usage_rows import USAGE_TABLE

# Taken by a migration (`pg_advisory_xact_lock`), so that two at once apply each step once.
# Serving takes no lock over the whole database (`unit.py`).
MIGRATION_LOCK = 0x746F6F6C617574  # "toolaut"

AUDIT_TABLES = ("audit_record", "audit_checkpoint")
# The chains' heads: rows the serving role updates (under a row lock) as it appends.
HEAD_TABLE = "audit_head"
LEDGER_TABLES = ("calls", "consumed_tokens", "approvals", DELIVERY_TABLE, "retained_inputs", USAGE_TABLE,
                 FLOOR_TABLE)

_V1_LEDGER = """
CREATE TABLE calls (
    tenant TEXT NOT NULL,
    call_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    digest TEXT NOT NULL,
    principal TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    decision TEXT NOT NULL DEFAULT '',
    decision_id TEXT NOT NULL DEFAULT '',
    policy_version TEXT NOT NULL DEFAULT '',
    reasons TEXT NOT NULL DEFAULT '[]',
    errors TEXT NOT NULL DEFAULT '[]',
    approval_id TEXT NOT NULL DEFAULT '',
    verified_jti TEXT NOT NULL DEFAULT '',
    verified_at DOUBLE PRECISION,
    outcome TEXT NOT NULL DEFAULT '',
    outcome_at DOUBLE PRECISION,
    extra TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (tenant, call_id)
);
CREATE INDEX calls_by_run ON calls (tenant, request_id, tool);
CREATE TABLE consumed_tokens (
    jti TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    call_id TEXT NOT NULL,
    consumed_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE approvals (
    approval_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    call_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    requester_type TEXT NOT NULL,
    requester_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    resource TEXT NOT NULL,
    group_name TEXT NOT NULL,
    policy_id TEXT NOT NULL,
    digest TEXT NOT NULL,
    short_code TEXT NOT NULL,
    decision_id TEXT NOT NULL,
    policy_version TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    fields TEXT NOT NULL,
    status TEXT NOT NULL,
    decided_at DOUBLE PRECISION,
    approver TEXT NOT NULL DEFAULT '',
    reason TEXT NOT NULL DEFAULT '',
    token TEXT NOT NULL DEFAULT '',
    token_jti TEXT NOT NULL DEFAULT '',
    token_expires_at DOUBLE PRECISION,
    call_input BYTEA NOT NULL DEFAULT '',
    call_entities BYTEA NOT NULL DEFAULT '',
    run_calls INTEGER NOT NULL DEFAULT 0,
    run_tool_calls INTEGER NOT NULL DEFAULT 0,
    approved_version TEXT NOT NULL DEFAULT ''
);
CREATE INDEX approvals_by_tenant ON approvals (tenant, status, group_name);
"""

_V1_AUDIT = f"""
CREATE TABLE audit_record (
    seq BIGINT PRIMARY KEY CHECK (seq >= 1),
    kind TEXT NOT NULL CHECK (kind IN ({', '.join(f"'{k}'" for k in KINDS)})),
    time DOUBLE PRECISION NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE TABLE audit_checkpoint (
    id BIGSERIAL PRIMARY KEY,
    count BIGINT NOT NULL,
    head_hash TEXT NOT NULL,
    time DOUBLE PRECISION NOT NULL,
    kid TEXT NOT NULL,
    token TEXT NOT NULL
);
-- Stops mistakes, not attackers (an owner can drop a trigger): the chain does that, and
-- the serving role is granted no UPDATE, DELETE or TRUNCATE (`grant_serving`).
CREATE FUNCTION toolauthz_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit records are append-only';
END $$;
CREATE TRIGGER audit_record_no_update BEFORE UPDATE OR DELETE ON audit_record
    FOR EACH ROW EXECUTE FUNCTION toolauthz_append_only();
CREATE TRIGGER audit_record_no_truncate BEFORE TRUNCATE ON audit_record
    FOR EACH STATEMENT EXECUTE FUNCTION toolauthz_append_only();
CREATE TRIGGER audit_checkpoint_no_update BEFORE UPDATE OR DELETE ON audit_checkpoint
    FOR EACH ROW EXECUTE FUNCTION toolauthz_append_only();
"""

# Each call names the caller its listener proved (toolauthz/store/ledger.py CallOwner). A
# row recorded before has '', which no caller owns: it is proposed again under a new id.
# The serving role's grants on `calls` cover the new column.
_V2_CALL_CALLER = """
ALTER TABLE calls ADD COLUMN caller TEXT NOT NULL DEFAULT '';
"""

# Version 4: several audit chains. The one chain written so far becomes the legacy chain
# "" (its chain_seq is its seq, its records hash as they did), with its head; new records
# go to the chains `records.chain_of` names, each with a head row locked to append; `seq`
# becomes the log's cursor, drawn from a sequence. `chain` and `chain_seq` get no default,
# so a replica still running the code of version 1 fails to append (and denies) rather
# than extend the legacy chain. A checkpoint keeps the heads its root signs.
_V4_CHAINS = """
ALTER TABLE audit_record ADD COLUMN chain TEXT NOT NULL DEFAULT '';
ALTER TABLE audit_record ADD COLUMN chain_seq BIGINT;
ALTER TABLE audit_record DISABLE TRIGGER audit_record_no_update;
UPDATE audit_record SET chain_seq = seq;
ALTER TABLE audit_record ENABLE TRIGGER audit_record_no_update;
ALTER TABLE audit_record ALTER COLUMN chain_seq SET NOT NULL;
ALTER TABLE audit_record ALTER COLUMN chain DROP DEFAULT;
ALTER TABLE audit_record ADD CONSTRAINT audit_record_chain_seq CHECK (chain_seq >= 1);
CREATE UNIQUE INDEX audit_record_chain ON audit_record (chain, chain_seq);
CREATE SEQUENCE audit_record_seq OWNED BY audit_record.seq;
SELECT setval('audit_record_seq', coalesce((SELECT max(seq) FROM audit_record), 0) + 1, false);
ALTER TABLE audit_record ALTER COLUMN seq SET DEFAULT nextval('audit_record_seq');
CREATE TABLE audit_head (
    chain TEXT PRIMARY KEY,
    seq BIGINT NOT NULL CHECK (seq >= 0),
    hash TEXT NOT NULL
);
INSERT INTO audit_head (chain, seq, hash) SELECT '', seq, hash FROM audit_record ORDER BY seq DESC LIMIT 1;
ALTER TABLE audit_checkpoint ADD COLUMN heads TEXT NOT NULL DEFAULT '';
"""

# Retained call inputs for `policy impact` (store/retained.py), and the audit kind
# `bundle` (a reload refused or loaded) in the check of audit_record.kind.
_V5_RETAINED = """
CREATE TABLE retained_inputs (
    tenant TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    decided_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    policy_version TEXT NOT NULL,
    sealed BYTEA NOT NULL,
    PRIMARY KEY (tenant, call_id)
);
CREATE INDEX retained_inputs_by_time ON retained_inputs (decided_at, tenant, call_id);
CREATE INDEX retained_inputs_by_expiry ON retained_inputs (expires_at);
ALTER TABLE audit_record DROP CONSTRAINT IF EXISTS audit_record_kind_check;
ALTER TABLE audit_record ADD CONSTRAINT audit_record_kind_check
    CHECK (kind IN ('authorize', 'verify', 'approval', 'outcome', 'bundle'));
"""

# A foreseen transaction's check (store/postgres/foreseen.py): a prediction that does not
# hold fails the transaction, with its own SQLSTATE, before anything is written.
_V8_EXPECT = """
CREATE OR REPLACE FUNCTION toolauthz_expect(held BOOLEAN, what TEXT) RETURNS BOOLEAN
LANGUAGE plpgsql AS $$
BEGIN
    IF held IS NOT TRUE THEN
        RAISE EXCEPTION 'toolauthz: % changed since this replica last saw it', what USING ERRCODE = 'TZ001';
    END IF;
    RETURN TRUE;
END
$$;
"""

# (version, statements). Append only: a released migration never changes.
MIGRATIONS: tuple[tuple[int, str], ...] = (
    (1, _V1_LEDGER + _V1_AUDIT),
    (2, _V2_CALL_CALLER),
    # Approval notifications: which event went to which sink (store/deliveries.py).
    (3, DELIVERY_SCHEMA),
    (4, _V4_CHAINS),
    (5, _V5_RETAINED),
    # Usage meters: each call's charges (store/usage_rows.py), and the values an
    # approval's call was decided on.
    (6, USAGE_SCHEMA + "ALTER TABLE approvals ADD COLUMN usage_seen TEXT NOT NULL DEFAULT '{}';\n"),
    # The bundle revision floor the fleet shares (store/bundle_floor.py).
    (7, FLOOR_SCHEMA),
    (8, _V8_EXPECT),
)
SCHEMA_VERSION = MIGRATIONS[-1][0]


def event_columns() -> list[str]:
    """Statements that give audit_record a column for every AuditEvent field (and the
    indexes the queries use), idempotent: run by every migration run."""
    statements = []
    for name in EVENT_COLUMNS:
        if name in ("kind", "time"):
            continue
        statements.append(f"ALTER TABLE audit_record ADD COLUMN IF NOT EXISTS {name} TEXT NOT NULL DEFAULT ''")
    for name in JSON_COLUMNS:
        statements.append(f"ALTER TABLE audit_record ALTER COLUMN {name} DROP DEFAULT")
    indexes = [("tenant_time", "tenant, time"), ("time", "time")]
    indexes += [(name, f"{name}, seq") for name in EQUALITY_FILTERS]
    statements += [f"CREATE INDEX IF NOT EXISTS audit_record_{name} ON audit_record ({cols})"
                   for name, cols in indexes]
    return statements


def grant_serving(role: str, schema: str) -> list[str]:
    """What the serving role may do: read and write the ledger and the approvals, and
    only read and append the audit trail (no UPDATE, DELETE or TRUNCATE). `role` and
    `schema` are quoted identifiers."""
    return [
        f"GRANT USAGE ON SCHEMA {schema} TO {role}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {', '.join(LEDGER_TABLES)} TO {role}",
        f"GRANT SELECT ON toolauthz_schema TO {role}",
        f"REVOKE UPDATE, DELETE, TRUNCATE ON {', '.join(AUDIT_TABLES)} FROM {role}",
        f"GRANT SELECT, INSERT ON {', '.join(AUDIT_TABLES)} TO {role}",
        f"GRANT SELECT, INSERT, UPDATE ON {HEAD_TABLE} TO {role}",
        f"GRANT USAGE ON SEQUENCE audit_checkpoint_id_seq, audit_record_seq TO {role}",
        f"GRANT EXECUTE ON FUNCTION {schema}.toolauthz_expect(BOOLEAN, TEXT) TO {role}",
    ]
