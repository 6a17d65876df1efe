"""The SQLite ledger tables: the calls, the consumed tokens and the approvals."""

LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    tenant TEXT NOT NULL,
    call_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    digest TEXT NOT NULL,
    principal TEXT NOT NULL,
    created_at REAL NOT NULL,
    decision TEXT NOT NULL DEFAULT '',
    decision_id TEXT NOT NULL DEFAULT '',
    policy_version TEXT NOT NULL DEFAULT '',
    reasons TEXT NOT NULL DEFAULT '[]',
    errors TEXT NOT NULL DEFAULT '[]',
    approval_id TEXT NOT NULL DEFAULT '',
    verified_jti TEXT NOT NULL DEFAULT '',
    verified_at REAL,
    outcome TEXT NOT NULL DEFAULT '',
    outcome_at REAL,
    extra TEXT NOT NULL DEFAULT '{}',
    caller TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (tenant, call_id)
);
CREATE INDEX IF NOT EXISTS calls_by_run ON calls (tenant, request_id, tool);
CREATE TABLE IF NOT EXISTS consumed_tokens (
    jti TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    call_id TEXT NOT NULL,
    consumed_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS approvals (
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
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    fields TEXT NOT NULL,
    status TEXT NOT NULL,
    decided_at REAL,
    approver TEXT NOT NULL DEFAULT '',
    reason TEXT NOT NULL DEFAULT '',
    token TEXT NOT NULL DEFAULT '',
    token_jti TEXT NOT NULL DEFAULT '',
    token_expires_at REAL,
    call_input BLOB NOT NULL DEFAULT x'',
    call_entities BLOB NOT NULL DEFAULT x'',
    run_calls INTEGER NOT NULL DEFAULT 0,
    run_tool_calls INTEGER NOT NULL DEFAULT 0,
    approved_version TEXT NOT NULL DEFAULT '',
    usage_seen TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS approvals_by_tenant ON approvals (tenant, status, group_name);
"""

# Columns added after the approvals table's first version: a database file created
# before them gets them when it is opened.
ADDED_COLUMNS = {
    "approvals": {"call_input": "BLOB NOT NULL DEFAULT x''", "call_entities": "BLOB NOT NULL DEFAULT x''",
                  "run_calls": "INTEGER NOT NULL DEFAULT 0", "run_tool_calls": "INTEGER NOT NULL DEFAULT 0",
                  "approved_version": "TEXT NOT NULL DEFAULT ''", "usage_seen": "TEXT NOT NULL DEFAULT '{}'"},
    # A call recorded before its caller was has caller '': no caller owns it
    # (toolauthz/store/ledger.py CallOwner), so it is proposed again under a new call id.
    "calls": {"caller": "TEXT NOT NULL DEFAULT ''"},
}
